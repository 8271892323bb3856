// Element-wise functions y = f(x):  VJP x̄ += f′(x)·ȳ,  JVP ẏ = f′(x)·ẋ  (ops/pointwise.hpp records them); second
// order (Tape::hvp) ẋ̄ += f″(x)·ẋ·ȳ. Each f′ and f″ is written with whatever of x and y makes it cheapest; the node
// keeps those two tensors.
//   exp      f′ = y                                     f″ = y
//   log      f′ = 1/x                (x > 0)            f″ = −1/x²
//   tanh     f′ = 1 − y²                                f″ = −2y(1 − y²)
//   relu     f′ = [x > 0]            (0 at the kink)    f″ = 0
//   elu      y = x (x > 0), α(eˣ − 1) (x ≤ 0);  f′ = 1 (x > 0), y + α (x ≤ 0);  f″ = 0 (x > 0), y + α (x ≤ 0)
//   sigmoid  y = 1/(1 + e⁻ˣ);  f′ = y(1 − y)           f″ = y(1 − y)(1 − 2y)     (y from e^(−|x|), which cannot
//                                                                                overflow)
//   square   f′ = 2x                                    f″ = 2
//   sqrt     f′ = 1/(2y)             (x ≥ 0; +∞ at 0)   f″ = −1/(4y³)
//   abs      f′ = sign x             (0 at the kink x = 0: the central value of [−1, 1], as PyTorch and JAX take
//                                     it, and what central differences give)          f″ = 0 (not defined at 0)
//   pow      y = xᵖ;  f′ = p·xᵖ⁻¹    (0 for p = 0)      f″ = p(p − 1)·xᵖ⁻² (0 for p = 0 and p = 1)
// sqrt and pow refuse inputs where y would be NaN or infinite (x < 0; x < 0 with p not an integer; x = 0 with
// p < 0) instead of returning it.
// gelu (tanh form) and gelu_erf (exact) have their own node below: it keeps tanh u or Φ(x) instead of y, so that
// the derivative needs no second tanh or erfc.
#include <cmath>
#include <string_view>

#include "engine/gradcheck/registry.hpp"
#include "ops/common.hpp"
#include "ops/gelu.hpp"
#include "ops/ops.hpp"
#include "ops/pointwise.hpp"

