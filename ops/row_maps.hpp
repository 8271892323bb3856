// The row maps of attention — softmax σ, log-softmax and β(x) = x/(1 + ‖x‖) — each on one row, with its forward,
// VJP and JVP side by side and its derivation above them. This is their one home: the standalone nodes
// (softmax.cpp, row_normalize.cpp) apply them to every row of a tensor, and the attention nodes to their score
// rows (attention/softmax.cpp: σ; attention/beta.cpp: β).
//
// A row is x[0..n) of which the first `visible` entries take part: the attention nodes pass the causal prefix of a
// score row, the standalone nodes visible = n. A forward writes its map of x[0..visible) and zeros over
// [visible, n) (a masked score has probability 0 and passes nothing back).
// Which sums run in the eight lanes of ops/fast_math.hpp (lane_max, lane_sum, lane_dot): softmax's max, sum and row
// term ⟨y, u⟩, log-softmax's max and its VJP's Σz̄, β's norm and ⟨β, u⟩, and the plain dot products of the second-order
// rules (⟨y, ȳ⟩, ⟨y, ẋ⟩, ⟨β, ẋ⟩, ⟨β, ȳ⟩, Σz̄). The others are serial loops in index order: log-softmax's Σ exp(x − m),
// the ⟨exp(z), ẋ⟩ of its JVP and second-order rule, softmax's second-order ⟨y ⊙ ẋ, ȳ⟩ and β's ⟨β̇, ȳ⟩.
// float32 takes exp from ops/fast_math.hpp (≤ 1.4 ulp); float64, the gradchecker's precision, stays on libm.
//
// Into: a VJP or JVP either adds its result into `out` (a node's gradient and tangent buffers) or replaces `out`
// with it, in which case `out` may be the very buffer it reads the cotangent or tangent from (the attention nodes
// turn dA into dS in place). Otherwise outputs must not alias inputs; a forward's y may alias its x.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "fast_math.hpp"

