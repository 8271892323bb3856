// What the gradchecker's diagnoses share (internal to checker/): a failing Jacobian as the analytic A
// against the numeric N, and the helpers that read it.
//
// A (analytic) and N (numeric) are (m, n) row-major: entry (j, k) = ∂y_j/∂x_k, j over y's elements, k over x's.
// The VJP's A has rows J_iᵀe_j, the JVP's A has columns J_i e_k; both are compared with the same N.
#pragma once

#include <cmath>
#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gradcheck.hpp"

namespace tapegrad::gradcheck_detail {

std::vector<int64_t> unravel(const Shape& s, int64_t flat);
int64_t ravel(const Shape& s, const std::vector<int64_t>& idx);
std::string index_str(const Shape& s, int64_t flat);  // "[1, 2]"
// Row `row` of s along its last axis, as "name[1, 2, :]" ("name[:]" for rank 1).
std::string row_name(const Shape& s, const std::string& name, int64_t row);

// The thresholds the checks and the passes share, named for what they measure.
// The exact checks compare two analytic float64 results (the gradient backward added with J_iᵀu, H·t of f + f
// with 2·H·t, the adjoint identity's and the Hessian's symmetry's two sides): they agree to rounding, this part of
// their size, and this much absolutely.
inline constexpr double kExactRelative = 1e-10, kExactAbsolute = 1e-12;
// The floor of a denominator that may be 0 (both sides of a comparison 0): it keeps the ratio finite.
inline constexpr double kNoDivisionByZero = 1e-300;
// Two factors read off a Jacobian are one when they differ by this part of their size (c = 1, c_r = κ·s_r in every
// row, a common factor of every entry).
inline constexpr double kSameFactor = 1e-6;
// A common factor within this of −1 is a sign (A = −N), not a scale.
inline constexpr double kSignSlack = 1e-3;
// An entry of N within this part of N's largest entry (or of 1) is a zero of N: y does not depend on it.
inline constexpr double kZeroOfN = 1e-12;

// |a − ref| ≤ atol + rtol·|ref|: the element test of every comparison (NaN fails).
struct Tolerance {
  double atol, rtol;
  // Both sides finite: an infinite reference would make the bound itself infinite and pass anything.
  bool ok(double a, double ref) const {
    return std::isfinite(a) && std::isfinite(ref) && std::abs(a - ref) <= atol + rtol * std::abs(ref);
  }
};

double dot(std::span<const double> a, std::span<const double> b);

// c as a reader would recognize it: 0.5 = 1/2, 0.353553 = 1/√8, 2.82843 = √8.
std::string describe_factor(double c);

struct JacobianView {
  std::string input, check;  // names for the messages
  const Shape &yshape, &xshape;
  const Tensor &x, &y;
  std::span<const double> a, n;         // (m, n)
  std::span<const double> plus, minus;  // f(x ± εe_k)_j, (m, n); empty in fast mode
  std::span<const double> y0;           // f(x), (m)
  int64_t m, cols;
  Tolerance tol;
  double eps;
  std::string y_name = "y";  // what the rows are: y, or x̄_a for a block of a Hessian (∂x̄_a/∂x_b)
};

// The rule a check tests, for the messages: "VJP", "JVP", or "second-order rule" (check "hvp").
inline const char* rule_name(std::string_view check) {
  return check == "vjp" ? "VJP" : check == "jvp" ? "JVP" : "second-order rule";
}

using Elements = std::vector<std::pair<int64_t, int64_t>>;  // (j, k) pairs

// The least-squares c in A ≈ c·N[map], kept when every element passes against c·N[map].
std::optional<double> common_factor(std::span<const double> a, std::span<const double> n, std::span<const int64_t> map,
                                    Tolerance tol);

// The failing elements as (j, k) pairs.
Elements failing_elements(const JacobianView& v);
std::string element_str(const JacobianView& v, int64_t j, int64_t k);  // "y[0, 1] / x[0, 2]"
std::string examples_str(const JacobianView& v, const Elements& bad);  // the first and how many more

// Every failing element has pred(j, k), and the numeric Jacobian has nonzero entries where pred is false
// (else "all errors in the set" says nothing).
template <class Pred>
bool confined(const JacobianView& v, const Elements& bad, Pred&& pred) {
  for (auto [j, k] : bad)
    if (!pred(j, k)) return false;
  for (int64_t j = 0; j < v.m; ++j)
    for (int64_t k = 0; k < v.cols; ++k)
      if (!pred(j, k) && std::abs(v.n[static_cast<size_t>(j * v.cols + k)]) > v.tol.atol) return true;
  return false;
}

// One-sided differences at (j, k) that differ by more than the error there: x_k sits within ε of a kink.
bool kink_at(const JacobianView& v, int64_t j, int64_t k, double* forward, double* backward);
// The test kink_at makes of one element: the one-sided slopes forward and backward differ by more than `tolerances`
// times the tolerance (what a smooth f's O(ε·f″) gap stays far below), and by about what the analytic a is off from
// the central difference n. A random projection, which draws another direction where it holds, asks one tolerance.
bool kink_explains(double a, double n, double forward, double backward, Tolerance tol, double tolerances = 10);

// A failing VJP's or JVP's full Jacobian as the kinds' passes search it (checker/finding_sheet.hpp; each kind's pass
// is in its file of checker/findings/): the Jacobian, its failing elements, and what the passes before found.
struct JacobianSearch {
  JacobianSearch(const JacobianView& view, const Elements& failing) : v(view), bad(failing) {}
  const JacobianView& v;
  const Elements& bad;
  std::vector<Diagnosis> found;
  bool all_kinks = false;  // every failing element sits at a kink: the failure says nothing about the rule