namespace tapegrad {

namespace {

// Throws naming `op` at the first element of x where `ok` is false: its index, its value and what was expected.
template <class Ok>
void expect_each(const char* op, const Var& x, Ok ok, std::string_view expected) {
  expect_float(op, x);
  const Tensor xv = x.value();
  dispatch_float(op, x.dtype(), [&]<class T>(T) {
    const T* px = xv.data<T>();
    for (int64_t i = 0, n = xv.numel(); i < n; ++i)
      if (!ok(px[i])) fail("{}: element {} of x {} is {}: expected {}", op, i, x.shape(), px[i], expected);
  });
}

}  // namespace

// gelu and gelu_erf keep x and s (t = tanh u, or Φ(x); ops/gelu.hpp has both derivations): the VJP x̄ += f′(x)·ȳ
// and the JVP ẏ = f′(x)·ẋ read s instead of evaluating tanh or erfc again.
static Var gelu_node(const char* op, GeluForm form, Var x) {
  expect_float(op, x);
  Tape& tape = x.tape();
  const Tensor xv = x.value();
  Tensor y = tape.empty(x.dtype(), x.shape());
  Tensor s = tape.empty(x.dtype(), x.shape(), form == GeluForm::exact ? "Φ(x) of gelu_erf" : "tanh of gelu's argument");
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

Var gelu(Var x) { return gelu_node("gelu", GeluForm::tanh, x); }
Var gelu_erf(Var x) { return gelu_node("gelu_erf", GeluForm::exact, x); }

Var exp(Var x) {
  return pointwise("exp", x, [](auto v) { return std::exp(v); }, [](auto, auto y) { return y; },
                   [](auto, auto y) { return y; });
}
Var log(Var x) {
  return pointwise("log", x, [](auto v) { return std::log(v); }, [](auto v, auto) { return 1 / v; },
                   [](auto v) { return -1 / (v * v); });
}
Var tanh(Var x) {
  return pointwise("tanh", x, [](auto v) { return std::tanh(v); }, [](auto, auto y) { return 1 - y * y; },
                   [](auto, auto y) { return -2 * y * (1 - y * y); });
}
Var relu(Var x) {
  return pointwise(
      "relu", x, [](auto v) { return v > 0 ? v : decltype(v)(0); },
      [](auto v, auto) { return v > 0 ? decltype(v)(1) : decltype(v)(0); }, [](auto v) { return decltype(v)(0); });
}
Var elu(Var x, double alpha) {
  return pointwise(
      "elu", x, [alpha](auto v) { return v > 0 ? v : decltype(v)(alpha) * std::expm1(v); },
      [alpha](auto v, auto y) { return v > 0 ? decltype(v)(1) : y + decltype(v)(alpha); },
      [alpha](auto v, auto y) { return v > 0 ? decltype(v)(0) : y + decltype(v)(alpha); });
}

Var sigmoid(Var x) {
  auto f = [](auto v) {
    const auto e = std::exp(-std::abs(v));  // e^(−|x|) ∈ (0, 1]
    return v >= 0 ? 1 / (1 + e) : e / (1 + e);
  };
  return pointwise("sigmoid", x, f, [](auto, auto y) { return y * (1 - y); },
                   [](auto, auto y) { return y * (1 - y) * (1 - 2 * y); });
}
Var square(Var x) {
  return pointwise("square", x, [](auto v) { return v * v; }, [](auto v) { return 2 * v; },
                   [](auto v) { return decltype(v)(2); });
}
Var sqrt(Var x) {
  expect_each("sqrt", x, [](auto v) { return v >= 0; }, "x ≥ 0");
  return pointwise("sqrt", x, [](auto v) { return std::sqrt(v); }, [](auto, auto y) { return 1 / (2 * y); },
                   [](auto, auto y) { return -1 / (4 * y * y * y); });
}
Var abs(Var x) {
  return pointwise(
      "abs", x, [](auto v) { return std::abs(v); },
      [](auto v) { return v > 0 ? decltype(v)(1) : v < 0 ? decltype(v)(-1) : decltype(v)(0); },
      [](auto v) { return decltype(v)(0); });
}
Var pow(Var x, double p) {
  const bool integer = p == std::round(p);
  if (!integer) expect_each("pow", x, [](auto v) { return v >= 0; }, fmt::format("x ≥ 0 for the exponent p = {} (not an integer)", p).c_str());
  if (p < 0) expect_each("pow", x, [](auto v) { return v != 0; }, fmt::format("x ≠ 0 for the exponent p = {} < 0", p).c_str());
  return pointwise(
      "pow", x, [p](auto v) { return std::pow(v, decltype(v)(p)); },
      [p](auto v) { return p == 0 ? decltype(v)(0) : decltype(v)(p) * std::pow(v, decltype(v)(p - 1)); },
      [p](auto v) {
        return p == 0 || p == 1 ? decltype(v)(0) : decltype(v)(p * (p - 1)) * std::pow(v, decltype(v)(p - 2));
      });
}

void register_pointwise(Registry& r) {
  // second: the second-order rule, ẋ̄ += f″(x)·ẋ·ȳ with the op's f″
  auto unary = [&r](const char* name, const char* forward, const char* equation, const char* second, Fill fill,
                    Var (*fn)(Var)) {
    r.add({.name = name, .family = "pointwise", .equation = equation, .forward = forward, .second_order = second,
           .second_order_derivation = "6.3"});
    r.add_case(name, {"matrix", {{"x", {4, 5}, fill}}, [fn](Tape&, std::span<const Var> x) { return fn(x[0]); }});
  };
  unary("exp", "y = exp x", "x̄ += y·ȳ; ẏ = y·ẋ", "ẋ̄ += y·ẋ·ȳ", Fill::normal, exp);
  unary("log", "y = log x", "x̄ += ȳ/x; ẏ = ẋ/x", "ẋ̄ −= ẋ·ȳ/x²", Fill::positive, log);
  unary("tanh", "y = tanh x", "x̄ += (1 − y²)·ȳ; ẏ = (1 − y²)·ẋ", "ẋ̄ −= 2y(1 − y²)·ẋ·ȳ", Fill::normal, tanh);
  unary("relu", "y = max(x, 0)", "x̄ += [x > 0]·ȳ; ẏ = [x > 0]·ẋ", "0 away from x = 0 (f″ = 0)", Fill::away_from_zero, relu);
  unary("gelu", "y = ½x(1 + tanh(√(2/π)(x + 0.044715x³)))",
        "x̄ += gelu′(x)·ȳ with gelu′ of the tanh form; ẏ = gelu′(x)·ẋ",
        "ẋ̄ += gelu″(x)·ẋ·ȳ, gelu″ = (1 − t²)(u′ − x·t·u′² + ½x·u″), t = tanh u, u = √(2/π)(x + 0.044715x³)", Fill::normal, gelu);
  unary("gelu_erf", "y = x·Φ(x) = ½x(1 + erf(x/√2))", "x̄ += (Φ(x) + x·φ(x))·ȳ; ẏ = (Φ(x) + x·φ(x))·ẋ",
        "ẋ̄ += (2 − x²)·φ(x)·ẋ·ȳ",
        Fill::normal, gelu_erf);
  unary("sigmoid", "y = 1/(1 + e⁻ˣ)", "x̄ += y(1 − y)·ȳ; ẏ = y(1 − y)·ẋ", "ẋ̄ += y(1 − y)(1 − 2y)·ẋ·ȳ", Fill::normal, sigmoid);
  unary("square", "y = x²", "x̄ += 2x·ȳ; ẏ = 2x·ẋ", "ẋ̄ += 2ẋ·ȳ", Fill::normal, square);
  unary("sqrt", "y = √x (x ≥ 0)", "x̄ += ȳ/(2y); ẏ = ẋ/(2y)", "ẋ̄ −= ẋ·ȳ/(4y³)", Fill::positive, sqrt);
  unary("abs", "y = |x|", "x̄ += sign(x)·ȳ, 0 at x = 0; ẏ = sign(x)·ẋ",
        "0 away from x = 0 (f″ = 0); not twice differentiable at 0", Fill::away_from_zero, abs);
  // At x = 0 the central difference (|ε| − |−ε|)/2ε is 0, as f′(0) is taken: the kink is checked too.
  r.add_case("abs", {"x = 0", {{"x", {3, 4}, Fill::zeros}}, [](Tape&, std::span<const Var> x) { return abs(x[0]); },
                     {}, {}, /*at_kink=*/true});
  r.add({.name = "pow",
         .family = "pointwise",
         .equation = "x̄ += p·xᵖ⁻¹·ȳ; ẏ = p·xᵖ⁻¹·ẋ (0 for p = 0)",
         .forward = "y = xᵖ, a scalar exponent p",
         .second_order = "ẋ̄ += p(p − 1)·xᵖ⁻²·ẋ·ȳ (0 for p = 0, 1)",
         .second_order_derivation = "6.3"});
  auto pow_case = [&r](const char* name, Fill fill, double p) {
    r.add_case("pow", {name, {{"x", {4, 5}, fill}}, [p](Tape&, std::span<const Var> x) { return pow(x[0], p); }});
  };
  pow_case("p = 3", Fill::normal, 3);
  pow_case("p = 0.5", Fill::positive, 0.5);
  pow_case("p = -1.5", Fill::positive, -1.5);
  pow_case("p = -2", Fill::away_from_zero, -2);
  pow_case("p = 0", Fill::normal, 0);
  r.add({.name = "elu",
         .family = "pointwise",
         .equation = "x̄ += ȳ (x > 0), (y + α)·ȳ (x ≤ 0); ẏ likewise",
         .forward = "y = x (x > 0), α(eˣ − 1) (x ≤ 0)",
         .second_order = "ẋ̄ += (y + α)·ẋ·ȳ (x ≤ 0), 0 (x > 0)",
         .second_order_derivation = "6.3"});
  r.add_case("elu", {"alpha = 1", {{"x", {4, 5}, Fill::away_from_zero}},
                     [](Tape&, std::span<const Var> x) { return elu(x[0]); }});
  r.add_case("elu", {"alpha = 0.5", {{"x", {3, 3}, Fill::away_from_zero}},
                     [](Tape&, std::span<const Var> x) { return elu(x[0], 0.5); }});
}

}  // namespace tapegrad
