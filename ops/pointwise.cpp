// Element-wise functions y = f(x):  VJP x̄ += f′(x)·ȳ,  JVP ẏ = f′(x)·ẋ.
// Each f′ is written with whatever of x and y makes it cheapest; the node keeps those two tensors.
//   exp   f′ = y
//   log   f′ = 1/x                                   (x > 0)
//   tanh  f′ = 1 − y²
//   relu  f′ = [x > 0]                               (0 at the kink x = 0)
//   elu   y = x (x > 0), α(eˣ − 1) (x ≤ 0);  f′ = 1 (x > 0), y + α (x ≤ 0)
// gelu has its own node below: it keeps tanh u instead of y, so that its derivative needs no second tanh.
#include <cmath>

#include "engine/gradcheck/registry.hpp"
#include "ops/common.hpp"
#include "ops/gelu.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

struct Exp {
  static constexpr const char* name = "exp";
  template <class T> T f(T x) const { return std::exp(x); }
  template <class T> T df(T, T y) const { return y; }
};
struct Log {
  static constexpr const char* name = "log";
  template <class T> T f(T x) const { return std::log(x); }
  template <class T> T df(T x, T) const { return 1 / x; }
};
struct Tanh {
  static constexpr const char* name = "tanh";
  template <class T> T f(T x) const { return std::tanh(x); }
  template <class T> T df(T, T y) const { return 1 - y * y; }
};
struct Relu {
  static constexpr const char* name = "relu";
  template <class T> T f(T x) const { return x > 0 ? x : T(0); }
  template <class T> T df(T x, T) const { return x > 0 ? T(1) : T(0); }
};
struct Elu {
  static constexpr const char* name = "elu";
  double alpha;
  template <class T> T f(T x) const { return x > 0 ? x : T(alpha) * std::expm1(x); }
  template <class T> T df(T x, T y) const { return x > 0 ? T(1) : y + T(alpha); }
};

template <class Fn>
Var pointwise(Var x, Fn fn) {
  expect_float(Fn::name, x);
  Tape& tape = x.tape();
  const Tensor xv = x.value();
  Tensor y = tape.empty(x.dtype(), x.shape());
  const int64_t n = y.numel();
  dispatch_float(Fn::name, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = xv.data<T>();
    T* py = y.data<T>();
    for (int64_t i = 0; i < n; ++i) py[i] = fn.f(px[i]);
  });
  // out += f′(x) ⊙ in: the VJP with (out, in) = (x̄, ȳ), the JVP with (ẏ, ẋ).
  auto apply_derivative = [=](const Tensor& out, const Tensor& in) {
    dispatch_float(Fn::name, out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T *px = xv.data<T>(), *py = y.data<T>(), *pi = in.data<T>();
      T* po = out.data<T>();
      for (int64_t i = 0; i < n; ++i) po[i] += fn.df(px[i], py[i]) * pi[i];
    });
  };
  return tape.record(
      Fn::name, {x}, y, [=](const Tensor& g, std::span<const Tensor> gin) { apply_derivative(gin[0], g); },
      [=](std::span<const Tensor> tin, const Tensor& ty) { apply_derivative(ty, tin[0]); });
}

}  // namespace

// gelu keeps x and t = tanh u (ops/gelu.hpp has the derivation): its VJP x̄ += f′(x)·ȳ and JVP ẏ = f′(x)·ẋ read t
// instead of evaluating tanh again.
Var gelu(Var x) {
  constexpr const char* op = "gelu";
  expect_float(op, x);
  Tape& tape = x.tape();
  const Tensor xv = x.value();
  Tensor y = tape.empty(x.dtype(), x.shape());
  Tensor t = tape.empty(x.dtype(), x.shape(), "tanh of gelu's argument");
  const int64_t n = y.numel();
  dispatch_float(op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    gelu_forward(y.data<T>(), t.data<T>(), xv.data<T>(), n);
  });
  auto apply_derivative = [xv, t, n](const Tensor& out, const Tensor& in) {
    dispatch_float(op, out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      gelu_derivative(out.data<T>(), xv.data<T>(), t.data<T>(), in.data<T>(), n);
    });
  };
  return tape.record(
      op, {x}, y, [=](const Tensor& g, std::span<const Tensor> gin) { apply_derivative(gin[0], g); },
      [=](std::span<const Tensor> tin, const Tensor& ty) { apply_derivative(ty, tin[0]); });
}

Var exp(Var x) { return pointwise(x, Exp{}); }
Var log(Var x) { return pointwise(x, Log{}); }
Var tanh(Var x) { return pointwise(x, Tanh{}); }
Var relu(Var x) { return pointwise(x, Relu{}); }
Var elu(Var x, double alpha) { return pointwise(x, Elu{alpha}); }

void register_pointwise(Registry& r) {
  auto unary = [&r](const char* name, const char* forward, const char* equation, Fill fill, Var (*fn)(Var)) {
    r.add({.name = name, .family = "pointwise", .equation = equation, .forward = forward});
    r.add_case(name, {"matrix", {{"x", {4, 5}, fill}}, [fn](Tape&, std::span<const Var> x) { return fn(x[0]); }});
  };
  unary("exp", "y = exp x", "x̄ += y·ȳ; ẏ = y·ẋ", Fill::normal, exp);
  unary("log", "y = log x", "x̄ += ȳ/x; ẏ = ẋ/x", Fill::positive, log);
  unary("tanh", "y = tanh x", "x̄ += (1 − y²)·ȳ; ẏ = (1 − y²)·ẋ", Fill::normal, tanh);
  unary("relu", "y = max(x, 0)", "x̄ += [x > 0]·ȳ; ẏ = [x > 0]·ẋ", Fill::away_from_zero, relu);
  unary("gelu", "y = ½x(1 + tanh(√(2/π)(x + 0.044715x³)))",
        "x̄ += gelu′(x)·ȳ with gelu′ of the tanh form; ẏ = gelu′(x)·ẋ", Fill::normal, gelu);
  r.add({.name = "elu",
         .family = "pointwise",
         .equation = "x̄ += ȳ (x > 0), (y + α)·ȳ (x ≤ 0); ẏ likewise",
         .forward = "y = x (x > 0), α(eˣ − 1) (x ≤ 0)"});
  r.add_case("elu", {"alpha = 1", {{"x", {4, 5}, Fill::away_from_zero}},
                     [](Tape&, std::span<const Var> x) { return elu(x[0]); }});
  r.add_case("elu", {"alpha = 0.5", {{"x", {3, 3}, Fill::away_from_zero}},
                     [](Tape&, std::span<const Var> x) { return elu(x[0], 0.5); }});
}

}  // namespace tapegrad
