// β-attention, as one node (the β-attention post; docs/derivations.md §1.4): softmax replaced by the row map
// β(x) = x / (1 + ‖x‖).
//
// Per (b, h) slice, tokens as rows: Q (T, d), K (Tk, d), V (Tk, dv), G = ∂L/∂O (T, dv), s the scale:
//   P  = (s·QKᵀ) ⊙ M           (T, Tk)   M_ij = 1 where key j is visible to query i, 0 where masked (causal: j > i)
//   Bβ = β(P) row-wise          (T, Tk)   Bβ_i = c_i·p_i,  r_i = ‖p_i‖,  c_i = 1/(1 + r_i)
//   O  = Bβ·V                   (T, dv)
// Masked scores are 0, not −∞ (β(−∞) is NaN): zero-masking equals β of the visible prefix padded with zeros.
// A row whose scores are all 0 gives Bβ_i = 0 and O_i = 0. The node keeps Bβ and r.
//
// The derivative of β (docs/derivations.md §1.2), with x ≠ 0, r = ‖x‖, c = 1/(1+r):
//   dβ(x)·h = c·h − c²(⟨x, h⟩/r)·x  =  c·h − (⟨β(x), h⟩/r)·β(x)      (x = β(x)/c),   dβ(0)·h = h
// The Jacobian c·I − c²xxᵀ/r is symmetric, so the VJP applies the same map to the cotangent.
// Where this departs from the β-attention post (docs/derivations.md §1.3): its homogeneity property
// dβ(x)·h = f(x, h)·β(x) with f = ⟨x, h⟩/(r²(1 + r)) does not hold for β. Splitting h into its parts along and
// across x gives
//   dβ(x)·h = f(x, h)·β(x) + (I − xxᵀ/r²)·h/(1 + r),
// so the claimed form drops the second term (it is right only for h ∥ x; for h ⟂ x the true derivative is
// h/(1 + r) and the claim gives 0). Hence the post's "simpler total derivative"
// dAtt_β·Θ̃ = (f̃ ⊗ 1_nᵀ) ⊙ Att_β(Θ) + Att_β(Q, K, Ṽ) (where 1_nᵀ would also have to be 1_dᵀ) is wrong, and the
// full row map below is needed.
//
// Work, as in attention.cpp: the slices (b, h) run on the engine's threads, one slice per thread at a time, and
// the queries go in blocks I = [i0, i1) of at most kQueryBlock rows; under the causal mask block I sees keys
// j < i1 only (Bβ and dP are 0 beyond), so its products stop at column i1.
#include <algorithm>
#include <cmath>

#include "engine/blas.hpp"
#include "engine/gradcheck/registry.hpp"
#include "engine/parallel.hpp"
#include "ops/attention.hpp"
#include "ops/attention_shapes.hpp"
#include "ops/fast_math.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

// p[0..n) ← β(p[0..visible)) padded with zeros; returns r = ‖p[0..visible)‖ (the masked entries are 0).
template <class T>
T beta_row_forward(T* p, int64_t visible, int64_t n) {
  std::fill(p + visible, p + n, T(0));
  const T r = std::sqrt(lane_dot(p, p, visible));
  const T c = 1 / (1 + r);
  for (int64_t j = 0; j < visible; ++j) p[j] *= c;
  return r;
}

// u[0..visible) ← dβ(p)·u = c·u − (⟨β, u⟩/r)·β with β = β(p) the row's output, r = ‖p‖ (second term 0 when
// r = 0, where dβ(0) = I); u[visible..n) ← 0, the mask on dP and Ṗ. In place: the JVP on ṗ and, the Jacobian
// being symmetric, the VJP on dBβ.
template <class T>
void beta_row_derivative(T* u, const T* beta, T r, int64_t visible, int64_t n) {
  const T c = 1 / (1 + r);
  const T along = r > 0 ? lane_dot(beta, u, visible) / r : T(0);
  for (int64_t j = 0; j < visible; ++j) u[j] = c * u[j] - along * beta[j];
  std::fill(u + visible, u + n, T(0));
}

