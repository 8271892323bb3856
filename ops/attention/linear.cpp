// Linear attention (the linear-attention post; docs/derivations.md §4): the softmax kernel exp(q·k/√d) is replaced by
// φ(q)·φ(k) with φ(x) = elu(x) + 1, so the key sums are formed once and each query reads them in O(d·dv), not O(Tk).
//
//   φ(x) = x + 1 (x > 0), eˣ (x ≤ 0);   φ′(x) = 1 (x > 0), eˣ (x ≤ 0) = min(1, φ(x))      (C¹, not C²)
//
// Per (b, h), rows are tokens: q = φ(Q) (T×d), k = φ(K) (Tk×d), V (Tk×dv), O (T×dv).
//   non-causal  S = kᵀV (d×dv),  z = kᵀ1 (d),             O_i = q_iᵀS / q_iᵀz
//   causal      S_i = Σ_{j≤i} k_j v_jᵀ,  z_i = Σ_{j≤i} k_j,  O_i = q_iᵀS_i / q_iᵀz_i     (T = Tk)
// The non-causal line is the post's eq. (4); the post has no causal form, the causal line restricts its sums to
// keys j ≤ i. Its "vectorized" φ(Q)(φ(K)ᵀV) is the numerator only: without the division
// by den_i = q_iᵀz_i it is not attention (docs/derivations.md §4.1). No 1/√d inside φ, and no eps: den_i > 0 as φ > 0.
//
// Chunked streaming. The causal prefix sums are never stored per row: the rows are taken in chunks
// I = [a, a + c) of at most C rows, carrying S, z = the sums over the rows before a. With the in-chunk
// scores P = tril(q_I k_Iᵀ) (c×c, key j ≤ query i),
//   num_I = q_I S + P v_I,   den_I = q_I z + P1,   then  S += k_Iᵀ v_I,  z += k_Iᵀ1,
// so every product is a gemm and the state is O(d·dv + C²) per head. Non-causal: S, z are the full sums
// and there is no in-chunk term. The slices (b, h) run on the engine's threads, each range with its workspace (a
// chunk of the tape's scratch, engine/scratch.hpp).
// Causal sweeps skip the products with a state that is still zero (S, z before the first chunk; R, r after the
// last) and the state update after the last chunk, and the VJP's two sweeps share Gn, γ and W of the chunk
// where they meet: at T ≤ C a causal slice is a handful of products.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/products/blas.hpp"
#include "ops/sheet.hpp"
#include "engine/parallel.hpp"
#include "ops/attention/attention.hpp"
#include "ops/attention/kernels.hpp"
#include "ops/common.hpp"
#include "ops/fast_math.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

constexpr const char* kOp = "linear_attention";
constexpr int64_t kChunk = 64;  // C: rows per chunk of every sweep

// One (b, h) slice: queries tq×d, keys tk×d, values tk×dv.
struct HeadDims {
  int64_t heads = 0;  // B·h slices
  int64_t tq = 0, tk = 0, d = 0, dv = 0;
  bool causal = false;
};

HeadDims head_dims(const AttentionDims& a) { return {a.heads(), a.T, a.Tk, a.d, a.dv, a.causal}; }

// Slices per range of the loops over slices on the engine's threads: ~2¹⁶ multiply-adds per range at least
// (the state updates d·dv per row and the in-chunk scores C·(d + dv) per row).
int64_t slice_grain(const HeadDims& n) {
  const int64_t work = std::max<int64_t>((n.tq + n.tk) * (n.d * n.dv + std::min(kChunk, n.tk) * (n.d + n.dv)), 1);
  return std::max<int64_t>(1, (int64_t{1} << 16) / work);
}

template <class T>
T phi(T x) {
  return x > 0 ? x + 1 : fast_exp(x);
}  // float32: ops/fast_math.hpp's exp
// φ′ read off the saved φ: φ > 1 exactly where x > 0.
template <class T>
T phi_prime_of_phi(T p) {
  return p < 1 ? p : T(1);
}

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  return lane_dot(a, b, n);
}

// The arrays of one range of slices, reused by each of its (b, h) slices: a chunk of the tape's scratch
// (engine/scratch.hpp), zeroed when the range starts. workspace_need lists the same arrays.
inline int64_t rows_per_chunk(const HeadDims& n) { return std::min(kChunk, std::max(n.tq, n.tk)); }
ScratchNeed workspace_need(DType dtype, const HeadDims& n, int64_t chunks) {
  const int64_t c = rows_per_chunk(n);
  return scratch_need(dtype, {n.d * n.dv, n.d, n.d * n.dv, n.d, c * c, c * c, c * n.d, c * n.d, c * n.dv, c}, chunks);
}
template <class T>
struct Workspace {
  Workspace(ScratchChunk s, const HeadDims& n)
      : c(rows_per_chunk(n)),
        S(s.zeroed<T>(n.d * n.dv)),
        z(s.zeroed<T>(n.d)),
        S_dot(s.zeroed<T>(n.d * n.dv)),
        z_dot(s.zeroed<T>(n.d)),
        P(s.zeroed<T>(c * c)),
        W(s.zeroed<T>(c * c)),
        rows_d(s.zeroed<T>(c * n.d)),
        rows_d2(s.zeroed<T>(c * n.d)),
        rows_dv(s.zeroed<T>(c * n.dv)),
        col(s.zeroed<T>(c)) {}
  int64_t c;
  T *S, *z, *S_dot, *z_dot, *P, *W, *rows_d, *rows_d2, *rows_dv, *col;
};