  // What counts as a zero of N: 1e-12 of its largest entry (or of 1).
  double zero_tol() const;
  // The tightest structured set that holds every failing element (structured_set), found once for the passes that
  // say where the errors lie.
  const std::optional<std::string>& structure();
  // The c of A = c·N at every entry (common_factor), found once for the sign's and the scale's passes.
  const std::optional<double>& whole_factor();
  // Whether every failing element is where N is 0 (y does not depend on x there), or where A is 0 (confined): each
  // found once for the passes that read a mask's edge (masked positions, shifted).
  bool failing_where_n_is_zero();
  bool failing_where_a_is_zero();
  // Whether a pass found a finding of one of these kinds.
  bool found_any(std::initializer_list<Finding> kinds) const;

 private:
  std::optional<std::optional<std::string>> structure_;
  std::optional<std::optional<double>> whole_factor_;
  std::optional<bool> where_n_is_zero_, where_a_is_zero_;
};

// Two equal-size axes p < q of x (on_x) or of y, and the factor c, with A = c·N once they are swapped: the first such
// pair, or none (the transposed input's and output's passes).
struct SwappedAxes {
  int p, q;
  double c;
};
std::optional<SwappedAxes> swapped_axes(const JacobianView& v, bool on_x);
// A pass's finding, where it made one, added to the search; whether it ends the search (it does when ends_search and
// there is a finding).
bool add_found(JacobianSearch& s, std::optional<Diagnosis> d, bool ends_search);
// " (and a factor c)" when c is not 1, for a pattern found up to a factor.
std::string and_a_factor(double c);
// The tightest structured set (a triangle, a band, its edge, indices along one axis) that holds every failing
// element and is at least half failing, described; zero_tol: what counts as a zero of N.
std::optional<std::string> structured_set(const JacobianView& v, const Elements& bad, double zero_tol);
// The findings for the inputs `failing` (indices into x), whose checks by random projections failed: the same check
// in full (check_in_full) on the first rows of the leading axis y (of shape yshape) and the inputs share, or one
// line per input saying how to get a name (diagnose_narrowed.cpp). at_size: the projections' own findings; where
// they found a scale and the cut finds one with another factor, the projections' line says both, and the cut's is
// not returned (one report says one thing of an input).
using CheckInFull = std::function<GradcheckReport(std::span<const Tensor>, const GradcheckOptions&)>;
std::vector<Diagnosis> narrowed_diagnoses(const CheckedPoint& point, const Shape& yshape,
                                          std::span<const size_t> failing, const CheckInFull& check_in_full,
                                          std::span<Diagnosis> at_size = {});
// None of the kinds fits: where the error concentrates (rows of y, rows and columns of x, the largest entries).
Diagnosis unexplained(const JacobianView& v, const Elements& bad);

// Everything the full Jacobians say about a failing VJP or JVP, most telling first. *all_kinks: every failing
// element sits at a kink (the failure says nothing about the rule).
std::vector<Diagnosis> diagnose_jacobian(const JacobianView& v, bool* all_kinks);
// The fast mode keeps only projections: A = c·N over them is all it can tell.
std::optional<Diagnosis> diagnose_values(const std::string& input, const std::string& check, std::span<const double> a,
                                         std::span<const double> n, Tolerance tol);

// How one input came out of the checks; explained: every failure is a kink's or the tolerance's.
struct InputOutcome {
  std::string name;
  bool vjp_ok = true, jvp_ok = true, jvp_skipped = false, adjoint_ok = true;
  bool explained = false;
};
// Which rule (VJP, JVP, both, their adjointness) and which input is at fault, over the whole case; a note when an
// op has no JVP.
std::vector<Diagnosis> which_rule_and_input(std::span<const InputOutcome> outcomes, const std::string& no_jvp_op);

// Second order, on s = ⟨u, f(x)⟩ with the float inputs of x in float64 (i32 inputs ride along):
// H·directions (one per float input) on a fresh tape; empty, with *refused set, when an op has no rule.
std::vector<Tensor> hessian_times(const Function& f, std::span<const Tensor> x, const Tensor& u,
                                  std::span<const Tensor> directions, std::string* refused);
// ∇s at x + c·t (the float inputs moved along t), one gradient per float input.
std::vector<Tensor> gradient_at(const Function& f, std::span<const Tensor> x, std::span<const Tensor> t, double c,
                                const Tensor& u);

// A failing second-order check of s = ⟨u, f(x)⟩ (checker/diagnose_second_order.cpp): the first-order check
// first (a wrong VJP makes every H·t wrong), then the full Hessian in blocks ∂x̄_a/∂x_b, analytic (H·e_k by
// Tape::hvp) against numeric (differences of the gradient): which blocks fail, and each failing block through
// diagnose_jacobian. When the inputs have more than max_elements elements in all, which blocks fail from a few
// evenly spaced columns of each, and no block diagnosed as a whole. point.blocks: for the first-order check.
inline constexpr int64_t kWholeHessianElements = 400;
std::vector<Diagnosis> diagnose_second_order(const CheckedPoint& point, const Tensor& u,
                                             int64_t max_elements = kWholeHessianElements);

}  // namespace tapegrad::gradcheck_detail
