// The check of a node at the precision it runs: its VJP (and JVP) in float32 tensors, with float32 or bf16
// products, against the same node in float64 — with a verdict from a measured model of the rounding, not a
// tolerance.
//
// For a case with float64 inputs x (its float64 check, gradcheck(), must pass first: it makes the reference):
//   x₃₂        x rounded to float32; the reference reads exactly these values, upcast (x̃ = float64(x₃₂))
//   ȳ, ẋ_i     one random cotangent and one random tangent per input, rounded to float32 as well
//   at p       x̄ = VJP(ȳ) and ẏ_i = JVP(ẋ_i) of the node run on x₃₂ in float32 tensors, every float32 product in
//              precision p (f32: float32 products; bf16: each product rounds its operands to bfloat16 and
//              accumulates in float32, whatever its size: Bf16Reach::every_product, ops/products/products.hpp)
//   reference  the same rules of the float64 node on x̃, ȳ, ẋ_i
//   error      max |x̄_p − x̄_float64| over x̄'s elements (ẏ for the JVP), per input and rule
// What rounding explains: how far the reference itself moves when what the run rounds is rounded. It is measured,
// kRoundingSeeds times: the float64 rules again with every input, ȳ and ẋ_i element, and every value, gradient and
// tangent the tape computes, moved by float32's unit roundoff (x·(1 ± 2⁻²⁴), the sign a hash of the value and the
// seed), every operand of every float64 product moved by p's (2⁻²⁴ for f32, 2⁻⁸ for bf16) and its result by
// float32's (EmulatedRounding, ops/products/products.hpp). The bound is
//   B = kBoundMultiple × the largest deviation max |x̄_moved − x̄_float64| over the seeds,
// and a row passes when error ≤ B ("vjp x at bf16: max error 3.1e-03; rounding at bf16 explains up to 6.2e-03
// here"). A right node's float32 code deviates by a few roundings of the same values as the moved reference does, so
// B holds it with room; a slip (a wrong factor, sign, transpose, term) is off by the size of x̄. What the model does
// not see is inside a fused node: its internal sums and the last ulp of a fast exp are rounded in float32 and not
// moved here (docs/gradchecking.md says how near B they come).
//
// When a row fails, the report says why, in the checker's kinds:
//   precision  (bf16 only) the same row at f32 passes its own bound and the bf16 error is at most
//              kDefectRoundoffs·2⁻⁸ of max |x̄|: the float32 code computes the right rule, and loses more than the
//              model explains to bf16's rounding (a value sent through a product where float64 adds it up): "the
//              error shrinks with the precision (bf16 → f32: e₁ → e₂); not a slip"
//   a slip     anything else: the rules at p, as a claimed derivative of the float64 forward (claimed(),
//              registry.hpp), go through gradcheck() against its finite differences with the measured bound as the
//              tolerance (atol = the largest B of the case, rtol = 0; the adjoint and linearity checks allow the
//              same relative rounding, GradcheckOptions::rounding), which names the slip as it would in float64:
//              scale, sign, transposed, per-row term, one input, VJP only, ...
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../ops/products/products.hpp"
#include "claimed.hpp"
#include "gradcheck.hpp"

namespace tapegrad {

// The model's constants (no tolerance to tune): seeds of the moved reference, B's multiple of its largest
// deviation, and the largest bf16 error, in units of 2⁻⁸·max |x̄|, still read as a rounding defect.
inline constexpr int kRoundingSeeds = 8;
inline constexpr double kBoundMultiple = 2;
inline constexpr double kDefectRoundoffs = 16;

// One rule of one input at the working precision.
struct PrecisionRow {
  std::string input;     // the input's name
  std::string check;     // vjp or jvp
  double max_err = 0;    // max |x̄_p − x̄_float64| (ẏ for the JVP)
  double bound = 0;      // B: what rounding at p explains here
  double scale = 0;      // max |x̄_float64|: what the error is measured against
  bool skipped = false;  // jvp of an op without one
  bool passed = true;
  // "vjp x at bf16: max error 3.1e-03; rounding at bf16 explains up to 6.2e-03 here" (a failing row adds "; not
  // this error"; a skipped one says so).
  std::string line(ProductPrecision p) const;
};

struct PrecisionReport {
  std::string op, case_name;
  ProductPrecision precision = ProductPrecision::f32;
  GradcheckReport float64;           // the float64 check, which must pass for the reference to stand
  std::vector<PrecisionRow> rows;    // per input: vjp, then jvp
  std::vector<Diagnosis> diagnoses;  // on a failure: the slip, or a rounding defect (Finding::precision_defect)
  bool passed = false;
  bool has(Finding f, std::string_view input = "") const { return find(f, input) != nullptr; }
  const Diagnosis* find(Finding f, std::string_view input = "") const { return find_diagnosis(diagnoses, f, input); }
  std::string str() const;  // "op / case at bf16: passed", the rows' lines, the diagnosis
};
std::ostream& operator<<(std::ostream& os, const PrecisionReport& r);

// "bf16 products, float32 tensors, against float64": what a check at p runs and compares.
std::string precision_header(ProductPrecision p);

// Checks f's rules at precision p against float64 at the float64 inputs given (rounded to float32 first). Throws
// tapegrad::Error where p is bf16 and this CPU or build cannot run bf16 products (bf16_unavailable_reason()).
// opt serves the float64 check and the diagnosis; its seed draws ȳ and the tangents.
PrecisionReport gradcheck_at_precision(const Function& f, std::span<const Tensor> inputs,
                                       std::span<const std::string> names, ProductPrecision p,
                                       const GradcheckOptions& opt = {});
// A registered case, its inputs drawn from opt.seed as gradcheck() draws them.
PrecisionReport gradcheck_at_precision(const GradcheckCase& c, ProductPrecision p, const GradcheckOptions& opt = {},
                                       std::string_view op = "");

}  // namespace tapegrad