// S += kᵀv (d×dv), z += kᵀ1 (d), over `rows` rows of k (rows×d) and v (rows×dv).
template <class T>
void add_key_sums(T* S, T* z, const T* k, const T* v, int64_t rows, int64_t d, int64_t dv) {
  gemm(d, dv, rows, T(1), transposed(k, d), as_is(v, dv), T(1), S, dv);
  sum_rows(z, k, rows, d);
}

// Zeroes the c×c matrix M above its diagonal: in a chunk, query i sees key j ≤ i.
template <class T>
void keep_lower(T* M, int64_t c) {
  for (int64_t i = 0; i < c; ++i)
    for (int64_t j = i + 1; j < c; ++j) M[i * c + j] = 0;
}

// P = tril(q_I k_Iᵀ) (c×c).
template <class T>
void chunk_scores(T* P, const T* qI, const T* kI, int64_t c, int64_t d) {
  gemm(c, c, d, T(1), as_is(qI, d), transposed(kI, d), T(0), P, c);
  keep_lower(P, c);
}

template <class T>
void zero(T* x, int64_t n) {
  std::fill(x, x + n, T(0));
}

// ---- forward ----
// O (tq×dv) and den (tq) of one slice, chunk by chunk as in the header:
//   O_I = (q_I S + P v_I) ⊘ den_I,  den_I = q_I z + P1.
template <class T>
void linear_attention_forward(T* O, T* den, const T* q, const T* k, const T* v, const HeadDims& n, Workspace<T>& w) {
  const int64_t d = n.d, dv = n.dv;
  T *S = w.S, *z = w.z, *P = w.P;
  zero(w.S, n.d * n.dv);
  zero(w.z, n.d);
  if (!n.causal) add_key_sums(S, z, k, v, n.tk, d, dv);
  for (int64_t a = 0; a < n.tq; a += kChunk) {
    const int64_t c = std::min(kChunk, n.tq - a);
    const T* qI = q + a * d;
    T* OI = O + a * dv;
    T* denI = den + a;
    const bool empty_state = n.causal && a == 0;  // S = 0, z = 0 before the first chunk
    if (empty_state) {
      std::fill(OI, OI + c * dv, T(0));
      std::fill(denI, denI + c, T(0));
    } else {
      gemm(c, dv, d, T(1), as_is(qI, d), as_is(S, dv), T(0), OI, dv);
      for (int64_t i = 0; i < c; ++i) denI[i] = dot(qI + i * d, z, d);
    }
    if (n.causal) {
      const T *kI = k + a * d, *vI = v + a * dv;
      chunk_scores(P, qI, kI, c, d);
      gemm(c, dv, c, T(1), as_is(P, c), as_is(vI, dv), T(1), OI, dv);
      for (int64_t i = 0; i < c; ++i)
        for (int64_t j = 0; j <= i; ++j) denI[i] += P[i * c + j];
      if (a + c < n.tq) add_key_sums(S, z, kI, vI, c, d, dv);  // the last chunk's sums are read by no one
    }
    for (int64_t i = 0; i < c; ++i)
      for (int64_t x = 0; x < dv; ++x) OI[i * dv + x] /= denI[i];
  }
}

// ---- VJP ----
// With G = ∂L/∂O (docs/derivations.md §4.2):
//   den_i = q_iᵀz_i,   Gn_i = G_i/den_i,   γ_i = −⟨G_i, O_i⟩/den_i
//   dq_i = S_i Gn_i + γ_i z_i
//   R_j = Σ_{i≥j} q_i Gn_iᵀ (d×dv),  r_j = Σ_{i≥j} γ_i q_i         (non-causal: R = qᵀGn, r = qᵀγ for every j)
//   dk_j = R_j v_j + r_j,   dv_j = R_jᵀ k_j
//   dQ = dq ⊙ φ′(Q),   dK = dk ⊙ φ′(K)
// Expanded, dq_i = Σ_{j≤i} k_j (Gn_i·v_j + γ_i), dk_j = Σ_{i≥j} q_i (Gn_i·v_j + γ_i), dv_j = Σ_{i≥j} (q_i·k_j) Gn_i.
// Streaming: dq needs the prefix sums S, z (a forward sweep over chunks), dk and dv the suffix sums R, r (a
// reverse sweep). With W = tril(Gn_I v_Iᵀ + γ_I 1ᵀ) and P = tril(q_I k_Iᵀ), the in-chunk pairs give
//   dq_I = Gn_I Sᵀ + γ_I zᵀ + W k_I                      (S, z over the rows before I)
//   dk_I = v_I Rᵀ + 1 rᵀ + Wᵀ q_I,   dv_I = k_I R + Pᵀ Gn_I    (R, r over the rows after I)
// The node keeps q, k, V, O and den: O(T·d) per slice, never a T×T matrix or the T sums S_i.

// Gn (rows×dv) and γ (rows) of rows [a, a + rows).
template <class T>
void normalized_cotangent(T* Gn, T* gamma, const T* G, const T* O, const T* den, int64_t rows, int64_t dv) {
  for (int64_t i = 0; i < rows; ++i) {
    const T inv = 1 / den[i];
    gamma[i] = -dot(G + i * dv, O + i * dv, dv) * inv;
    for (int64_t x = 0; x < dv; ++x) Gn[i * dv + x] = G[i * dv + x] * inv;
  }
}