// Forward of one slice, block by block: P_I = s·Q_I Kᵀ (gemm), masked to 0; Bβ_I = β(P_I) row-wise;
// O_I = Bβ_I·V (gemm).       q (T,d), k (Tk,d), v (Tk,dv) → bb (T,Tk), r (T), o (T,dv) of the slice
template <class T>
void beta_attention_forward(const AttentionDims& D, const T* q, const T* k, const T* v, T* bb, T* r, T* o) {
  const T s = static_cast<T>(D.scale);
  for_each_query_block(D, [&](int64_t i0, int64_t rows, int64_t key_end) {
    T* b_blk = bb + i0 * D.Tk;
    gemm(false, true, rows, key_end, D.d, s, q + i0 * D.d, D.d, k, D.d, T(0), b_blk, D.Tk);
    for (int64_t i = 0; i < rows; ++i) r[i0 + i] = beta_row_forward(b_blk + i * D.Tk, D.visible(i0 + i), D.Tk);
    gemm(false, false, rows, D.dv, key_end, T(1), b_blk, D.Tk, v, D.dv, T(0), o + i0 * D.dv, D.dv);
  });
}

// VJP (docs/derivations.md §1.4):
//   dV += BβᵀG                                                    (Tk, dv)
//   dBβ = GVᵀ                                                     (T, Tk)
//   dP_i = c_i·dBβ_i − c_i²(⟨p_i, dBβ_i⟩/r_i)·p_i,  then dP ← M ⊙ dP   (T, Tk)
//   dQ += s·dP·K,   dK += s·dPᵀ·Q
// The mask on dP is required: P_ij = M_ij·s·q_i·k_j, so ∂L/∂(s·QKᵀ) = M ⊙ dP; without it dQ and dK pick up
// the masked entries' c·dBβ_ij. Block by block: dV[0:e] += Bβ_Iᵀ G_I, dBβ_I = G_I V[0:e]ᵀ, dQ_I += s·dP_I K[0:e],
// dK[0:e] += s·dP_Iᵀ Q_I with e = key_end(I). One slice; dq, dk, dv may be null; dp is a (block, Tk) scratch.
template <class T>
void beta_attention_vjp(const AttentionDims& D, const T* q, const T* k, const T* v, const T* bb, const T* r,
                        const T* g, T* dq, T* dk, T* dv, T* dp) {
  const T s = static_cast<T>(D.scale);
  for_each_query_block(D, [&](int64_t i0, int64_t rows, int64_t key_end) {
    const T* b_blk = bb + i0 * D.Tk;
    const T* g_blk = g + i0 * D.dv;
    if (dv) gemm(true, false, key_end, D.dv, rows, T(1), b_blk, D.Tk, g_blk, D.dv, T(1), dv, D.dv);
    if (!dq && !dk) return;
    gemm(false, true, rows, key_end, D.dv, T(1), g_blk, D.dv, v, D.dv, T(0), dp, key_end);
    for (int64_t i = 0; i < rows; ++i)
      beta_row_derivative(dp + i * key_end, b_blk + i * D.Tk, r[i0 + i], D.visible(i0 + i), key_end);
    if (dq) gemm(false, false, rows, D.d, key_end, s, dp, key_end, k, D.d, T(1), dq + i0 * D.d, D.d);
    if (dk) gemm(true, false, key_end, D.d, rows, s, dp, key_end, q + i0 * D.d, D.d, T(1), dk, D.d);
  });
}

