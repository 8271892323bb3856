// An element-wise op from its function and its first two derivatives: pointwise(name, x, f, df, d2f) records
// y = f(x) as one node named `name`, with
//   VJP  x̄ += f′(x)·ȳ          JVP  ẏ = f′(x)·ẋ          second order  ẋ̄ += f″(x)·ẋ·ȳ   x, y, x̄, ȳ, ẋ, ẏ: one shape
// (the Jacobian is diagonal, so each product is one multiplication; the second-order rule is the tangent of the
// VJP along ẋ, which Tape::hvp and `tapegrad gradcheck --order 2` use).
//
// f, df and d2f are called with float for float32 tensors and double for float64: write them as generic lambdas.
// df takes x, or x and y = f(x) when f′ is cheaper in y (exp: f′ = y; tanh: f′ = 1 − y²); d2f likewise (exp: f″ = y;
// tanh: f″ = −2y(1 − y²)). The node keeps x and y.
//
//   Var softsign(Var x) {                                 // f = x/(1+|x|), f′ = 1/(1+|x|)², f″ = −2·sign(x)/(1+|x|)³
//     return pointwise("softsign", x, [](auto v) { return v / (1 + std::abs(v)); },
//                      [](auto v) { return 1 / ((1 + std::abs(v)) * (1 + std::abs(v))); },
//                      [](auto v) { auto a = 1 + std::abs(v); return (v > 0 ? -2 : v < 0 ? 2 : 0) / (a * a * a); });
//   }
//
// Without d2f, pointwise(name, x, f, df) records no second-order rule: Tape::hvp through the node throws naming it,
// and the second-order check of a case that uses it says "not checked", never passed.
//
// `name` must outlive the tape (a string literal): the node, its errors, the profile, `tapegrad graph` and
// `explain` show it, with the file and line of the call to pointwise as the node's place.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common.hpp"

namespace tapegrad {

// f′ at one element: df(x, y) when df takes two arguments, df(x) otherwise.
template <class T, class DF>
T pointwise_derivative(const DF& df, T x, T y) {
  if constexpr (std::is_invocable_v<const DF&, T, T>) return static_cast<T>(df(x, y));
  else return static_cast<T>(df(x));
}

namespace pointwise_detail {
struct NoCurvature {};

template <class F, class DF, class D2F>
Var record(const char* name, Var x, F f, DF df, D2F d2f, SourcePlace where) {
  expect_float(name, x);
  Tape& tape = x.tape();
  const Tensor xv = x.value();
  Tensor y = tape.empty(x.dtype(), x.shape());
  const int64_t n = y.numel();
  dispatch_float(name, x.dtype(), [&]<class T>(T) {
    const T* px = xv.data<T>();
    T* py = y.data<T>();
    for (int64_t i = 0; i < n; ++i) py[i] = static_cast<T>(f(px[i]));
  });
  // out += f′(x) ⊙ in: the VJP with (out, in) = (x̄, ȳ), the JVP with (ẏ, ẋ).
  auto apply_derivative = [=](Tensor& out, const Tensor& in) {
    dispatch_float(name, out.dtype(), [&]<class T>(T) {
      const T *px = xv.data<T>(), *py = y.data<T>(), *pi = in.data<T>();
      T* po = out.data<T>();
      for (int64_t i = 0; i < n; ++i) po[i] += pointwise_derivative(df, px[i], py[i]) * pi[i];
    });
  };
  auto vjp = [=](const Tensor& g, std::span<Tensor> gin) {
    if (gin[0].defined()) apply_derivative(gin[0], g);
  };
  auto jvp = [=](std::span<const Tensor> tin, Tensor& ty) {
    if (tin[0].defined()) apply_derivative(ty, tin[0]);
  };
  if constexpr (std::is_same_v<D2F, NoCurvature>) {
    return tape.record(name, {x}, y, vjp, jvp, where);
  } else {
    // Second order: ẋ̄ += f″(x)·ẋ·ȳ, the tangent of x̄ = f′(x)·ȳ at a fixed ȳ.
    auto second = [=](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
      if (!tin[0].defined() || !gin_dot[0].defined()) return;
      dispatch_float(name, g.dtype(), [&]<class T>(T) {
        const T *px = xv.data<T>(), *py = y.data<T>(), *pt = tin[0].data<T>(), *pg = g.data<T>();
        T* po = gin_dot[0].data<T>();
        for (int64_t i = 0; i < n; ++i) po[i] += pointwise_derivative(d2f, px[i], py[i]) * pt[i] * pg[i];
      });
    };
    return tape.record(name, {x}, y, vjp, jvp, second, where);
  }
}
}  // namespace pointwise_detail

template <class F, class DF>
Var pointwise(const char* name, Var x, F f, DF df, SourcePlace where = SourcePlace::current()) {
  return pointwise_detail::record(name, x, f, df, pointwise_detail::NoCurvature{}, where);
}

// With f″ as well (d2f of x, or of x and y), for second order (Tape::hvp): ẋ̄ += f″(x)·ẋ·ȳ.
template <class F, class DF, class D2F>
Var pointwise(const char* name, Var x, F f, DF df, D2F d2f, SourcePlace where = SourcePlace::current()) {
  return pointwise_detail::record(name, x, f, df, d2f, where);
}

}  // namespace tapegrad