// W = tril(Gn_I v_Iᵀ + γ_I 1ᵀ) (c×c).
template <class T>
void chunk_cotangent_scores(T* W, const T* Gn, const T* gamma, const T* vI, int64_t c, int64_t dv) {
  gemm(c, c, dv, T(1), as_is(Gn, dv), transposed(vI, dv), T(0), W, c);
  for (int64_t i = 0; i < c; ++i)
    for (int64_t j = 0; j <= i; ++j) W[i * c + j] += gamma[i];
  keep_lower(W, c);
}

// g += dx ⊙ φ′ over rows×d, with φ′ read off the saved p = φ(X).
template <class T>
void add_through_phi(T* g, const T* dx, const T* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] += dx[i] * phi_prime_of_phi(p[i]);
}

// gq += dQ, gk += dK, gv += dV for one slice; a null gradient is not computed.
template <class T>
void linear_attention_vjp(T* gq, T* gk, T* gv, const T* G, const T* q, const T* k, const T* v, const T* O, const T* den,
                          const HeadDims& n, Workspace<T>& w) {
  const int64_t d = n.d, dv = n.dv;
  T *S = w.S, *z = w.z, *P = w.P, *W = w.W;
  T *Gn = w.rows_dv, *gamma = w.col, *dx = w.rows_d;
  // Gn, γ and W of a chunk are the same in both sweeps: the chunk whose values the workspace holds is not redone.
  int64_t cotangent_chunk = -1, w_chunk = -1;

  if (gq) {  // forward sweep: dq
    zero(w.S, n.d * n.dv);
    zero(w.z, n.d);
    if (!n.causal) add_key_sums(S, z, k, v, n.tk, d, dv);
    for (int64_t a = 0; a < n.tq; a += kChunk) {
      const int64_t c = std::min(kChunk, n.tq - a);
      normalized_cotangent(Gn, gamma, G + a * dv, O + a * dv, den + a, c, dv);
      cotangent_chunk = a;
      if (n.causal && a == 0) {  // S = 0, z = 0
        std::fill(dx, dx + c * d, T(0));
      } else {
        gemm(c, d, dv, T(1), as_is(Gn, dv), transposed(S, dv), T(0), dx, d);
        for (int64_t i = 0; i < c; ++i)
          for (int64_t x = 0; x < d; ++x) dx[i * d + x] += gamma[i] * z[x];
      }
      if (n.causal) {
        const T *kI = k + a * d, *vI = v + a * dv;
        chunk_cotangent_scores(W, Gn, gamma, vI, c, dv);
        w_chunk = a;
        gemm(c, d, c, T(1), as_is(W, c), as_is(kI, d), T(1), dx, d);
        if (a + c < n.tq) add_key_sums(S, z, kI, vI, c, d, dv);
      }
      add_through_phi(gq + a * d, dx, q + a * d, c * d);
    }
  }

  if (!gk && !gv) return;
  // reverse sweep: dk, dv. S and z hold R and r.
  T *R = S, *r = z;
  zero(w.S, n.d * n.dv);
  zero(w.z, n.d);
  auto add_query_sums = [&](int64_t a, int64_t c) {  // R += q_Iᵀ Gn_I, r += q_Iᵀ γ_I
    const T* qI = q + a * d;
    gemm(d, dv, c, T(1), transposed(qI, d), as_is(Gn, dv), T(1), R, dv);
    for (int64_t i = 0; i < c; ++i)
      for (int64_t x = 0; x < d; ++x) r[x] += gamma[i] * qI[i * d + x];
  };
  if (!n.causal)
    for (int64_t a = 0; a < n.tq; a += kChunk) {
      const int64_t c = std::min(kChunk, n.tq - a);
      normalized_cotangent(Gn, gamma, G + a * dv, O + a * dv, den + a, c, dv);
      cotangent_chunk = a;
      add_query_sums(a, c);
    }
  const int64_t chunks = (n.tk + kChunk - 1) / kChunk;
  for (int64_t ci = chunks - 1; ci >= 0; --ci) {
    const int64_t a = ci * kChunk, c = std::min(kChunk, n.tk - a);
    const T *kI = k + a * d, *vI = v + a * dv;
    const T* qI = n.causal ? q + a * d : nullptr;  // causal: query and key chunks coincide (T = Tk)
    if (n.causal && cotangent_chunk != a) {
      normalized_cotangent(Gn, gamma, G + a * dv, O + a * dv, den + a, c, dv);
      cotangent_chunk = a;
    }
    const bool empty_state = n.causal && ci == chunks - 1;  // R = 0, r = 0 after the last chunk
    if (gk) {
      if (empty_state) {
        std::fill(dx, dx + c * d, T(0));
      } else {
        gemm(c, d, dv, T(1), as_is(vI, dv), transposed(R, dv), T(0), dx, d);
        add_rows(dx, r, c, d);
      }
      if (n.causal) {
        if (w_chunk != a) chunk_cotangent_scores(W, Gn, gamma, vI, c, dv);
        w_chunk = a;
        gemm(c, d, c, T(1), transposed(W, c), as_is(qI, d), T(1), dx, d);
      }
      add_through_phi(gk + a * d, dx, kI, c * d);
    }
    if (gv) {
      if (!empty_state) gemm(c, dv, d, T(1), as_is(kI, d), as_is(R, dv), T(1), gv + a * dv, dv);
      if (n.causal) {
        chunk_scores(P, qI, kI, c, d);
        gemm(c, dv, c, T(1), transposed(P, c), as_is(Gn, dv), T(1), gv + a * dv, dv);
      }
    }
    if (n.causal && ci > 0) add_query_sums(a, c);  // the first chunk's sums are read by no one
  }
}

