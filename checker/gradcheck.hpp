// The gradchecker: in float64, for every differentiable input x_i of y = f(x),
//   vjp        J_iᵀu from backward   vs  central differences (f(x+εe_k) − f(x−εe_k)) / 2ε
//              full Jacobian when m·n_i is small (each unit ȳ = e_j, then one random ȳ against Nᵀȳ: a backward
//              that ignores or squares ȳ passes every unit one); else random projections vᵀJ_iu as PyTorch's fast mode
//              (the u shared by several inputs: one backward per u; a v whose step crosses a kink is drawn again)
//   jvp        J_i t from forward mode vs  (f(x+εt) − f(x−εt)) / 2ε, element by element of y
//   adjoint    ⟨J_i t, u⟩ = ⟨t, J_iᵀu⟩  (two analytic results; exact up to rounding)
//   accumulate backward adds J_iᵀu into a gradient that already holds r (it must not overwrite r)
// An element passes when |analytic − numeric| ≤ atol + rtol·|numeric|, both sides finite. A report passes only
// when something was compared (a check of an input with no elements, or a report whose every check was skipped,
// is not a pass) and every check passed.
//
// When a check fails, the report also says what the error looks like (a Diagnosis per finding): the analytic
// Jacobian A against the numeric N as a whole (A = c·N: a scale or a sign; A = N with axes swapped: a
// transpose), where the failing elements sit (one input; masked positions N = 0 or A = 0, or any structured set:
// a triangle, a band, a set of rows; the diagonal; one row; a rank-one error per row along any axis: a per-row
// term), and which rule is at fault (VJP or JVP alone, the adjoint identity, linearity in the cotangent or tangent,
// the direction ẋ = x, one-sided differences at a kink). When no kind fits, it says where the error concentrates.
// Each kind of finding is one file of checker/findings/ (its sheet, and its pass over a failing Jacobian where it has
// one); checker/diagnose.cpp runs the passes; docs/gradchecking.md shows each kind.
#pragma once

#include <initializer_list>
#include <iosfwd>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../ops/registry.hpp"
#include "claimed.hpp"
#include "finding.hpp"

namespace tapegrad {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
  int64_t full_jacobian_limit = 40000;  // m·n_i at most this: full Jacobian; above: projections
  int projections = 4;
  uint64_t seed = 20240809;
  bool diagnose = true;  // on a failure, look for what the error looks like (costs a few more evaluations)
  // The relative error the rules under check carry from rounding: 0 for float64 rules, whose exact checks (adjoint
  // identity, linearity) hold to 1e-10 and 1e-8 of their sizes; a check of rules run at a lower precision
  // (precision.hpp) sets its measured rounding, and those checks allow that much more. Nonzero, the `tolerance`
  // finding (finite differences at their limit) is not made: the tolerance is then the rounding's.
  double rounding = 0;
};
// Refuses options that cannot make a check (an Error naming the option and its value): eps finite and > 0, atol,
// rtol and rounding finite and ≥ 0, projections ≥ 1, full_jacobian_limit ≥ 0. gradcheck() and gradcheck_second_order() call it.
void validate(const GradcheckOptions& opt);

struct CheckResult {
  std::string input;  // the input's name
  std::string check;  // vjp, jvp, adjoint, accumulate
  std::string mode;   // full, fast (projections), exact; none when skipped
  double max_abs_err = 0;
  double max_rel_err = 0;
  std::string worst;                 // where the worst element is: y[j] / x[k] index, or the projection
  double analytic = 0, numeric = 0;  // at the worst element
  bool passed = true;
  bool skipped = false;  // not run: the op has no JVP (jvp and adjoint)
  int64_t compared = 0;  // how many values were compared (elements, projections); a check that compared none fails
  // What `analytic` and `numeric` are, as a failing row prints them: the rule against central differences, or for a
  // check of two analytic results, what each side is (adjoint: ⟨J t, u⟩ and ⟨t, Jᵀu⟩).
  std::string analytic_is = "analytic", numeric_is = "numeric";
};

// What a failure looks like: a kind of finding (checker/finding.hpp), each of which names one pattern of the error;
// its sheet (checker/findings/KEY.cpp) says what it means and where it is found, and docs/gradchecking.md shows each.
std::string_view finding_name(Finding f);  // as the report prints it: "per-row term"
std::string_view finding_key(Finding f);   // the key, for programs: "per_row_term"
std::span<const Finding> all_findings();   // every built-in kind, in the order of their files' names

struct Diagnosis {
  Finding kind;
  std::string input;    // the input it concerns; empty for the whole case
  std::string check;    // vjp, jvp, adjoint, accumulate; empty for the whole case
  std::string message;  // one line, with the numbers that back it
  // Says where the error lies and names nothing of the rule: a per-row term whose vectors are none the checker
  // knows (α_r·u_r·v_rᵀ). When the rule is written as formulas, an edit that puts it right takes its place
  // (checker/formulas/edits.hpp).
  bool unnamed = false;
  // The constant c of A = c·N where the finding is one (a scale), so that a program need not read it from the message.
  std::optional<double> factor = std::nullopt;
  // Where an edit of the rule's formulas named the slip, the part of the message that shows the rule put right
  // (": FORMULA → EDITED"); an exercise's hint, which must not give the answer, leaves it out.
  std::string fix{};
  std::string str() const;  // "[kind] input, check: message"
};
// The first diagnosis of that kind (for that input, when one is named) among these, or nullptr.
const Diagnosis* find_diagnosis(std::span<const Diagnosis> diagnoses, Finding f, std::string_view input = "");

