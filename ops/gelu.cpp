// The gelu (tanh form) and gelu_erf (exact) nodes, and the GELU kernels of ops/gelu.hpp under them, float32 and
// float64, compiled here once with the library's flags (-O3, and x86-64-v3 without FMA contraction where it is
// built for it) and their AVX-512 copies beside them: these nodes, the fused MLP, tests and any program linking
// tapegrad all run this code, and the check for the AVX-512 copy is made here, once, with the flags the kernels
// were compiled with. The node keeps 1 − |tanh u| or Φ(x) instead of y, so that the derivative needs no second
// tanh or erfc (ops/gelu.hpp derives both forms).
#include <span>
#include <vector>

// The kernels' FloatPacks (ops/float_pack.hpp) are inlined everywhere: GCC's note that a 64-byte vector returned by
// value changes the ABI without AVX-512, which it gives at the end of this file for the kernels instantiated here,
// concerns no call that is made.
#pragma GCC diagnostic ignored "-Wpsabi"

#include "ops/common.hpp"
#include "ops/gelu.hpp"
#include "ops/ops.hpp"
#include "ops/products/blas_info.hpp"
#include "ops/sheet.hpp"

namespace tapegrad {

bool gelu_runs_avx512() {
#if TAPEGRAD_GELU_HAS_AVX512
  static const bool yes = cpu_features().avx512();
  return yes;
#else
  return false;
#endif
}

TAPEGRAD_GELU_KERNELS(template, float)
TAPEGRAD_GELU_KERNELS(template, double)

namespace {

// The node keeps x and s (c = 1 − |tanh u|, or Φ(x)): the VJP x̄ += f′(x)·ȳ and the JVP ẏ = f′(x)·ẋ read s instead
// of evaluating tanh or erfc again.
Var gelu_node(const char* op, GeluForm form, Var x) {
  expect_float(op, x);
  Tape& tape = x.tape();
  const Tensor xv = x.value();
  Tensor y = tape.empty(x.dtype(), x.shape());
  Tensor s =
      tape.empty(x.dtype(), x.shape(), form == GeluForm::exact ? "Φ(x) of gelu_erf" : "1 − |tanh| of gelu's argument");
  const int64_t n = y.numel();
  dispatch_float(op, x.dtype(), [&]<class T>(T) { gelu_forward(form, y.data<T>(), s.data<T>(), xv.data<T>(), n); });
  auto apply_derivative = [op, form, xv, s, n](Tensor& out, const Tensor& in) {
    dispatch_float(op, out.dtype(), [&]<class T>(T) {
      gelu_derivative(form, out.data<T>(), xv.data<T>(), s.data<T>(), in.data<T>(), n);
    });
  };
  return tape.record(
      op, {x}, y, [=](const Tensor& g, std::span<Tensor> gin) { apply_derivative(gin[0], g); },
      [=](std::span<const Tensor> tin, Tensor& ty) { apply_derivative(ty, tin[0]); },
      [=](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
        if (!tin[0].defined() || !gin_dot[0].defined()) return;
        dispatch_float(op, g.dtype(), [&]<class T>(T) {
          gelu_curvature(form, gin_dot[0].data<T>(), xv.data<T>(), s.data<T>(), tin[0].data<T>(), g.data<T>(), n);
        });
      });
}

}  // namespace

Var gelu(Var x) { return gelu_node("gelu", GeluForm::tanh, x); }
Var gelu_erf(Var x) { return gelu_node("gelu_erf", GeluForm::exact, x); }

// Their sheets: f′ as the VJP and JVP, f″ as the second-order rule ẋ̄ += f″(x)·ẋ·ȳ (docs/derivations.md §6.3).
std::vector<OpSheet> gelu_ops() {
  auto matrix = [](Var (*fn)(Var)) {
    return std::vector<GradcheckCase>{
        {"matrix", {{"x", {4, 5}}}, [fn](Tape&, std::span<const Var> x) { return fn(x[0]); }}};
  };
  auto by_name = [](Var (*fn)(Var)) {
    return OpCall([fn](std::span<const Var> x, const OpArgs&) { return fn(x[0]); });
  };
  const char* f = "gelu";
  const char* d = "6.3";
  return {
      {.name = "gelu",
       .family = f,
       .forward = "y = ½x(1 + tanh(√(2/π)(x + 0.044715x³)))",
       .vjp = "x̄ += gelu′(x)·ȳ with gelu′ of the tanh form",
       .jvp = "ẏ = gelu′(x)·ẋ",
       .second_order = "ẋ̄ += gelu″(x)·ẋ·ȳ, gelu″ = (1 − t²)(u′ − x·t·u′² + ½x·u″), t = tanh u, "
                       "u = √(2/π)(x + 0.044715x³)",
       .second_order_derivation = d,
       .cases = matrix(gelu),
       .inputs = 1,
       .call = by_name(gelu)},
      {.name = "gelu_erf",
       .family = f,
       .forward = "y = x·Φ(x) = ½x(1 + erf(x/√2))",
       .vjp = "x̄ += (Φ(x) + x·φ(x))·ȳ",
       .jvp = "ẏ = (Φ(x) + x·φ(x))·ẋ",
       .second_order = "ẋ̄ += (2 − x²)·φ(x)·ẋ·ȳ",
       .second_order_derivation = d,
       .cases = matrix(gelu_erf),
       .inputs = 1,
       .call = by_name(gelu_erf)},
  };
}

}  // namespace tapegrad