// ---- JVP ----
// With q̇ = φ′(Q) ⊙ Q̇, k̇ = φ′(K) ⊙ K̇ and O_i = num_i/den_i, num_i = q_iᵀS_i, den_i = q_iᵀz_i, the product
// rule through S, z and the quotient rule give
//   Ṡ_i = Σ_{j≤i} (k̇_j v_jᵀ + k_j v̇_jᵀ),   ż_i = Σ_{j≤i} k̇_j
//   nuṁ_i = q̇_iᵀS_i + q_iᵀṠ_i,   dėn_i = q̇_iᵀz_i + q_iᵀż_i,   Ȯ_i = (nuṁ_i − O_i dėn_i)/den_i.
// Streamed like the forward, carrying Ṡ, ż next to S, z; with Ṗ = tril(q̇_I k_Iᵀ + q_I k̇_Iᵀ),
//   nuṁ_I = q̇_I S + q_I Ṡ + Ṗ v_I + P v̇_I,   dėn_I = q̇_I z + q_I ż + Ṗ1.

// x_dot = φ′ ⊙ X_dot over n elements, with φ′ read off the saved p = φ(X).
template <class T>
void feature_tangent(T* x_dot, const T* X_dot, const T* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x_dot[i] = X_dot[i] * phi_prime_of_phi(p[i]);
}

// O_dot += Ȯ for one slice; Q_dot, K_dot, V_dot are the raw input tangents, null where zero.
template <class T>
void linear_attention_jvp(T* O_dot, const T* Q_dot, const T* K_dot, const T* V_dot, const T* q, const T* k, const T* v,
                          const T* O, const T* den, const HeadDims& n, Workspace<T>& w) {
  const int64_t d = n.d, dv = n.dv;
  T *S = w.S, *z = w.z, *S_dot = w.S_dot, *z_dot = w.z_dot;
  T *P = w.P, *P_dot = w.W, *q_dot = w.rows_d, *k_dot = w.rows_d2;
  T *num_dot = w.rows_dv, *den_dot = w.col;
  zero(w.S, n.d * n.dv);
  zero(w.z, n.d);
  zero(w.S_dot, n.d * n.dv);
  zero(w.z_dot, n.d);
  // k_dot = k̇_J for rows [a, a + c) of the keys.
  auto key_tangent = [&](int64_t a, int64_t c) { feature_tangent(k_dot, K_dot + a * d, k + a * d, c * d); };
  // S, z, Ṡ, ż += the sums over key rows [a, a + c) (k_dot already holds k̇_J if K_dot is given).
  auto add_all_key_sums = [&](int64_t a, int64_t c) {
    const T *kJ = k + a * d, *vJ = v + a * dv;
    add_key_sums(S, z, kJ, vJ, c, d, dv);
    if (K_dot) add_key_sums(S_dot, z_dot, k_dot, vJ, c, d, dv);
    if (V_dot) gemm(d, dv, c, T(1), transposed(kJ, d), as_is(V_dot + a * dv, dv), T(1), S_dot, dv);
  };
  if (!n.causal)
    for (int64_t a = 0; a < n.tk; a += kChunk) {
      const int64_t c = std::min(kChunk, n.tk - a);
      if (K_dot) key_tangent(a, c);
      add_all_key_sums(a, c);
    }
  for (int64_t a = 0; a < n.tq; a += kChunk) {
    const int64_t c = std::min(kChunk, n.tq - a);
    const T* qI = q + a * d;
    gemm(c, dv, d, T(1), as_is(qI, d), as_is(S_dot, dv), T(0), num_dot, dv);
    for (int64_t i = 0; i < c; ++i) den_dot[i] = dot(qI + i * d, z_dot, d);
    if (Q_dot) {
      feature_tangent(q_dot, Q_dot + a * d, qI, c * d);
      gemm(c, dv, d, T(1), as_is(q_dot, d), as_is(S, dv), T(1), num_dot, dv);
      for (int64_t i = 0; i < c; ++i) den_dot[i] += dot(q_dot + i * d, z, d);
    }
    if (n.causal) {
      const T *kI = k + a * d, *vI = v + a * dv;
      if (K_dot) key_tangent(a, c);
      if (Q_dot || K_dot) {
        if (Q_dot) gemm(c, c, d, T(1), as_is(q_dot, d), transposed(kI, d), T(0), P_dot, c);
        if (K_dot) gemm(c, c, d, T(1), as_is(qI, d), transposed(k_dot, d), T(Q_dot ? 1 : 0), P_dot, c);
        keep_lower(P_dot, c);
        gemm(c, dv, c, T(1), as_is(P_dot, c), as_is(vI, dv), T(1), num_dot, dv);
        for (int64_t i = 0; i < c; ++i)
          for (int64_t j = 0; j <= i; ++j) den_dot[i] += P_dot[i * c + j];
      }
      if (V_dot) {
        chunk_scores(P, qI, kI, c, d);
        gemm(c, dv, c, T(1), as_is(P, c), as_is(V_dot + a * dv, dv), T(1), num_dot, dv);
      }
      add_all_key_sums(a, c);
    }
    const T* OI = O + a * dv;
    T* OI_dot = O_dot + a * dv;
    for (int64_t i = 0; i < c; ++i) {
      const T inv = 1 / den[a + i];
      for (int64_t x = 0; x < dv; ++x) OI_dot[i * dv + x] += (num_dot[i * dv + x] - OI[i * dv + x] * den_dot[i]) * inv;
    }
  }
}

