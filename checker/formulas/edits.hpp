// Diagnosis by editing the rule. Some slips sit inside a rule, where the Jacobian-level kinds
// (the passes of checker/findings/) cannot see them: attention's dK = dS·Q/√d for dSᵀ·Q/√d transposes an (n, n)
// value of the backward, which is no axis of K or of the output. When the rule is written as formulas (a claim, or
// a PyTorch op's backward traced into formulas by python/tapegrad/_trace.py), the checker can try edits one at a
// time and name the one after which the rule agrees with central differences of the forward:
//
//   transpose   transpose(e) put around a square value e (its last two axes of equal size, ≥ 2) in a let or an x̄
//               formula, or taken from one (transpose(e) → e)                  → Finding::transposed_term
//   sign        a + b ↔ a − b, or −u → u                                       → Finding::term_sign
//   axis        the axis of sum(e, a) or mean(e, a) → another axis of e of the same size, the axis of
//               unsqueeze(e, a) → another place: a reduction or broadcast along the wrong axis → Finding::wrong_axis
//   derivative  in a line of the backward, the value of an element-wise call (sigmoid, tanh, log) → its derivative,
//               or a part of the call's shape → that part times the derivative: f′ written f, or left out
//               (checker/formulas/derivative_edits.hpp)                        → Finding::term_factor
// Where edits of several kinds put the rule right, the report names an axis, then a derivative, then a transpose.
//
// An edit is named only when every x̄ the formulas give then agrees, for one cotangent ȳ drawn from opt.seed, with
// the central differences (⟨ȳ, f(x + εe_k)⟩ − ⟨ȳ, f(x − εe_k)⟩)/2ε to the report's tolerance.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "claim.hpp"

namespace tapegrad {

// A VJP as formulas at one point: the lets in order, then x̄ of each input. They read the inputs by their names,
// y, g (the cotangent ȳ), earlier lets and the named constants.
struct VjpFormulas {
  std::vector<ClaimText::Line> lets;                // name, formula, label (where it was written)
  std::vector<std::optional<ClaimText::Line>> vjp;  // one per input (name: the input); absent: no formula
  std::map<std::string, Tensor> constants;          // float64 values the formulas read besides x, y and g
  std::optional<ClaimText::Line> forward{};         // the forward as a formula, where it is one (a claim's)
};
// The rule's formulas at x for the cotangent g, or nothing when they cannot be had (then no edit is tried).
using VjpFormulasAt = std::function<std::optional<VjpFormulas>(std::span<const Tensor> x, const Tensor& g)>;

// Inputs whose elements the search differentiates at most (central differences: two evaluations of f each).
inline constexpr int64_t kEditSearchElements = 4096;

// For a report in which no kind of the Jacobian explains an input's failing VJP (a diagnosis of no known kind), or
// explains it only as a per-row term of vectors it cannot name (Diagnosis::unnamed; a sign flipped on a row term is
// one, at some shapes and not others):
// tries the edits, and replaces that diagnosis with the first edit that puts the rule right for every input. The
// edits come last: a rule can be put right by an edit that is not the slip (a mask transposed can zero a wrong
// term), so a structure the Jacobian shows is the better name. Does nothing when the formulas, unedited,
// differ from f's own VJP at x (they are not the rule that was checked), when they already agree with the
// differences (the failure lies elsewhere), or when the inputs hold more than kEditSearchElements elements. With
// at.blocks, the differences along each e_k come from RuleBlocks::unit_steps (one call per input).
void diagnose_by_edits(GradcheckReport& report, const CheckedPoint& at, const VjpFormulasAt& formulas);

}  // namespace tapegrad
