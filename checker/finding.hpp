// A kind of finding: what a diagnosis says the error is (a scale, a per-row term, ...), by its key. The kinds are
// not a closed list written here: each is one file of checker/findings/ that holds its sheet (checker/finding_sheet.hpp:
// its printed name, what it means, where it is found, its pass over a failing Jacobian where it has one), and the
// build lists those files' sheets (builtin_findings(), generated as builtin_ops() is). A kind added there needs no
// change here; the names below are the built-in kinds' handles for programs (Finding::scale), and a test
// (tests/gradcheck_findings_test.cpp) holds that each has a sheet.
#pragma once

#include <string_view>

namespace tapegrad {

class Finding {
 public:
  // The key is the sheet's: lower case, words joined by '_' ("per_row_term"). It must outlive the program (a
  // literal).
  constexpr explicit Finding(std::string_view key) : key_(key) {}
  constexpr std::string_view key() const { return key_; }
  friend constexpr bool operator==(Finding, Finding) = default;

  static const Finding not_finite, zero, nonlinear, sign, scale, transposed_jacobian, transposed_input,
      transposed_output, transposed_term, term_sign, wrong_axis, masked_positions, diagonal, one_row, per_row_term,
      unexplained, radial, kink, tolerance, one_input, jvp_only, vjp_only, adjoint, consistent, overwrites, no_jvp,
      term_dropped, term_added, term_factor, wrong_value, ignores_cotangent, per_row_factor, elementwise, first_order,
      hessian_block, asymmetric, saved_in_forward, precision_defect, not_a_function, rounds_inside, shifted, edge,
      against_the_answer;

 private:
  std::string_view key_;
};

inline constexpr Finding Finding::not_finite{"not_finite"};
inline constexpr Finding Finding::zero{"zero"};
inline constexpr Finding Finding::nonlinear{"nonlinear"};
inline constexpr Finding Finding::sign{"sign"};
inline constexpr Finding Finding::scale{"scale"};
inline constexpr Finding Finding::transposed_jacobian{"transposed_jacobian"};
inline constexpr Finding Finding::transposed_input{"transposed_input"};
inline constexpr Finding Finding::transposed_output{"transposed_output"};
inline constexpr Finding Finding::transposed_term{"transposed_term"};
inline constexpr Finding Finding::term_sign{"term_sign"};
inline constexpr Finding Finding::wrong_axis{"wrong_axis"};
inline constexpr Finding Finding::masked_positions{"masked_positions"};
inline constexpr Finding Finding::diagonal{"diagonal"};
inline constexpr Finding Finding::one_row{"one_row"};
inline constexpr Finding Finding::per_row_term{"per_row_term"};
inline constexpr Finding Finding::unexplained{"unexplained"};
inline constexpr Finding Finding::radial{"radial"};
inline constexpr Finding Finding::kink{"kink"};
inline constexpr Finding Finding::tolerance{"tolerance"};
inline constexpr Finding Finding::one_input{"one_input"};
inline constexpr Finding Finding::jvp_only{"jvp_only"};
inline constexpr Finding Finding::vjp_only{"vjp_only"};
inline constexpr Finding Finding::adjoint{"adjoint"};
inline constexpr Finding Finding::consistent{"consistent"};
inline constexpr Finding Finding::overwrites{"overwrites"};
inline constexpr Finding Finding::no_jvp{"no_jvp"};
inline constexpr Finding Finding::term_dropped{"term_dropped"};
inline constexpr Finding Finding::term_added{"term_added"};
inline constexpr Finding Finding::term_factor{"term_factor"};
inline constexpr Finding Finding::wrong_value{"wrong_value"};
inline constexpr Finding Finding::ignores_cotangent{"ignores_cotangent"};
inline constexpr Finding Finding::per_row_factor{"per_row_factor"};
inline constexpr Finding Finding::elementwise{"elementwise"};
inline constexpr Finding Finding::first_order{"first_order"};
inline constexpr Finding Finding::hessian_block{"hessian_block"};
inline constexpr Finding Finding::asymmetric{"asymmetric"};
inline constexpr Finding Finding::saved_in_forward{"saved_in_forward"};
inline constexpr Finding Finding::precision_defect{"precision_defect"};
inline constexpr Finding Finding::not_a_function{"not_a_function"};
inline constexpr Finding Finding::rounds_inside{"rounds_inside"};
inline constexpr Finding Finding::shifted{"shifted"};
inline constexpr Finding Finding::edge{"edge"};
inline constexpr Finding Finding::against_the_answer{"against_the_answer"};

}  // namespace tapegrad