// Second order (Tape::hvp), one slice, dense: the tangent of the VJP at a fixed G. In scores form, with
// w_ij = q_iᵀk_j (j visible to i), den_i = Σ_j w_ij, Gn_i = G_i/den_i, γ_i = ⟨G_i, O_i⟩/den_i, the VJP is
//   dw_ij = ⟨Gn_i, v_j⟩ − γ_i,  dq_i = Σ_j dw_ij k_j,  dk_j = Σ_i dw_ij q_i,  dv_j = Σ_i w_ij Gn_i,
//   dQ = φ′(Q) ⊙ dq,  dK = φ′(K) ⊙ dk.
// Its tangent, with q̇ = φ′(Q) ⊙ Q̇, k̇ = φ′(K) ⊙ K̇, ẇ_ij = q̇_iᵀk_j + q_iᵀk̇_j, ḋen_i = Σ_j ẇ_ij and Ȯ_i from the JVP:
//   Ġn_i = −Gn_i·ḋen_i/den_i,  γ̇_i = (⟨G_i, Ȯ_i⟩ − γ_i·ḋen_i)/den_i,  ḋw_ij = ⟨Ġn_i, v_j⟩ + ⟨Gn_i, v̇_j⟩ − γ̇_i,
//   ḋq_i = Σ_j (ḋw_ij k_j + dw_ij k̇_j),  ḋk_j = Σ_i (ḋw_ij q_i + dw_ij q̇_i),  ḋv_j = Σ_i (ẇ_ij Gn_i + w_ij Ġn_i),
//   ḋQ = φ′(Q) ⊙ ḋq + φ″(Q) ⊙ Q̇ ⊙ dq  (likewise K),   φ″(x) = 0 (x > 0), eˣ (x < 0): read off φ as φ′ is.
// In matrix form over the slice, with the mask M (j ≤ i when causal, else all ones), W = M ⊙ qkᵀ and the row
// scalings a_i = −ḋen_i/den_i (so Ġn = diag(a)·Gn):
//   Ẇ = M ⊙ (q̇kᵀ + qk̇ᵀ),  ḋen = Ẇ1,  Ȯ = diag(1/den)·(ẆV + WV̇ − diag(ḋen)·O),
//   DW = M ⊙ (GnVᵀ − γ1ᵀ),  DẆ = M ⊙ (diag(a)·GnVᵀ + GnV̇ᵀ − γ̇1ᵀ),
//   ḋq = DẆ·k + DW·k̇,  ḋk = DẆᵀ·q + DWᵀ·q̇,  ḋv = Ẇᵀ·Gn + Wᵀ·Ġn,
// each product a gemm over the dense (T, Tk) slice; dq = DW·k and dk = DWᵀ·q only where a φ″ term needs them.
// Its arrays, for one range of slices: a chunk of the tape's scratch, zeroed when the range starts
// (second_order_need lists the same arrays).
ScratchNeed second_order_need(DType dtype, const HeadDims& n, int64_t chunks) {
  const int64_t tq = n.tq, tk = n.tk, d = n.d, dv = n.dv;
  return scratch_need(
      dtype,
      {tq * d, tk * d, tq * tk, tq * tk, tq * tk, tq * tk, tq * dv, tq * dv, tq * dv, tq * d, tk * d, tq, tq, tq},
      chunks);
}
template <class T>
struct SecondOrderWorkspace {
  SecondOrderWorkspace(ScratchChunk s, const HeadDims& n)
      : qd(s.zeroed<T>(n.tq * n.d)),
        kd(s.zeroed<T>(n.tk * n.d)),
        w(s.zeroed<T>(n.tq * n.tk)),
        w_dot(s.zeroed<T>(n.tq * n.tk)),
        dw(s.zeroed<T>(n.tq * n.tk)),
        dw_dot(s.zeroed<T>(n.tq * n.tk)),
        gn(s.zeroed<T>(n.tq * n.dv)),
        gn_dot(s.zeroed<T>(n.tq * n.dv)),
        o_dot(s.zeroed<T>(n.tq * n.dv)),
        rows_q(s.zeroed<T>(n.tq * n.d)),
        rows_k(s.zeroed<T>(n.tk * n.d)),
        den_dot(s.zeroed<T>(n.tq)),
        gamma(s.zeroed<T>(n.tq)),
        gamma_dot(s.zeroed<T>(n.tq)) {}
  T *qd, *kd, *w, *w_dot, *dw, *dw_dot, *gn, *gn_dot, *o_dot, *rows_q, *rows_k, *den_dot, *gamma, *gamma_dot;
};

// Zeroes the entries of a (tq, tk) matrix that the causal mask hides (j > i).
template <class T>
void apply_mask(T* m, const HeadDims& n) {
  if (!n.causal) return;
  for (int64_t i = 0; i < n.tq; ++i) std::fill(m + i * n.tk + std::min(i + 1, n.tk), m + (i + 1) * n.tk, T(0));
}

// out += φ″ ⊙ Ẋ ⊙ dx over n elements, φ″ read off the saved p = φ(X): eˣ = p where x < 0 (p < 1), 0 where x > 0.
template <class T>
void add_phi_curvature(T* out, const T* X_dot, const T* dx, const T* p, int64_t n) {
  for (int64_t e = 0; e < n; ++e)
    if (p[e] < 1) out[e] += p[e] * X_dot[e] * dx[e];
}

