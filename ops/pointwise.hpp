// An element-wise op from its function and derivative: pointwise(name, x, f, df) records y = f(x) as one node
// named `name`, with
//   VJP  x̄ += f′(x)·ȳ          JVP  ẏ = f′(x)·ẋ                                        x, y, x̄, ȳ, ẋ, ẏ: one shape
// (the Jacobian is diagonal, so the two products are one multiplication each).
//
// f and df are called with float for float32 tensors and double for float64: write them as generic lambdas.
// df takes x, or x and y = f(x) when f′ is cheaper in y (exp: f′ = y; tanh: f′ = 1 − y²). The node keeps x and y.
//
//   Var softsign(Var x) {
//     return pointwise("softsign", x, [](auto v) { return v / (1 + std::abs(v)); },
//                      [](auto v) { return 1 / ((1 + std::abs(v)) * (1 + std::abs(v))); });
//   }
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
  if constexpr (std::is_invocable_v<const DF&, T, T>)
    return static_cast<T>(df(x, y));
  else
    return static_cast<T>(df(x));
}

template <class F, class DF>
Var pointwise(const char* name, Var x, F f, DF df, SourcePlace where = SourcePlace::current()) {
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
  auto apply_derivative = [=](const Tensor& out, const Tensor& in) {
    dispatch_float(name, out.dtype(), [&]<class T>(T) {
      const T *px = xv.data<T>(), *py = y.data<T>(), *pi = in.data<T>();
      T* po = out.data<T>();
      for (int64_t i = 0; i < n; ++i) po[i] += pointwise_derivative(df, px[i], py[i]) * pi[i];
    });
  };
  return tape.record(
      name, {x}, y,
      [=](const Tensor& g, std::span<const Tensor> gin) {
        if (gin[0].defined()) apply_derivative(gin[0], g);
      },
      [=](std::span<const Tensor> tin, const Tensor& ty) {
        if (tin[0].defined()) apply_derivative(ty, tin[0]);
      },
      where);
}

}  // namespace tapegrad