// JVP (the β-attention post's Leibniz rule, with the full dβ; docs/derivations.md §1.3):
//   Ṗ = (s(Q̇Kᵀ + QK̇ᵀ)) ⊙ M,   Ḃβ_i = dβ(p_i)·ṗ_i = c_i·ṗ_i − c_i²(⟨p_i, ṗ_i⟩/r_i)·p_i,   Ȯ = Ḃβ·V + Bβ·V̇
// Block by block, as the forward. One slice; tq, tk, tv may be null; pdot is a (block, Tk) scratch; the result
// is added into tout.
template <class T>
void beta_attention_jvp(const AttentionDims& D, const T* q, const T* k, const T* v, const T* bb, const T* r,
                        const T* tq, const T* tk, const T* tv, T* tout, T* pdot) {
  const T s = static_cast<T>(D.scale);
  for_each_query_block(D, [&](int64_t i0, int64_t rows, int64_t key_end) {
    const T* b_blk = bb + i0 * D.Tk;
    T* t_blk = tout + i0 * D.dv;
    if (tq || tk) {
      if (tq) gemm(false, true, rows, key_end, D.d, s, tq + i0 * D.d, D.d, k, D.d, T(0), pdot, key_end);
      if (tk)
        gemm(false, true, rows, key_end, D.d, s, q + i0 * D.d, D.d, tk, D.d, T(tq ? 1 : 0), pdot, key_end);
      for (int64_t i = 0; i < rows; ++i)
        beta_row_derivative(pdot + i * key_end, b_blk + i * D.Tk, r[i0 + i], D.visible(i0 + i), key_end);
      gemm(false, false, rows, D.dv, key_end, T(1), pdot, key_end, v, D.dv, T(1), t_blk, D.dv);
    }
    if (tv) gemm(false, false, rows, D.dv, key_end, T(1), b_blk, D.Tk, tv, D.dv, T(1), t_blk, D.dv);
  });
}

// Element offsets of slice bh in Q, K, V, O (and the (T, Tk) scores, the T norms).
struct SliceOffsets {
  int64_t q, k, v, o, scores, rows;
  SliceOffsets(const AttentionDims& D, int64_t bh)
      : q(bh * D.T * D.d), k(bh * D.Tk * D.d), v(bh * D.Tk * D.dv), o(bh * D.T * D.dv), scores(bh * D.T * D.Tk),
        rows(bh * D.T) {}
};

template <class T>
T* offset_or_null(T* p, int64_t offset) {
  return p ? p + offset : nullptr;
}

}  // namespace

Var beta_attention(Var q, Var k, Var v, const AttentionOptions& opt) {
  const char* op = "beta_attention";
  Tape& tape = tape_of(op, {q, k, v});
  const AttentionDims dims = attention_dims(op, q, k, v, opt);
  const DType dtype = q.dtype();
  const Tensor qv = q.value(), kv = k.value(), vv = v.value();
  Tensor bb = tape.empty(dtype, {dims.B, dims.H, dims.T, dims.Tk}, "Bβ = β(P)");
  Tensor r = tape.empty(dtype, {dims.B, dims.H, dims.T}, "r = ‖P‖ per row");
  Tensor o = tape.empty(dtype, {dims.B, dims.H, dims.T, dims.dv});
  const int64_t heads = dims.heads(), grain = dims.slice_grain();
  dispatch_float(op, dtype, [&](auto tag) {
    using T = decltype(tag);
    parallel_for(heads, grain, [&](int64_t begin, int64_t end) {
      for (int64_t bh = begin; bh < end; ++bh) {
        const SliceOffsets at(dims, bh);
        beta_attention_forward<T>(dims, qv.data<T>() + at.q, kv.data<T>() + at.k, vv.data<T>() + at.v,
                                  bb.data<T>() + at.scores, r.data<T>() + at.rows, o.data<T>() + at.o);
      }
    });
  });
  Tape* tp = &tape;
  const int64_t scratch = max_query_block_rows(dims) * dims.Tk;
  return tape.record(
      op, {q, k, v}, o,
      [=](const Tensor& g, std::span<const Tensor> gin) {
        Tensor dp = tp->empty(dtype, {parallel_chunks(heads, grain), scratch});
        dispatch_float(op, dtype, [&](auto tag) {
          using T = decltype(tag);
          T *dq = data_or_null<T>(gin[0]), *dk = data_or_null<T>(gin[1]), *dv = data_or_null<T>(gin[2]);
          parallel_for(heads, grain, [&](int64_t begin, int64_t end, int64_t chunk) {
            for (int64_t bh = begin; bh < end; ++bh) {
              const SliceOffsets at(dims, bh);
              beta_attention_vjp<T>(dims, qv.data<T>() + at.q, kv.data<T>() + at.k, vv.data<T>() + at.v,
                                    bb.data<T>() + at.scores, r.data<T>() + at.rows, g.data<T>() + at.o,
                                    offset_or_null(dq, at.q), offset_or_null(dk, at.k), offset_or_null(dv, at.v),
                                    dp.data<T>() + chunk * scratch);
            }
          });
        });
      },
      [=](std::span<const Tensor> tin, const Tensor& tout) {
        Tensor pdot = tp->empty(dtype, {parallel_chunks(heads, grain), scratch});
        dispatch_float(op, dtype, [&](auto tag) {
          using T = decltype(tag);
          const T *tq = data_or_null<T>(tin[0]), *tk = data_or_null<T>(tin[1]), *tv = data_or_null<T>(tin[2]);
          parallel_for(heads, grain, [&](int64_t begin, int64_t end, int64_t chunk) {
            for (int64_t bh = begin; bh < end; ++bh) {
              const SliceOffsets at(dims, bh);
              beta_attention_jvp<T>(dims, qv.data<T>() + at.q, kv.data<T>() + at.k, vv.data<T>() + at.v,
                                    bb.data<T>() + at.scores, r.data<T>() + at.rows, offset_or_null(tq, at.q),
                                    offset_or_null(tk, at.k), offset_or_null(tv, at.v), tout.data<T>() + at.o,
                                    pdot.data<T>() + chunk * scratch);
            }
          });
        });
      });
}