template <class T>
void linear_attention_second_order(T* out_q, T* out_k, T* out_v, const T* G, const T* Q_dot, const T* K_dot,
                                   const T* V_dot, const T* q, const T* k, const T* v, const T* O, const T* den,
                                   const HeadDims& n, SecondOrderWorkspace<T>& ws) {
  const int64_t tq = n.tq, tk = n.tk, d = n.d, dv = n.dv;
  const T* qd = nullptr;  // q̇ = φ′(Q) ⊙ Q̇, null without a tangent (likewise k̇)
  const T* kd = nullptr;
  if (Q_dot) feature_tangent(ws.qd, Q_dot, q, tq * d), qd = ws.qd;
  if (K_dot) feature_tangent(ws.kd, K_dot, k, tk * d), kd = ws.kd;
  T *w = ws.w, *w_dot = ws.w_dot, *dw = ws.dw, *dw_dot = ws.dw_dot;
  T *gn = ws.gn, *gn_dot = ws.gn_dot, *o_dot = ws.o_dot;
  gemm(tq, tk, d, T(1), as_is(q, d), transposed(k, d), T(0), w, tk);
  apply_mask(w, n);
  std::fill(w_dot, w_dot + tq * tk, T(0));
  if (qd) gemm(tq, tk, d, T(1), as_is(qd, d), transposed(k, d), T(1), w_dot, tk);
  if (kd) gemm(tq, tk, d, T(1), as_is(q, d), transposed(kd, d), T(1), w_dot, tk);
  apply_mask(w_dot, n);
  gemm(tq, dv, tk, T(1), as_is(w_dot, tk), as_is(v, dv), T(0), o_dot, dv);
  if (V_dot) gemm(tq, dv, tk, T(1), as_is(w, tk), as_is(V_dot, dv), T(1), o_dot, dv);
  for (int64_t i = 0; i < tq; ++i) {
    const size_t r = static_cast<size_t>(i);
    const T inv = 1 / den[i];
    T den_dot = 0;
    for (int64_t j = 0; j < tk; ++j) den_dot += w_dot[i * tk + j];
    T gamma = 0, g_odot = 0;
    for (int64_t c = 0; c < dv; ++c) {
      const int64_t e = i * dv + c;
      o_dot[e] = (o_dot[e] - O[e] * den_dot) * inv;
      gamma += G[e] * O[e];
      g_odot += G[e] * o_dot[e];
      gn[e] = G[e] * inv;
      gn_dot[e] = -gn[e] * den_dot * inv;
    }
    ws.den_dot[r] = den_dot;
    ws.gamma[r] = gamma * inv;
    ws.gamma_dot[r] = (g_odot - ws.gamma[r] * den_dot) * inv;
  }
  // DW and DẆ from GnVᵀ (and GnV̇ᵀ).
  gemm(tq, tk, dv, T(1), as_is(gn, dv), transposed(v, dv), T(0), dw, tk);
  if (V_dot) gemm(tq, tk, dv, T(1), as_is(gn, dv), transposed(V_dot, dv), T(0), dw_dot, tk);
  for (int64_t i = 0; i < tq; ++i) {
    const size_t r = static_cast<size_t>(i);
    const T a = -ws.den_dot[r] / den[i];
    for (int64_t j = 0; j < tk; ++j) {
      const int64_t e = i * tk + j;
      dw_dot[e] = (V_dot ? dw_dot[e] : T(0)) + a * dw[e] - ws.gamma_dot[r];
      dw[e] -= ws.gamma[r];
    }
  }
  apply_mask(dw, n);
  apply_mask(dw_dot, n);
  // One side of the features: out += φ′ ⊙ (DẆ·y + DW·ẏ) + φ″ ⊙ Ẋ ⊙ (DW·y), with (y, ẏ) = (k, k̇) and the score
  // matrices as they are for Q, (q, q̇) and transposed for K; `rows` holds ḋq (ḋk), then dq (dk).
  auto close_side = [&](T* out, const T* X_dot, const T* p, const T* y, const T* y_dot, bool keys, T* rows) {
    const int64_t m = keys ? tk : tq, inner = keys ? tq : tk;
    auto op = [&](const T* a) { return keys ? transposed(a, tk) : as_is(a, tk); };
    gemm(m, d, inner, T(1), op(dw_dot), as_is(y, d), T(0), rows, d);
    if (y_dot) gemm(m, d, inner, T(1), op(dw), as_is(y_dot, d), T(1), rows, d);
    add_through_phi(out, rows, p, m * d);
    if (!X_dot) return;
    gemm(m, d, inner, T(1), op(dw), as_is(y, d), T(0), rows, d);
    add_phi_curvature(out, X_dot, rows, p, m * d);
  };
  if (out_q) close_side(out_q, Q_dot, q, k, kd, false, ws.rows_q);
  if (out_k) close_side(out_k, K_dot, k, q, qd, true, ws.rows_k);
  if (out_v) {
    gemm(tk, dv, tq, T(1), transposed(w_dot, tk), as_is(gn, dv), T(1), out_v, dv);
    gemm(tk, dv, tq, T(1), transposed(w, tk), as_is(gn_dot, dv), T(1), out_v, dv);
  }
}

}  // namespace

