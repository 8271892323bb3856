// GELU kernels, GPT-2's tanh form, over raw buffers of n elements: the gelu node (pointwise.cpp) and the fused
// MLP (mlp.cpp) call them.
//
// Per element:
//   y = ½x(1 + t),   t = tanh u,   u = √(2/π)(x + 0.044715x³)
//   f′(x) = ½(1 + t) + ½x(1 − t²)·√(2/π)(1 + 3·0.044715x²)          (dt/du = 1 − t², du/dx = √(2/π)(1 + 3·0.044715x²))
// The forward saves t, so that the derivative reads it instead of evaluating tanh again. float32 takes tanh
// from ops/fast_math.hpp (≤ 1.6 ulp, vectorized), float64 from libm. The elements run on the engine's threads.
#pragma once

#include <cstdint>

#include "../engine/parallel.hpp"
#include "fast_math.hpp"

namespace tapegrad {

namespace gelu_detail {
constexpr double kC = 0.7978845608028654;  // √(2/π)
constexpr double kA = 0.044715;
constexpr int64_t kGrain = 16384;  // elements per range: a few microseconds of work
}  // namespace gelu_detail

// y = ½x(1 + t), t = tanh u                                                   y, t, x: (n)
template <class T>
void gelu_forward(T* y, T* t, const T* x, int64_t n) {
  using namespace gelu_detail;
  parallel_for(n, kGrain, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T xi = x[i];
      const T ti = fast_tanh(T(kC) * (xi + T(kA) * xi * xi * xi));
      t[i] = ti;
      y[i] = T(0.5) * xi * (1 + ti);
    }
  });
}

// y = ½x(1 + t) from a saved t                                                y, x, t: (n)
template <class T>
void gelu_from_tanh(T* y, const T* x, const T* t, int64_t n) {
  parallel_for(n, gelu_detail::kGrain, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = T(0.5) * x[i] * (1 + t[i]);
  });
}

// f′(x) from x and t = tanh u.
template <class T>
inline T gelu_slope(T x, T t) {
  using namespace gelu_detail;
  const T du_dx = T(kC) * (1 + 3 * T(kA) * x * x);
  return T(0.5) * (1 + t) + T(0.5) * x * (1 - t * t) * du_dx;
}

// out += f′(x) ⊙ in: the VJP with (out, in) = (x̄, ȳ), the JVP with (ẏ, ẋ).      out, x, t, in: (n)
template <class T>
void gelu_derivative(T* out, const T* x, const T* t, const T* in, int64_t n) {
  parallel_for(n, gelu_detail::kGrain, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] += gelu_slope(x[i], t[i]) * in[i];
  });
}

// v ← f′(x) ⊙ v in place (a cotangent or tangent carried through the gelu)      v, x, t: (n)
template <class T>
void gelu_derivative_in_place(T* v, const T* x, const T* t, int64_t n) {
  parallel_for(n, gelu_detail::kGrain, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) v[i] *= gelu_slope(x[i], t[i]);
  });
}

}  // namespace tapegrad
