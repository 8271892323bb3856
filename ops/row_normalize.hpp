// Row kernels of β(x) = x / (1 + ‖x‖) over raw row-major buffers of shape (rows, cols) (the β-attention
// post; docs/derivations.md §1.2).
// The row_normalize node (row_normalize.cpp) calls them, and so does β-attention, on its score rows.
//
// Notation: a row x ∈ ℝⁿ, r = ‖x‖, c = 1/(1 + r), x̂ = x/r; ȳ upstream gradient; ẋ, ẏ tangents.
//
// Derivative. From dr = ⟨x, dx⟩/r:
//   dβ(x)·h = h/(1 + r) − x·⟨x, h⟩/(r(1 + r)²) = c·h − c²·(⟨x, h⟩/r)·x          (x ≠ 0)
//   dβ(0)·h = h
// β is C¹ at 0: the second term has norm ≤ c²·r·‖h‖ → 0, so the Jacobian tends to I (β is not C² there).
// The Jacobian c·I − (c²/r)·x xᵀ is symmetric, so the VJP is the same product: x̄ = c·ȳ − c²·(⟨x, ȳ⟩/r)·x.
//
// Departure from the β-attention post (docs/derivations.md §1.3). The post claims the homogeneity property
// dβ(x)·h = f(x,h)·β(x) with f(x,h) = ⟨x,h⟩/(r²(1 + r)), and builds a "simpler total derivative" of β-attention on
// it. That is false for general h. Splitting h into its parts along and across x,
//   dβ(x)·h = f(x,h)·β(x) + (I − x xᵀ/r²)·h/(1 + r),
// the claimed form is only the first term: it is right for h ∥ x, and for h ⟂ x it gives 0 where the true
// derivative is h/(1 + r). The post obtained f by matching the two sides along x alone, which silently drops the
// (I − x xᵀ/r²)h/(1 + r) part. The kernels below implement the full derivative; tests/ops_row_normalize_test.cpp
// shows the gradchecker rejecting the claimed JVP.
//
// The VJP and JVP read the input x, not y = β(x): recovering c = 1 − ‖y‖ from y cancels catastrophically when
// r is large (c = 1e-4 leaves three digits in float32).
// y may alias x in the forward. The VJP and JVP add into their first argument, which must not alias the others.
#pragma once

#include <cmath>
#include <cstdint>

namespace tapegrad {

namespace row_normalize_detail {

template <class T>
inline T row_dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t j = 0; j < n; ++j) s += a[j] * b[j];
  return s;
}

// out += dβ(x)·v = c·v − c²·(⟨x, v⟩/r)·x per row; out += v where x = 0.
template <class T>
inline void jacobian_product(T* out, const T* x, const T* v, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    const T* xi = x + i * cols;
    const T* vi = v + i * cols;
    T* oi = out + i * cols;
    const T r = std::sqrt(row_dot(xi, xi, cols));
    const T c = 1 / (1 + r);
    const T k = r > 0 ? c * c * row_dot(xi, vi, cols) / r : T(0);  // guard r = 0: the identity
    for (int64_t j = 0; j < cols; ++j) oi[j] += c * vi[j] - k * xi[j];
  }
}

}  // namespace row_normalize_detail

// y = x / (1 + ‖x‖) per row                                                        y, x: (rows, cols)
template <class T>
inline void row_normalize_forward(T* y, const T* x, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    const T* xi = x + i * cols;
    T* yi = y + i * cols;
    const T c = 1 / (1 + std::sqrt(row_normalize_detail::row_dot(xi, xi, cols)));
    for (int64_t j = 0; j < cols; ++j) yi[j] = c * xi[j];
  }
}

// x̄ += c·ȳ − c²·(⟨x, ȳ⟩/r)·x;  x̄ += ȳ where x = 0                         dx, x, dy: (rows, cols)
template <class T>
inline void row_normalize_vjp(T* dx, const T* x, const T* dy, int64_t rows, int64_t cols) {
  row_normalize_detail::jacobian_product(dx, x, dy, rows, cols);
}

// ẏ += c·ẋ − c²·(⟨x, ẋ⟩/r)·x;  ẏ += ẋ where x = 0                         ty, x, tx: (rows, cols)
template <class T>
inline void row_normalize_jvp(T* ty, const T* x, const T* tx, int64_t rows, int64_t cols) {
  row_normalize_detail::jacobian_product(ty, x, tx, rows, cols);
}

}  // namespace tapegrad