// Whether every check passed. Converts to bool, and is callable (report.passed()). Streamed, it prints the whole
// report with its diagnosis, which is what a test framework shows for a failed CHECK(report.passed).
struct Verdict {
  bool ok = true;
  std::string report;
  std::string not_checked;  // non-empty when nothing was compared (every check skipped): why; ok is then false
  operator bool() const { return ok; }
  bool operator()() const { return ok; }
};
std::ostream& operator<<(std::ostream& os, const Verdict& v);

struct GradcheckReport {
  std::string op, case_name;
  std::vector<CheckResult> checks;
  std::vector<Diagnosis> diagnoses;
  // Lines under the title: what ran beside the checks and how (the edge probes, checker/edges.hpp).
  std::vector<std::string> notes;
  Verdict passed;

  // Recomputes `passed` from the checks (gradcheck() calls it; call it after editing checks or diagnoses).
  void conclude();
  bool has(Finding f, std::string_view input = "") const;  // a diagnosis of that kind (for that input)
  const Diagnosis* find(Finding f, std::string_view input = "") const;
  // The title ("op / case: FAILED"), a table of one row per check, then the diagnosis; diagnosis_first: the
  // diagnosis before the table, as a failing test prints it (checker/testing.hpp).
  enum class Order { table_first, diagnosis_first };
  std::string str(Order order = Order::table_first) const;
};
std::ostream& operator<<(std::ostream& os, const GradcheckReport& r);

class RuleBlocks;
// An op at the point a check runs it: f, its float64 inputs and their names, the options, and the blocks its rules
// come in where they do (below). The diagnoses made after the first check (narrowed, by edits, of the second order)
// read it as one value.
struct CheckedPoint {
  const Function& f;
  std::span<const Tensor> x;
  std::span<const std::string> names;
  const GradcheckOptions& opt;
  RuleBlocks* blocks = nullptr;
};
// Checks f at the given float64 inputs; names label the inputs in the report (x0, x1, ... if absent). With blocks
// (below), the full Jacobians' rows and unit differences are taken from them (null: one point at a time).
GradcheckReport gradcheck(const Function& f, std::span<const Tensor> inputs, std::span<const std::string> names = {},
                          const GradcheckOptions& opt = {}, RuleBlocks* blocks = nullptr);

// An op's rules at many points in one call, for an op each of whose calls crosses a boundary that costs more than
// the op itself (a Python op: python/python_function.hpp). A block holds, value for value, what the calls of f one
// point at a time give; the same block may be asked for twice (the edit search, checker/formulas/edits.hpp, takes the
// checker's differences), and may then be given from what was kept.
class RuleBlocks {
 public:
  virtual ~RuleBlocks() = default;
  // rows[j][i] = J_iᵀ e_j for every unit cotangent e_j of y (of yshape), zeros where the VJP gives none, for each
  // input i that wanted[i] asks for (the rows of the Jacobians checked in full); undefined for the others, whose rows
  // (m of an input's size each) are not kept.
  virtual std::vector<std::vector<Tensor>> vjp_rows(std::span<const Tensor> x, const Shape& yshape,
                                                    const std::vector<bool>& wanted) = 0;
  // Of the inputs whose Jacobians fit the default limit (wanted), those the blocks check in full at a cost in
  // proportion to the rest of the check; the others are checked by projections, as an input above the limit is (a
  // Python backward called once per element of a large y, for a bias beside it, or a Python loss run twice per
  // element of a large weight costs hundreds of times torch's check). Not asked under any other limit: that asks
  // for full Jacobians.
  virtual std::vector<bool> full_worth_its_cost(std::span<const Tensor> /*x*/, const Shape& /*yshape*/,
                                                const std::vector<bool>& wanted) {
    return wanted;
  }
  // f at x with x_i[k] moved by +ε (plus) and by −ε (minus), for every k: row k of each holds y's m elements. The
  // point is x + ε·e_k as the checker forms it, elementwise: x_i + (±ε)·e_k.
  virtual void unit_steps(std::span<const Tensor> x, size_t i, double eps, const Shape& yshape, std::span<double> plus,
                          std::span<double> minus) = 0;
};
GradcheckReport gradcheck(const Function& f, std::initializer_list<Tensor> inputs,
                          std::initializer_list<std::string> names = {}, const GradcheckOptions& opt = {});
// Checks a registered case, with its inputs drawn from opt.seed.
GradcheckReport gradcheck(const GradcheckCase& c, const GradcheckOptions& opt = {}, std::string_view op = "");
// What a check of a registered case runs on: its inputs in float64 drawn from opt.seed, their names, and opt with
// the case's own tolerances.
struct CaseInputs {
  std::vector<Tensor> values;
  std::vector<std::string> names;
  GradcheckOptions options;
};
CaseInputs case_inputs(const GradcheckCase& c, const GradcheckOptions& opt);
// The name a report gives input i: its name where given, else "x<i>".
std::string input_name(std::span<const std::string> names, size_t i);
// A report's title: "op / case", or whichever of the two is given, or "gradcheck".
std::string report_title(std::string_view op, std::string_view case_name);
// A check of a function (gradcheck, gradcheck_second_order) run on a registered case (case_inputs); the report
// named by op and case.
using FunctionCheck = GradcheckReport (*)(const Function&, std::span<const Tensor>, std::span<const std::string>,
                                          const GradcheckOptions&);
GradcheckReport check_case(FunctionCheck check, const GradcheckCase& c, const GradcheckOptions& opt,
                           std::string_view op);
// Checks every case of a registered op.
std::vector<GradcheckReport> gradcheck(const OpSheet& op, const GradcheckOptions& opt = {});

}  // namespace tapegrad