Var linear_attention(Var q, Var k, Var v, bool causal) {
  Tape& tape = tape_of(kOp, {q, k, v});
  const AttentionDims dims = attention_dims(kOp, q, k, v, {.scale = 0, .causal = causal});
  const HeadDims n = head_dims(dims);
  const DType dtype = q.dtype();
  const Tensor Qv = q.value(), Kv = k.value(), Vv = v.value();
  // Saved for backward and forward mode: φ(Q), φ(K), V (the input's own value), O, den.
  Tensor phi_q = tape.empty(dtype, q.shape(), "φ(Q)"), phi_k = tape.empty(dtype, k.shape(), "φ(K)");
  Tensor out = tape.empty(dtype, {q.shape()[0], q.shape()[1], n.tq, n.dv});
  Tensor den = tape.empty(dtype, {q.shape()[0], q.shape()[1], n.tq}, "den = q_iᵀz_i");
  const int64_t grain = slice_grain(n);
  reserve_scratch(tape, workspace_need(dtype, n, parallel_chunks(n.heads, grain)).bytes(),
                  second_order_need(dtype, n, parallel_chunks(n.heads, grain)).bytes());
  Tape* tp = &tape;
  // The slices (b, h) run on the engine's threads, each range with its own workspace.
  const ScratchChunks forward_chunks =
      tape.scratch().take(workspace_need(dtype, n, parallel_chunks(n.heads, grain)))[0];
  dispatch_float(kOp, dtype, [&]<class T>(T) {
    parallel_for(n.heads, grain, [&](int64_t begin, int64_t end, int64_t chunk) {
      Workspace<T> w(forward_chunks.chunk(chunk), n);
      for (int64_t s = begin; s < end; ++s) {
        const SliceOffsets at(dims, s);
        const T *Q = Qv.data<T>() + at.q, *K = Kv.data<T>() + at.k;
        T *pq = phi_q.data<T>() + at.q, *pk = phi_k.data<T>() + at.k;
        for (int64_t i = 0; i < n.tq * n.d; ++i) pq[i] = phi(Q[i]);
        for (int64_t i = 0; i < n.tk * n.d; ++i) pk[i] = phi(K[i]);
        linear_attention_forward(out.data<T>() + at.o, den.data<T>() + at.rows, pq, pk, Vv.data<T>() + at.v, n, w);
      }
    });
  });
  return tape.record(
      kOp, {q, k, v}, out,
      [=](const Tensor& g, std::span<Tensor> gin) {
        const ScratchChunks w_chunks = tp->scratch().take(workspace_need(dtype, n, parallel_chunks(n.heads, grain)))[0];
        dispatch_float(kOp, g.dtype(), [&]<class T>(T) {
          parallel_for(n.heads, grain, [&](int64_t begin, int64_t end, int64_t chunk) {
            Workspace<T> w(w_chunks.chunk(chunk), n);
            for (int64_t s = begin; s < end; ++s) {
              const SliceOffsets at(dims, s);
              linear_attention_vjp(
                  offset_or_null(data_or_null<T>(gin[0]), at.q), offset_or_null(data_or_null<T>(gin[1]), at.k),
                  offset_or_null(data_or_null<T>(gin[2]), at.v), g.data<T>() + at.o, phi_q.data<T>() + at.q,
                  phi_k.data<T>() + at.k, Vv.data<T>() + at.v, out.data<T>() + at.o, den.data<T>() + at.rows, n, w);
            }
          });
        });
      },
      [=](std::span<const Tensor> tin, Tensor& tout) {
        const ScratchChunks w_chunks = tp->scratch().take(workspace_need(dtype, n, parallel_chunks(n.heads, grain)))[0];
        dispatch_float(kOp, tout.dtype(), [&]<class T>(T) {
          parallel_for(n.heads, grain, [&](int64_t begin, int64_t end, int64_t chunk) {
            Workspace<T> w(w_chunks.chunk(chunk), n);
            for (int64_t s = begin; s < end; ++s) {
              const SliceOffsets at(dims, s);
              linear_attention_jvp(tout.data<T>() + at.o, offset_or_null(data_or_null<T>(tin[0]), at.q),
                                   offset_or_null(data_or_null<T>(tin[1]), at.k),
                                   offset_or_null(data_or_null<T>(tin[2]), at.v), phi_q.data<T>() + at.q,
                                   phi_k.data<T>() + at.k, Vv.data<T>() + at.v, out.data<T>() + at.o,
                                   den.data<T>() + at.rows, n, w);
            }
          });
        });
      },
      [=](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
        const ScratchChunks ws_chunks =
            tp->scratch().take(second_order_need(dtype, n, parallel_chunks(n.heads, grain)))[0];
        dispatch_float(kOp, g.dtype(), [&]<class T>(T) {
          parallel_for(n.heads, grain, [&](int64_t begin, int64_t end, int64_t chunk) {
            SecondOrderWorkspace<T> ws(ws_chunks.chunk(chunk), n);
            for (int64_t s = begin; s < end; ++s) {
              const SliceOffsets at(dims, s);
              linear_attention_second_order(
                  offset_or_null(data_or_null<T>(gin_dot[0]), at.q), offset_or_null(data_or_null<T>(gin_dot[1]), at.k),
                  offset_or_null(data_or_null<T>(gin_dot[2]), at.v), g.data<T>() + at.o,
                  offset_or_null(data_or_null<T>(tin[0]), at.q), offset_or_null(data_or_null<T>(tin[1]), at.k),
                  offset_or_null(data_or_null<T>(tin[2]), at.v), phi_q.data<T>() + at.q, phi_k.data<T>() + at.k,
                  Vv.data<T>() + at.v, out.data<T>() + at.o, den.data<T>() + at.rows, n, ws);
            }
          });
        });
      });
}