void register_beta_attention(Registry& r) {
  r.add({.name = "beta_attention",
         .family = "beta_attention",
         .equation = "dV += BβᵀG; dP = M ⊙ dβ(P)(GVᵀ) with dβ(p)u = c·u − c²(⟨p,u⟩/r)p; dQ += s·dP·K; "
                     "dK += s·dPᵀ·Q; Ȯ = dβ(P)(M ⊙ s(Q̇Kᵀ + QK̇ᵀ))·V + Bβ·V̇",
         .cost = attention_cost,
         .forward = "O = Bβ·V, Bβ = β(P) per row, P = M ⊙ s·QKᵀ (M: 0 above the diagonal when causal)",
         .derivation = "1.4, 1.2"});
  auto qkv = [](AttentionOptions opt) {
    return [opt](Tape&, std::span<const Var> x) { return beta_attention(x[0], x[1], x[2], opt); };
  };
  const AttentionOptions plain{}, causal{0, true};
  r.add_case("beta_attention", {"B=2 h=2 T=4 d=3", {{"q", {2, 2, 4, 3}}, {"k", {2, 2, 4, 3}}, {"v", {2, 2, 4, 3}}},
                                qkv(plain)});
  r.add_case("beta_attention",
             {"causal B=1 h=2 T=7 d=5", {{"q", {1, 2, 7, 5}}, {"k", {1, 2, 7, 5}}, {"v", {1, 2, 7, 5}}}, qkv(causal)});
  r.add_case("beta_attention", {"T=3 Tk=5 dv=2 s=0.7", {{"q", {2, 1, 3, 4}}, {"k", {2, 1, 5, 4}}, {"v", {2, 1, 5, 2}}},
                                qkv(AttentionOptions{0.7, false})});
  r.add_case("beta_attention", {"T=1 Tk=4", {{"q", {1, 2, 1, 3}}, {"k", {1, 2, 4, 3}}, {"v", {1, 2, 4, 3}}}, qkv(plain)});
  r.add_case("beta_attention", {"causal T=1", {{"q", {2, 1, 1, 3}}, {"k", {2, 1, 1, 3}}, {"v", {2, 1, 1, 2}}},
                                qkv(causal)});
  // Causal with T above kQueryBlock: three query blocks, each one's products cut at its last key.
  r.add_case("beta_attention", {"causal T=70 (three blocks)",
                                {{"q", {1, 2, 70, 3}}, {"k", {1, 2, 70, 3}}, {"v", {1, 2, 70, 2}}}, qkv(causal)});
  // Q = 0: every row of P is 0, where β has its special case dβ(0) = I.
  r.add_case("beta_attention", {"Q = 0 (β at 0)",
                                {{"q", {1, 2, 3, 3}, Fill::zeros}, {"k", {1, 2, 4, 3}}, {"v", {1, 2, 4, 2}}},
                                qkv(plain)});
}

}  // namespace tapegrad
