// Row kernels of softmax and log_softmax over raw row-major buffers of shape (rows, cols), one row = one
// distribution. The softmax nodes (softmax.cpp) call them, and so do the attention nodes, on their score rows.
//
// Notation (docs/derivations.md §2.1, the attention-gradient post): a row x ∈ ℝⁿ, m = max_j x_j, y = σ(x),
// z = log σ(x); ȳ, z̄ upstream gradients; ẋ, ẏ, ż tangents.
//
// Masked entries. x_j = −∞ is a masked score: exp(x_j − m) = 0 exactly, so y_j = 0 and z_j = −∞, and the entry
// drops out of every ⟨y, ·⟩ below; nothing else is needed for masking.
// A row that is entirely −∞ has no finite max (x_j − m would be −∞ − (−∞) = NaN). It is DEFINED, not an error:
//   σ(row of −∞) = 0            (a query that may see no key attends to nothing: its attention output is 0)
//   log σ(row of −∞) = −∞       (= log 0, so that exp(z) = y holds on every row)
// The derivative formulas below are then applied with y = 0 as they stand: the softmax VJP and JVP give 0 on
// such a row, the log_softmax VJP gives x̄ = z̄ and its JVP ż = ẋ (z = x − lse with nothing left to normalize).
// A +∞ or NaN entry is not a mask and gives a NaN row.
//
// y may alias x in the forwards. The VJP and JVP add into their first argument, which must not alias the others.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace tapegrad {

namespace softmax_detail {

template <class T>
inline T row_max(const T* x, int64_t n) {
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

template <class T>
inline T row_dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t j = 0; j < n; ++j) s += a[j] * b[j];
  return s;
}

template <class T>
inline T row_sum(const T* a, int64_t n) {
  T s = 0;
  for (int64_t j = 0; j < n; ++j) s += a[j];
  return s;
}

}  // namespace softmax_detail

// y_j = exp(x_j − m) / Σ_k exp(x_k − m)                                           y, x: (rows, cols)
// Shifting by m leaves σ unchanged (σ(x + c·1) = σ(x)) and makes every exponent ≤ 0 with the largest term
// exactly 1: no overflow for logits of ±1e4, and a denominator ≥ 1.
template <class T>
inline void softmax_forward(T* y, const T* x, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    const T* xi = x + i * cols;
    T* yi = y + i * cols;
    const T m = softmax_detail::row_max(xi, cols);
    if (m == -std::numeric_limits<T>::infinity()) {  // fully masked row: y = 0
      for (int64_t j = 0; j < cols; ++j) yi[j] = 0;
      continue;
    }
    T s = 0;
    for (int64_t j = 0; j < cols; ++j) {
      yi[j] = std::exp(xi[j] - m);
      s += yi[j];
    }
    const T inv_s = 1 / s;
    for (int64_t j = 0; j < cols; ++j) yi[j] *= inv_s;
  }
}

// dσ(x) = diag(y) − y yᵀ, symmetric, so VJP and JVP are the same product:
//   x̄ += y ⊙ (ȳ − ⟨y, ȳ⟩)                                                  dx, y, dy: (rows, cols)
template <class T>
inline void softmax_vjp(T* dx, const T* y, const T* dy, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    const T* yi = y + i * cols;
    const T* gi = dy + i * cols;
    T* di = dx + i * cols;
    const T yg = softmax_detail::row_dot(yi, gi, cols);
    for (int64_t j = 0; j < cols; ++j) di[j] += yi[j] * (gi[j] - yg);
  }
}

//   ẏ += y ⊙ (ẋ − ⟨y, ẋ⟩)                                                  ty, y, tx: (rows, cols)
template <class T>
inline void softmax_jvp(T* ty, const T* y, const T* tx, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    const T* yi = y + i * cols;
    const T* ti = tx + i * cols;
    T* oi = ty + i * cols;
    const T yt = softmax_detail::row_dot(yi, ti, cols);
    for (int64_t j = 0; j < cols; ++j) oi[j] += yi[j] * (ti[j] - yt);
  }
}

// z_j = (x_j − m) − log Σ_k exp(x_k − m)                                          z, x: (rows, cols)
// The same shift; z is formed from x − m directly, never as log of a y_j that may underflow to 0
// (z_j = −2e4 is exact where σ(x)_j is 0 in every float type).
template <class T>
inline void log_softmax_forward(T* z, const T* x, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    const T* xi = x + i * cols;
    T* zi = z + i * cols;
    const T m = softmax_detail::row_max(xi, cols);
    if (m == -std::numeric_limits<T>::infinity()) {  // fully masked row: z = log 0
      for (int64_t j = 0; j < cols; ++j) zi[j] = -std::numeric_limits<T>::infinity();
      continue;
    }
    T s = 0;
    for (int64_t j = 0; j < cols; ++j) s += std::exp(xi[j] - m);
    const T log_s = std::log(s);
    for (int64_t j = 0; j < cols; ++j) zi[j] = (xi[j] - m) - log_s;
  }
}

// dz = (I − 1 yᵀ) dx with y = exp(z) = σ(x):
//   x̄ += z̄ − exp(z) · Σ_k z̄_k                                              dx, z, dz: (rows, cols)
template <class T>
inline void log_softmax_vjp(T* dx, const T* z, const T* dz, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    const T* zi = z + i * cols;
    const T* gi = dz + i * cols;
    T* di = dx + i * cols;
    const T g_sum = softmax_detail::row_sum(gi, cols);
    for (int64_t j = 0; j < cols; ++j) di[j] += gi[j] - std::exp(zi[j]) * g_sum;
  }
}

//   ż += ẋ − ⟨exp(z), ẋ⟩                                                    tz, z, tx: (rows, cols)
template <class T>
inline void log_softmax_jvp(T* tz, const T* z, const T* tx, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    const T* zi = z + i * cols;
    const T* ti = tx + i * cols;
    T* oi = tz + i * cols;
    T yt = 0;
    for (int64_t j = 0; j < cols; ++j) yt += std::exp(zi[j]) * ti[j];
    for (int64_t j = 0; j < cols; ++j) oi[j] += ti[j] - yt;
  }
}

}  // namespace tapegrad
