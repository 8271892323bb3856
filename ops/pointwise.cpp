// Element-wise functions y = f(x):  VJP x̄ += f′(x)·ȳ,  JVP ẏ = f′(x)·ẋ  (ops/pointwise.hpp records them); second
// order (Tape::hvp) ẋ̄ += f″(x)·ẋ·ȳ. Each f′ and f″ is written with whatever of x and y makes it cheapest; the node
// keeps those two tensors. Each function's f′ and f″ are stated once, in its sheet at the end of this file.
// What the sheets do not say: sigmoid takes y from e^(−|x|), which cannot overflow; abs takes f′(0) = 0, the central
// value of [−1, 1], as PyTorch and JAX take it, and what central differences give. sqrt and pow refuse inputs where
// y would be NaN or infinite (x < 0; x < 0 with p not an integer; x = 0 with p < 0) instead of returning it.
// gelu (tanh form) and gelu_erf (exact) have a node of their own, in ops/gelu.cpp.
#include <cmath>
#include <string_view>

#include "ops/sheet.hpp"
#include "ops/common.hpp"
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

Var exp(Var x) {
  return pointwise(
      "exp", x, [](auto v) { return std::exp(v); }, [](auto, auto y) { return y; }, [](auto, auto y) { return y; });
}
Var log(Var x) {
  return pointwise(
      "log", x, [](auto v) { return std::log(v); }, [](auto v, auto) { return 1 / v; },
      [](auto v) { return -1 / (v * v); });
}
Var tanh(Var x) {
  return pointwise(
      "tanh", x, [](auto v) { return std::tanh(v); }, [](auto, auto y) { return 1 - y * y; },
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
  return pointwise(
      "sigmoid", x, f, [](auto, auto y) { return y * (1 - y); },
      [](auto, auto y) { return y * (1 - y) * (1 - 2 * y); });
}
Var square(Var x) {
  return pointwise(
      "square", x, [](auto v) { return v * v; }, [](auto v) { return 2 * v; }, [](auto v) { return decltype(v)(2); });
}
Var sqrt(Var x) {
  expect_each(
      "sqrt", x, [](auto v) { return v >= 0; }, "x ≥ 0");
  return pointwise(
      "sqrt", x, [](auto v) { return std::sqrt(v); }, [](auto, auto y) { return 1 / (2 * y); },
      [](auto, auto y) { return -1 / (4 * y * y * y); });
}
Var abs(Var x) {
  return pointwise(
      "abs", x, [](auto v) { return std::abs(v); },
      [](auto v) { return v > 0   ? decltype(v)(1)
                          : v < 0 ? decltype(v)(-1)
                                  : decltype(v)(0); },
      [](auto v) { return decltype(v)(0); });
}
Var pow(Var x, double p) {
  const bool integer = p == std::round(p);
  if (!integer)
    expect_each(
        "pow", x, [](auto v) { return v >= 0; },
        fmt::format("x ≥ 0 for the exponent p = {} (not an integer)", p).c_str());
  if (p < 0)
    expect_each(
        "pow", x, [](auto v) { return v != 0; }, fmt::format("x ≠ 0 for the exponent p = {} < 0", p).c_str());
  return pointwise(
      "pow", x, [p](auto v) { return std::pow(v, decltype(v)(p)); },
      [p](auto v) { return p == 0 ? decltype(v)(0) : decltype(v)(p) * std::pow(v, decltype(v)(p - 1)); },
      [p](auto v) {
        return p == 0 || p == 1 ? decltype(v)(0) : decltype(v)(p * (p - 1)) * std::pow(v, decltype(v)(p - 2));
      });
}

// The sheets: each function's forward, f′ as its VJP and JVP, and f″ as its second-order rule ẋ̄ += f″(x)·ẋ·ȳ
// (docs/derivations.md §6.3). This is where they are written; `tapegrad explain` prints them and the index of
// docs/derivations.md is generated from them.
std::vector<OpSheet> pointwise_ops() {
  auto matrix = [](Var (*fn)(Var), Fill fill = Fill::normal) {
    return std::vector<GradcheckCase>{
        {"matrix", {{"x", {4, 5}, fill}}, [fn](Tape&, std::span<const Var> x) { return fn(x[0]); }}};
  };
  auto with_p = [](const char* name, Fill fill, double p) {
    return GradcheckCase{name, {{"x", {4, 5}, fill}}, [p](Tape&, std::span<const Var> x) { return pow(x[0], p); }};
  };
  auto with_alpha = [](const char* name, Shape shape, double alpha) {
    return GradcheckCase{name, {{"x", shape, Fill::away_from_zero}}, [alpha](Tape&, std::span<const Var> x) {
                           return elu(x[0], alpha);
                         }};
  };
  auto by_name = [](Var (*fn)(Var)) {
    return OpCall([fn](std::span<const Var> x, const OpArgs&) { return fn(x[0]); });
  };
  const char* f = "pointwise";
  const char* d = "6.3";
  std::vector<OpSheet> sheets{
      {.name = "exp",
       .family = f,
       .forward = "y = exp x",
       .vjp = "x̄ += y·ȳ",
       .jvp = "ẏ = y·ẋ",
       .second_order = "ẋ̄ += y·ẋ·ȳ",
       .second_order_derivation = d,
       .cases = matrix(exp),
       .undefined_edges = {"large=inf"},  // exp(710) overflows float64: y = ∞, and ȳ = 0 there meets y·ȳ = ∞·0
       .inputs = 1,
       .call = by_name(exp)},
      {.name = "log",
       .family = f,
       .forward = "y = log x (x > 0)",
       .vjp = "x̄ += ȳ/x",
       .jvp = "ẏ = ẋ/x",
       .second_order = "ẋ̄ −= ẋ·ȳ/x²",
       .second_order_derivation = d,
       .cases = matrix(log, Fill::positive),
       .undefined_edges = {"zeros=inf"},  // log 0 = −∞, where ȳ = 0 meets ȳ/x = 0/0
       .inputs = 1,
       .call = by_name(log)},
      {.name = "tanh",
       .family = f,
       .forward = "y = tanh x",
       .vjp = "x̄ += (1 − y²)·ȳ",
       .jvp = "ẏ = (1 − y²)·ẋ",
       .second_order = "ẋ̄ −= 2y(1 − y²)·ẋ·ȳ",
       .second_order_derivation = d,
       .cases = matrix(tanh),
       .inputs = 1,
       .call = by_name(tanh)},
      {.name = "relu",
       .family = f,
       .forward = "y = max(x, 0)",
       .vjp = "x̄ += [x > 0]·ȳ",
       .jvp = "ẏ = [x > 0]·ẋ (0 at the kink)",
       .second_order = "0 away from x = 0 (f″ = 0)",
       .second_order_derivation = d,
       .cases = matrix(relu, Fill::away_from_zero),
       .inputs = 1,
       .call = by_name(relu)},
      {.name = "sigmoid",
       .family = f,
       .forward = "y = 1/(1 + e⁻ˣ)",
       .vjp = "x̄ += y(1 − y)·ȳ",
       .jvp = "ẏ = y(1 − y)·ẋ",
       .second_order = "ẋ̄ += y(1 − y)(1 − 2y)·ẋ·ȳ",
       .second_order_derivation = d,
       .cases = matrix(sigmoid),
       .inputs = 1,
       .call = by_name(sigmoid)},
      {.name = "square",
       .family = f,
       .forward = "y = x²",
       .vjp = "x̄ += 2x·ȳ",
       .jvp = "ẏ = 2x·ẋ",
       .second_order = "ẋ̄ += 2ẋ·ȳ",
       .second_order_derivation = d,
       .cases = matrix(square),
       .inputs = 1,
       .call = by_name(square)},
      {.name = "sqrt",
       .family = f,
       .forward = "y = √x (x ≥ 0)",
       .vjp = "x̄ += ȳ/(2y)",
       .jvp = "ẏ = ẋ/(2y) (+∞ at 0)",
       .second_order = "ẋ̄ −= ẋ·ȳ/(4y³)",
       .second_order_derivation = d,
       .cases = matrix(sqrt, Fill::positive),
       .inputs = 1,
       .call = by_name(sqrt)},
      {.name = "abs",
       .family = f,
       .forward = "y = |x|",
       .vjp = "x̄ += sign(x)·ȳ, 0 at x = 0",
       .jvp = "ẏ = sign(x)·ẋ",
       .second_order = "0 away from x = 0 (f″ = 0); not twice differentiable at 0",
       .second_order_derivation = d,
       .cases = {matrix(abs, Fill::away_from_zero)[0],
                 // At x = 0 the central difference (|ε| − |−ε|)/2ε is 0, as f′(0) is taken: the kink is checked too.
                 {"x = 0",
                  {{"x", {3, 4}, Fill::zeros}},
                  [](Tape&, std::span<const Var> x) { return abs(x[0]); },
                  {},
                  {},
                  /*at_kink=*/true}},
       .inputs = 1,
       .call = by_name(abs)},
      {.name = "pow",
       .family = f,
       .forward = "y = xᵖ, a scalar exponent p",
       .vjp = "x̄ += p·xᵖ⁻¹·ȳ",
       .jvp = "ẏ = p·xᵖ⁻¹·ẋ (0 for p = 0)",
       .second_order = "ẋ̄ += p(p − 1)·xᵖ⁻²·ẋ·ȳ (0 for p = 0, 1)",
       .second_order_derivation = d,
       .cases = {with_p("p = 3", Fill::normal, 3), with_p("p = 0.5", Fill::positive, 0.5),
                 with_p("p = -1.5", Fill::positive, -1.5), with_p("p = -2", Fill::away_from_zero, -2),
                 with_p("p = 0", Fill::normal, 0)},
       .undefined_edges = {"tiny=inf"},  // (1e-200)ᵖ overflows float64 for p < 0 (and 0 is refused there)
       .inputs = 1,
       .call = [](std::span<const Var> x, const OpArgs& a) { return pow(x[0], a.number("p", 2.0)); }},
      {.name = "elu",
       .family = f,
       .forward = "y = x (x > 0), α(eˣ − 1) (x ≤ 0)",
       .vjp = "x̄ += ȳ (x > 0), (y + α)·ȳ (x ≤ 0)",
       .jvp = "ẏ = ẋ (x > 0), (y + α)·ẋ (x ≤ 0)",
       .second_order = "ẋ̄ += (y + α)·ẋ·ȳ (x ≤ 0), 0 (x > 0)",
       .second_order_derivation = d,
       .cases = {with_alpha("alpha = 1", {4, 5}, 1.0), with_alpha("alpha = 0.5", {3, 3}, 0.5)},
       .inputs = 1,
       .call = [](std::span<const Var> x, const OpArgs& a) { return elu(x[0], a.number("alpha", 1.0)); }},
  };
  return sheets;
}

}  // namespace tapegrad