namespace tapegrad {

enum class Into { add, replace };

namespace row_maps_detail {

template <Into into, class T>
inline void put(T& out, T value) {
  if constexpr (into == Into::add) {
    out += value;
  } else {
    out = value;
  }
}

}  // namespace row_maps_detail

// ---- softmax ----------------------------------------------------------------------------------------------------
// Notation (docs/derivations.md §2.1, the attention-gradient post): a row x, m = max_j x_j, y = σ(x); ȳ the
// upstream gradient; ẋ, ẏ tangents.
//   y_j = exp(x_j − m) / Σ_k exp(x_k − m)
// Shifting by m leaves σ unchanged (σ(x + c·1) = σ(x)) and makes every exponent ≤ 0 with the largest term exactly
// 1: no overflow for logits of ±1e4, and a denominator ≥ 1.
// Masked entries. x_j = −∞ is a masked score: exp(x_j − m) = 0 exactly, so y_j = 0 and the entry drops out of
// every ⟨y, ·⟩ below. A row that is entirely −∞ has no finite max (x_j − m would be NaN); it is DEFINED as
// σ = 0 (a query that may see no key attends to nothing: its attention output is 0), and the derivatives below
// then give 0 on it as they stand. A +∞ or NaN entry is not a mask and gives a NaN row.
// `readable` (visible ≤ readable ≤ n): x[visible, readable) may be read too, whatever it holds. The exponentials and
// the scaling then run on to the next multiple of 8 past `visible` where that is readable, so that a causal row
// (visible = i + 1) ends in a whole vector rather than up to seven elements one at a time; what they leave past
// `visible` is overwritten by the zeros, and the max and the sum read [0, visible) only: the same bits.
template <class T>
inline void softmax_row(T* y, const T* x, int64_t visible, int64_t n, int64_t readable) {
  const T m = lane_max(x, visible, -std::numeric_limits<T>::infinity());
  if (m == -std::numeric_limits<T>::infinity()) {  // fully masked row: y = 0
    std::fill(y, y + n, T(0));
    return;
  }
  const int64_t width = std::min(readable, (visible + 7) / 8 * 8);
  for (int64_t j = 0; j < width; ++j) y[j] = fast_exp(x[j] - m);
  const T inv = 1 / lane_sum(y, visible);
  for (int64_t j = 0; j < width; ++j) y[j] *= inv;
  std::fill(y + visible, y + n, T(0));
}
template <class T>
inline void softmax_row(T* y, const T* x, int64_t visible, int64_t n) {
  softmax_row(y, x, visible, n, visible);
}

// dσ(x) = diag(y) − y yᵀ, symmetric, so the VJP and the JVP are the same product:
//   x̄ = y ⊙ (ȳ − ⟨y, ȳ⟩)          ẏ = y ⊙ (ẋ − ⟨y, ẋ⟩)
// The row term ⟨y, u⟩ is an argument: the attention node has it cheaper than a dot product over the row
// (G_i·O_i, derived above attention_vjp in ops/attention/softmax.cpp); softmax_row_term computes it directly.
template <Into into, class T>
inline void softmax_row_derivative(T* out, const T* y, const T* u, T row_term, int64_t n) {
  for (int64_t j = 0; j < n; ++j) row_maps_detail::put<into>(out[j], y[j] * (u[j] - row_term));
}
template <class T>
inline T softmax_row_term(const T* y, const T* u, int64_t n) {
  return lane_dot(y, u, n);
}

// Second order (Tape::hvp): the tangent of the VJP above at a fixed ȳ, where only y moves, with the JVP's ẏ:
//   ẋ̄ = ẏ ⊙ (ȳ − ⟨y, ȳ⟩) − ⟨ẏ, ȳ⟩·y,      ⟨ẏ, ȳ⟩ = ⟨y ⊙ ẋ, ȳ⟩ − ⟨y, ẋ⟩⟨y, ȳ⟩
// (so ẏ is never stored). Masked entries (y_j = 0) and fully masked rows give 0, as in the first order.
template <class T>
inline void softmax_row_second_order(T* out, const T* y, const T* g, const T* tx, int64_t n) {
  const T y_g = lane_dot(y, g, n), y_tx = lane_dot(y, tx, n);
  T ydot_g = 0;
  for (int64_t j = 0; j < n; ++j) ydot_g += y[j] * tx[j] * g[j];
  ydot_g -= y_tx * y_g;
  for (int64_t j = 0; j < n; ++j) out[j] += y[j] * (tx[j] - y_tx) * (g[j] - y_g) - ydot_g * y[j];
}

// ---- log-softmax ------------------------------------------------------------------------------------------------
//   z_j = (x_j − m) − log Σ_k exp(x_k − m)
// z is formed from x − m directly, never as the log of a y_j that may underflow to 0 (z_j = −2e4 is exact where
// σ(x)_j is 0 in every float type). A fully masked row is log σ = log 0 = −∞, so that exp(z) = y on every row.
// dz = (I − 1 yᵀ) dx with y = exp(z) = σ(x):
//   x̄ = z̄ − exp(z)·Σ_k z̄_k          ż = ẋ − ⟨exp(z), ẋ⟩
// On a fully masked row y = 0: x̄ = z̄ and ż = ẋ (z = x − lse with nothing left to normalize).
template <class T>
inline void log_softmax_row(T* z, const T* x, int64_t n) {
  const T m = lane_max(x, n, -std::numeric_limits<T>::infinity());
  if (m == -std::numeric_limits<T>::infinity()) {  // fully masked row: z = log 0
    std::fill(z, z + n, -std::numeric_limits<T>::infinity());
    return;
  }
  T s = 0;
  for (int64_t j = 0; j < n; ++j) s += fast_exp(x[j] - m);
  const T log_s = std::log(s);
  for (int64_t j = 0; j < n; ++j) z[j] = (x[j] - m) - log_s;
}

template <Into into, class T>
inline void log_softmax_row_vjp(T* dx, const T* z, const T* dz, int64_t n) {
  const T dz_sum = lane_sum(dz, n);
  for (int64_t j = 0; j < n; ++j) row_maps_detail::put<into>(dx[j], dz[j] - fast_exp(z[j]) * dz_sum);
}

template <Into into, class T>
inline void log_softmax_row_jvp(T* tz, const T* z, const T* tx, int64_t n) {
  T y_dot_tx = 0;
  for (int64_t j = 0; j < n; ++j) y_dot_tx += fast_exp(z[j]) * tx[j];
  for (int64_t j = 0; j < n; ++j) row_maps_detail::put<into>(tz[j], tx[j] - y_dot_tx);
}

// Second order (Tape::hvp): x̄ = z̄ − p·Σz̄ with p = exp(z) = σ(x), so at a fixed z̄ only p moves, ṗ = p ⊙ (ẋ − ⟨p, ẋ⟩):
//   ẋ̄ = −(Σ_k z̄_k)·p ⊙ (ẋ − ⟨p, ẋ⟩)
template <class T>
inline void log_softmax_row_second_order(T* out, const T* z, const T* dz, const T* tx, int64_t n) {
  const T dz_sum = lane_sum(dz, n);
  T p_tx = 0;
  for (int64_t j = 0; j < n; ++j) p_tx += fast_exp(z[j]) * tx[j];
  for (int64_t j = 0; j < n; ++j) out[j] -= dz_sum * fast_exp(z[j]) * (tx[j] - p_tx);
}

// ---- β(x) = x / (1 + ‖x‖) ---------------------------------------------------------------------------------------
// The β-attention post (docs/derivations.md §1.2). Notation: a row x, r = ‖x‖, c = 1/(1 + r), β = β(x) = c·x.
// Derivative. From dr = ⟨x, dx⟩/r:
//   dβ(x)·h = h/(1 + r) − x·⟨x, h⟩/(r(1 + r)²) = c·h − c²(⟨x, h⟩/r)·x = c·h − (⟨β, h⟩/r)·β      (x ≠ 0)
//   dβ(0)·h = h
// β is C¹ at 0: the second term has norm ≤ c²·r·‖h‖ → 0, so the Jacobian tends to I (β is not C² there).
// The Jacobian c·I − (c²/r)·x xᵀ is symmetric, so the VJP applies the same map to the cotangent:
//   x̄ = c·ȳ − (⟨β, ȳ⟩/r)·β          ẏ = c·ẋ − (⟨β, ẋ⟩/r)·β
// The derivative is written in β and r, which the forward returns: c = 1/(1 + r) is then exact, where recovering
// it as 1 − ‖β‖ would cancel catastrophically for large r (c = 1e-4 leaves three digits in float32).
//
// The β-attention post's homogeneity shortcut, dβ(x)·h = f(x,h)·β(x), holds along x only (docs/derivations.md §1.3
// shows why); the kernels below implement the full derivative.

// y[0..visible) = β(x[0..visible)), y[visible..n) = 0; returns r = ‖x[0..visible)‖.
template <class T>
inline T beta_row(T* y, const T* x, int64_t visible, int64_t n) {
  const T r = std::sqrt(lane_dot(x, x, visible));
  const T c = 1 / (1 + r);
  for (int64_t j = 0; j < visible; ++j) y[j] = c * x[j];
  std::fill(y + visible, y + n, T(0));
  return r;
}

// out[0..visible) (+)= dβ(x)·u = c·u − (⟨β, u⟩/r)·β, with β the row's output and r = ‖x‖ (the second term is 0 when
// r = 0, where dβ(0) = I). With Into::replace, out[visible..n) = 0 (the mask on dP and Ṗ) and out may be u.
template <Into into, class T>
inline void beta_row_derivative(T* out, const T* u, const T* beta, T r, int64_t visible, int64_t n) {
  const T c = 1 / (1 + r);
  const T along = r > 0 ? lane_dot(beta, u, visible) / r : T(0);
  for (int64_t j = 0; j < visible; ++j) row_maps_detail::put<into>(out[j], c * u[j] - along * beta[j]);
  if constexpr (into == Into::replace) std::fill(out + visible, out + n, T(0));
}

// Second order (Tape::hvp): the tangent of x̄ = c·ȳ − k·β, k = ⟨β, ȳ⟩/r, at a fixed ȳ. With ṙ = ⟨x, ẋ⟩/r =
// (1 + r)·⟨β, ẋ⟩/r, ċ = −c²·ṙ and β̇ = c·ẋ − (⟨β, ẋ⟩/r)·β (the JVP above):
//   ẋ̄ = ċ·ȳ − k̇·β − k·β̇,      k̇ = ⟨β̇, ȳ⟩/r − ⟨β, ȳ⟩·ṙ/r²
// β is not twice differentiable at x = 0 (r = 0: k·β carries x xᵀ/‖x‖, whose derivative has no limit there): the
// term is taken as 0, which is also what central differences of the gradient give, since k·β is even in x.
template <class T>
inline void beta_row_second_order(T* out, const T* g, const T* tx, const T* beta, T r, int64_t n) {
  if (!(r > 0)) return;
  const T c = 1 / (1 + r);
  const T beta_tx = lane_dot(beta, tx, n), beta_g = lane_dot(beta, g, n);
  const T r_dot = (1 + r) * beta_tx / r, c_dot = -c * c * r_dot, k = beta_g / r;
  T beta_dot_g = 0;  // ⟨β̇, ȳ⟩
  for (int64_t j = 0; j < n; ++j) beta_dot_g += (c * tx[j] - (beta_tx / r) * beta[j]) * g[j];
  const T k_dot = beta_dot_g / r - beta_g * r_dot / (r * r);
  for (int64_t j = 0; j < n; ++j) out[j] += c_dot * g[j] - k_dot * beta[j] - k * (c * tx[j] - (beta_tx / r) * beta[j]);
}

}  // namespace tapegrad