std::vector<OpSheet> linear_attention_ops() {
  OpSheets r;
  auto build = [](bool causal) {
    return [causal](Tape&, std::span<const Var> x) { return linear_attention(x[0], x[1], x[2], causal); };
  };
  // φ has a kink in its second derivative at 0: Q and K stay away from it.
  auto inputs = [](int64_t B, int64_t h, int64_t T, int64_t Tk, int64_t d, int64_t dv) {
    return std::vector<InputSpec>{
        {"q", {B, h, T, d}, Fill::away_from_zero}, {"k", {B, h, Tk, d}, Fill::away_from_zero}, {"v", {B, h, Tk, dv}}};
  };
  r.add({.name = kOp,
         .family = "attention/linear",
         .forward = "O_i = φ(q_i)ᵀS_i / φ(q_i)ᵀz_i, S_i = Σ_j φ(k_j)v_jᵀ, z_i = Σ_j φ(k_j) (j ≤ i when causal), "
                    "φ = elu + 1",
         .vjp = "O_i = q_iᵀS_i/q_iᵀz_i, q = φ(Q), k = φ(K); dq_i = S_iGn_i + γ_iz_i, dk_j = R_jv_j + r_j, "
                "dv_j = R_jᵀk_j",
         .jvp = "Ȯ_i = (q̇_iᵀS_i + q_iᵀṠ_i − O_i(q̇_iᵀz_i + q_iᵀż_i))/den_i",
         .second_order = "w_ij = q_iᵀk_j, Gn_i = G_i/den_i, γ_i = ⟨G_i, O_i⟩/den_i: Ġn_i = −Gn_i·ḋen_i/den_i, "
                         "γ̇_i = (⟨G_i, Ȯ_i⟩ − γ_i·ḋen_i)/den_i, ḋw_ij = ⟨Ġn_i, v_j⟩ + ⟨Gn_i, v̇_j⟩ − γ̇_i; "
                         "ḋQ = φ′(Q) ⊙ Σ_j(ḋw_ij k_j + dw_ij k̇_j) + φ″(Q) ⊙ Q̇ ⊙ dq, likewise K; "
                         "ḋv_j = Σ_i (ẇ_ij Gn_i + w_ij Ġn_i)",
         .derivation = "4.1, 4.2",
         .second_order_derivation = "6.11",
         .formulas_at = {{"forward", "ops/attention/linear.cpp", "linear_attention_forward"},
                         {"VJP", "ops/attention/linear.cpp", "linear_attention_vjp"},
                         {"JVP", "ops/attention/linear.cpp", "linear_attention_jvp"},
                         {"second order", "ops/attention/linear.cpp", "linear_attention_second_order"}},
         // Its gradcheck cases, each checked to first and second order by the suite:
         .cases = {{"non-causal, T=7 d=5 dv=3", inputs(2, 2, 7, 7, 5, 3), build(false)},
                   {"causal, T=7 d=5 dv=3", inputs(2, 2, 7, 7, 5, 3), build(true)},
                   {"non-causal, T=6 Tk=9", inputs(1, 2, 6, 9, 4, 3), build(false)},
                   // Causal with T = 1 is O = V whatever Q and K: their Jacobians are zero, and the adjoint check
                   // cannot compare two rounding residues. Q and K enter as constants;
                   // tests/attention_linear_test.cpp checks dQ = dK = 0.
                   {"causal, T=1 (O = V)",
                    {{"v", {2, 1, 1, 2}}},
                    [](Tape& tape, std::span<const Var> x) {
                      const Tensor qk = Tensor::from<double>({2, 1, 1, 3}, {0.5, -1.2, 0.3, 1.1, -0.4, 0.8});
                      Var q = tape.constant(qk.to(x[0].dtype())), k = tape.constant(qk.to(x[0].dtype()));
                      return linear_attention(q, k, x[0], true);
                    }},
                   {"non-causal, T=1 Tk=4", inputs(1, 2, 1, 4, 3, 2), build(false)},
                   {"causal, T=70 (two chunks)", inputs(1, 1, 70, 70, 3, 2), build(true)},
                   {"causal, T=140 (three chunks)", inputs(1, 1, 140, 140, 3, 2), build(true)}},
         // A query whose φ(q)ᵀz is 0 (φ(−∞) = 0: every feature of q, or of each key it sees, at −∞) is 0/0.
         .undefined_edges = {"masked_rows=nan"},
         .inputs = 3,
         .call = [](std::span<const Var> x,
                    const OpArgs& a) { return linear_attention(x[0], x[1], x[2], a.flag("causal", false)); },
         // q = φ(Q), k = φ(K) with φ = elu + 1; O = q(kᵀV) / (q·z) row by row, z = kᵀ1: the first case's map
         // (non-causal).
         .unfused =
             [](Tape& tape, std::span<const Var> x) {
               const Var one = tape.constant(Tensor::full(x[0].dtype(), {1}, 1.0));
               const Var q = add(elu(x[0]), one), k = add(elu(x[1]), one);
               const Var numerator = matmul(q, matmul(transpose(k), x[2]));     // (B, h, T, dv)
               const Var denominator = matmul(q, sum(transpose(k), -1, true));  // (B, h, T, 1)
               return div(numerator, denominator);
             }});
  return r.ops;
}

}  // namespace tapegrad
