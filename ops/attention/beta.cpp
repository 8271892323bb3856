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
// The row map β and its derivative (symmetric, so the VJP too) are derived above beta_row in ops/row_maps.hpp;
// where the β-attention post's homogeneity shortcut fails, docs/derivations.md §1.3.
//
// Work, as in softmax.cpp: the slices (b, h) run on the engine's threads, one slice per thread at a time, and
// the queries go in blocks I = [i0, i1) of at most kQueryBlock rows; under the causal mask block I sees keys
// j < i1 only (Bβ and dP are 0 beyond), so its products stop at column i1.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/products/blas.hpp"
#include "ops/sheet.hpp"
#include "engine/parallel.hpp"
#include "ops/attention/attention.hpp"
#include "ops/attention/kernels.hpp"
#include "ops/fast_math.hpp"
#include "ops/ops.hpp"
#include "ops/row_maps.hpp"

namespace tapegrad {

namespace {

// Forward of one slice, block by block: P_I = s·Q_I Kᵀ (gemm), masked to 0; Bβ_I = β(P_I) row-wise;
// O_I = Bβ_I·V (gemm).       q (T,d), k (Tk,d), v (Tk,dv) → bb (T,Tk), r (T), o (T,dv) of the slice
template <class T>
void beta_attention_forward(const AttentionDims& dims, const T* q, const T* k, const T* v, T* bb, T* r, T* o) {
  const T s = static_cast<T>(dims.scale);
  for_each_query_block(dims, [&](int64_t i0, int64_t rows, int64_t key_end) {
    T* b_blk = bb + i0 * dims.Tk;
    gemm(rows, key_end, dims.d, s, as_is(q + i0 * dims.d, dims.d), transposed(k, dims.d), T(0), b_blk, dims.Tk);
    for (int64_t i = 0; i < rows; ++i) {
      T* p_i = b_blk + i * dims.Tk;
      r[i0 + i] = beta_row(p_i, p_i, dims.visible(i0 + i), dims.Tk);
    }
    gemm(rows, dims.dv, key_end, T(1), as_is(b_blk, dims.Tk), as_is(v, dims.dv), T(0), o + i0 * dims.dv, dims.dv);
  });
}

// VJP (docs/derivations.md §1.4):
//   dV += BβᵀG                                                    (Tk, dv)
//   dBβ = GVᵀ                                                     (T, Tk)
//   dP_i = c_i·dBβ_i − c_i²(⟨p_i, dBβ_i⟩/r_i)·p_i,  then dP ← M ⊙ dP   (T, Tk)
//   dQ += s·dP·K,   dK += s·dPᵀ·Q
// The mask on dP is required: P_ij = M_ij·s·q_i·k_j, so ∂L/∂(s·QKᵀ) = M ⊙ dP; without it dQ and dK pick up
// the masked entries' c·dBβ_ij. Block by block: dV[0:e] += Bβ_Iᵀ G_I, dBβ_I = G_I V[0:e]ᵀ, dQ_I += s·dP_I K[0:e],
// dK[0:e] += s·dP_Iᵀ Q_I with e = key_end(I). One slice; gq, gk, gv may be null; dp is a (block, Tk) scratch.
template <class T>
void beta_attention_vjp(const AttentionDims& dims, const T* q, const T* k, const T* v, const T* bb, const T* r,
                        const T* g, T* gq, T* gk, T* gv, T* dp) {
  const T s = static_cast<T>(dims.scale);
  for_each_query_block(dims, [&](int64_t i0, int64_t rows, int64_t key_end) {
    const T* b_blk = bb + i0 * dims.Tk;
    const T* g_blk = g + i0 * dims.dv;
    if (gv) gemm(key_end, dims.dv, rows, T(1), transposed(b_blk, dims.Tk), as_is(g_blk, dims.dv), T(1), gv, dims.dv);
    if (!gq && !gk) return;
    gemm(rows, key_end, dims.dv, T(1), as_is(g_blk, dims.dv), transposed(v, dims.dv), T(0), dp, key_end);
    for (int64_t i = 0; i < rows; ++i) {
      T* dp_i = dp + i * key_end;
      beta_row_derivative<Into::replace>(dp_i, dp_i, b_blk + i * dims.Tk, r[i0 + i], dims.visible(i0 + i), key_end);
    }
    if (gq) gemm(rows, dims.d, key_end, s, as_is(dp, key_end), as_is(k, dims.d), T(1), gq + i0 * dims.d, dims.d);
    if (gk) gemm(key_end, dims.d, rows, s, transposed(dp, key_end), as_is(q + i0 * dims.d, dims.d), T(1), gk, dims.d);
  });
}

// JVP (the β-attention post's Leibniz rule, with the full dβ; docs/derivations.md §1.3):
//   Ṗ = (s(Q̇Kᵀ + QK̇ᵀ)) ⊙ M,   Ḃβ_i = dβ(p_i)·ṗ_i = c_i·ṗ_i − c_i²(⟨p_i, ṗ_i⟩/r_i)·p_i,   Ȯ = Ḃβ·V + Bβ·V̇
// Block by block, as the forward. One slice; tq, tk, tv may be null; pdot is a (block, Tk) scratch; the result
// is added into tout.
template <class T>
void beta_attention_jvp(const AttentionDims& dims, const T* q, const T* k, const T* v, const T* bb, const T* r,
                        const T* tq, const T* tk, const T* tv, T* tout, T* pdot) {
  const T s = static_cast<T>(dims.scale);
  for_each_query_block(dims, [&](int64_t i0, int64_t rows, int64_t key_end) {
    const T* b_blk = bb + i0 * dims.Tk;
    T* t_blk = tout + i0 * dims.dv;
    if (tq || tk) {
      if (tq)
        gemm(rows, key_end, dims.d, s, as_is(tq + i0 * dims.d, dims.d), transposed(k, dims.d), T(0), pdot, key_end);
      if (tk)
        gemm(rows, key_end, dims.d, s, as_is(q + i0 * dims.d, dims.d), transposed(tk, dims.d), T(tq ? 1 : 0), pdot,
             key_end);
      for (int64_t i = 0; i < rows; ++i) {
        T* pdot_i = pdot + i * key_end;
        beta_row_derivative<Into::replace>(pdot_i, pdot_i, b_blk + i * dims.Tk, r[i0 + i], dims.visible(i0 + i),
                                           key_end);
      }
      gemm(rows, dims.dv, key_end, T(1), as_is(pdot, key_end), as_is(v, dims.dv), T(1), t_blk, dims.dv);
    }
    if (tv) gemm(rows, dims.dv, key_end, T(1), as_is(b_blk, dims.Tk), as_is(tv, dims.dv), T(1), t_blk, dims.dv);
  });
}

// Second order (Tape::hvp), one slice: the tangent of the VJP at a fixed G. With dBβ = GVᵀ and dP = dβ(P)·dBβ
// (masked to the visible keys) as in the VJP, and the JVP's Ṗ = s(Q̇Kᵀ + QK̇ᵀ) (masked), Ḃβ = dβ(P)·Ṗ:
//   dṖ_i = (β's second-order rule at p_i along ṗ_i, applied to dBβ_i) + dβ(p_i)·(GV̇ᵀ)_i     (ops/row_maps.hpp)
//   dV̇ += Ḃβᵀ·G,   dQ̇ += s(dṖ·K + dP·K̇),   dK̇ += s(dṖᵀ·Q + dPᵀ·Q̇)
// The buffers keep the names of the helpers they share with softmax attention (ops/attention/kernels.hpp): dp holds
// dBβ = GVᵀ, dpdot GV̇ᵀ, ds the score gradient dP and dsdot its tangent dṖ.
// Dense over the slice: the products through gemm, β's rules row by row over each row's visible keys (zeros after
// them). Outputs and tangents may be null. `work` holds second_order_slice_elements(dims) elements of scratch.
template <class T>
void beta_attention_second_order(const AttentionDims& dims, const T* q, const T* k, const T* v, const T* bb, const T* r,
                                 const T* g, const T* tq, const T* tk, const T* tv, T* out_q, T* out_k, T* out_v,
                                 T* work) {
  const int64_t T_ = dims.T, Tk = dims.Tk;
  // (T, Tk) each; dP, Ḃβ and dṖ stay 0 beyond each row's visible keys
  auto [dp, dpdot, pdot, ds, bdot, dsdot] = zeroed_slice_matrices(work, T_ * Tk);
  second_order_scores(dims, q, k, v, g, tq, tk, tv, dp, dpdot, pdot);  // dBβ = GVᵀ, GV̇ᵀ, Ṗ
  for (int64_t i = 0; i < T_; ++i) {
    const int64_t vis = dims.visible(i);
    const T* beta = bb + i * Tk;
    T *dp_i = dp + i * Tk, *pdot_i = pdot + i * Tk, *dsdot_i = dsdot + i * Tk;
    beta_row_derivative<Into::replace>(ds + i * Tk, dp_i, beta, r[i], vis, vis);
    beta_row_derivative<Into::replace>(bdot + i * Tk, pdot_i, beta, r[i], vis, vis);
    beta_row_derivative<Into::replace>(dsdot_i, dpdot + i * Tk, beta, r[i], vis, vis);
    beta_row_second_order(dsdot_i, dp_i, pdot_i, beta, r[i], vis);
  }
  second_order_products(dims, q, k, g, tq, tk, bdot, ds, dsdot, out_q, out_k, out_v);
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
  // Scratch (engine/scratch.hpp), per range of the loops over slices: a (block, Tk) matrix for the VJP's dP or the
  // JVP's Ṗ, or the second-order rule's six (T, Tk) matrices.
  const int64_t block_scores = max_query_block_rows(dims) * dims.Tk;
  auto block_need = [=](int64_t chunks) { return scratch_need(dtype, {block_scores}, chunks); };
  auto slices_need = [=](int64_t chunks) { return scratch_need(dtype, {second_order_slice_elements(dims)}, chunks); };
  reserve_scratch(tape, block_need(parallel_chunks(heads, grain)).bytes(),
                  slices_need(parallel_chunks(heads, grain)).bytes());
  dispatch_float(op, dtype, [&]<class T>(T) {
    parallel_for(heads, grain, [&](int64_t begin, int64_t end) {
      for (int64_t bh = begin; bh < end; ++bh) {
        const SliceOffsets at(dims, bh);
        beta_attention_forward<T>(dims, qv.data<T>() + at.q, kv.data<T>() + at.k, vv.data<T>() + at.v,
                                  bb.data<T>() + at.scores, r.data<T>() + at.rows, o.data<T>() + at.o);
      }
    });
  });
  Tape* tp = &tape;
  return tape.record(
      op, {q, k, v}, o,
      [=](const Tensor& g, std::span<Tensor> gin) {
        const ScratchChunks dp_chunks = tp->scratch().take(block_need(parallel_chunks(heads, grain)))[0];
        dispatch_float(op, dtype, [&]<class T>(T) {
          T *dq = data_or_null<T>(gin[0]), *dk = data_or_null<T>(gin[1]), *dv = data_or_null<T>(gin[2]);
          parallel_for(heads, grain, [&](int64_t begin, int64_t end, int64_t chunk) {
            T* dp = dp_chunks.chunk(chunk).take<T>(block_scores);
            for (int64_t bh = begin; bh < end; ++bh) {
              const SliceOffsets at(dims, bh);
              beta_attention_vjp<T>(dims, qv.data<T>() + at.q, kv.data<T>() + at.k, vv.data<T>() + at.v,
                                    bb.data<T>() + at.scores, r.data<T>() + at.rows, g.data<T>() + at.o,
                                    offset_or_null(dq, at.q), offset_or_null(dk, at.k), offset_or_null(dv, at.v), dp);
            }
          });
        });
      },
      [=](std::span<const Tensor> tin, Tensor& tout) {
        const ScratchChunks pdot_chunks = tp->scratch().take(block_need(parallel_chunks(heads, grain)))[0];
        dispatch_float(op, dtype, [&]<class T>(T) {
          const T *tq = data_or_null<T>(tin[0]), *tk = data_or_null<T>(tin[1]), *tv = data_or_null<T>(tin[2]);
          parallel_for(heads, grain, [&](int64_t begin, int64_t end, int64_t chunk) {
            T* pdot = pdot_chunks.chunk(chunk).take<T>(block_scores);
            for (int64_t bh = begin; bh < end; ++bh) {
              const SliceOffsets at(dims, bh);
              beta_attention_jvp<T>(dims, qv.data<T>() + at.q, kv.data<T>() + at.k, vv.data<T>() + at.v,
                                    bb.data<T>() + at.scores, r.data<T>() + at.rows, offset_or_null(tq, at.q),
                                    offset_or_null(tk, at.k), offset_or_null(tv, at.v), tout.data<T>() + at.o, pdot);
            }
          });
        });
      },
      [=](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
        const ScratchChunks work_chunks = tp->scratch().take(slices_need(parallel_chunks(heads, grain)))[0];
        dispatch_float(op, dtype, [&]<class T>(T) {
          const T *tq = data_or_null<T>(tin[0]), *tk = data_or_null<T>(tin[1]), *tv = data_or_null<T>(tin[2]);
          T *dq_dot = data_or_null<T>(gin_dot[0]), *dk_dot = data_or_null<T>(gin_dot[1]);
          T* dv_dot = data_or_null<T>(gin_dot[2]);
          parallel_for(heads, grain, [&](int64_t begin, int64_t end, int64_t chunk) {
            T* work = work_chunks.chunk(chunk).take<T>(second_order_slice_elements(dims));
            for (int64_t bh = begin; bh < end; ++bh) {
              const SliceOffsets at(dims, bh);
              beta_attention_second_order<T>(dims, qv.data<T>() + at.q, kv.data<T>() + at.k, vv.data<T>() + at.v,
                                             bb.data<T>() + at.scores, r.data<T>() + at.rows, g.data<T>() + at.o,
                                             offset_or_null(tq, at.q), offset_or_null(tk, at.k),
                                             offset_or_null(tv, at.v), offset_or_null(dq_dot, at.q),
                                             offset_or_null(dk_dot, at.k), offset_or_null(dv_dot, at.v), work);
            }
          });
        });
      });
}

std::vector<OpSheet> beta_attention_ops() {
  OpSheets r;
  auto qkv = [](AttentionOptions opt) {
    return [opt](Tape&, std::span<const Var> x) { return beta_attention(x[0], x[1], x[2], opt); };
  };
  const AttentionOptions plain{}, causal{0, true};
  r.add({.name = "beta_attention",
         .family = "attention/beta",
         .forward = "O = Bβ·V, Bβ = β(P) per row, P = M ⊙ s·QKᵀ (M: 0 above the diagonal when causal)",
         .vjp = "dV += BβᵀG; dP = M ⊙ dβ(P)(GVᵀ) with dβ(p)u = c·u − c²(⟨p,u⟩/r)p; dQ += s·dP·K; dK += s·dPᵀ·Q",
         .jvp = "Ȯ = dβ(P)(M ⊙ s(Q̇Kᵀ + QK̇ᵀ))·V + Bβ·V̇",
         .second_order = "dBβ = GVᵀ, Ṗ = M ⊙ s(Q̇Kᵀ + QK̇ᵀ): dṖ_i = (β's rule at p_i along ṗ_i, applied to dBβ_i) + "
                         "dβ(p_i)(GV̇ᵀ)_i, masked; dV̇ += Ḃβᵀ·G, dQ̇ += s(dṖ·K + dP·K̇), dK̇ += s(dṖᵀ·Q + dPᵀ·Q̇)",
         .derivation = "1.4, 1.2",
         .second_order_derivation = "6.10",
         .formulas_at = {{"forward", "ops/attention/beta.cpp", "beta_attention_forward"},
                         {"VJP", "ops/attention/beta.cpp", "beta_attention_vjp"},
                         {"JVP", "ops/attention/beta.cpp", "beta_attention_jvp"},
                         {"second order", "ops/attention/beta.cpp", "beta_attention_second_order"},
                         {"β rows", "ops/row_maps.hpp", "beta_row"},
                         {"their VJP and JVP", "ops/row_maps.hpp", "beta_row_derivative"},
                         {"β's second order", "ops/row_maps.hpp", "beta_row_second_order"}},
         .cost = attention_cost,
         // Its gradcheck cases, each checked to first and second order by the suite:
         .cases = {{"B=2 h=2 T=4 d=3", {{"q", {2, 2, 4, 3}}, {"k", {2, 2, 4, 3}}, {"v", {2, 2, 4, 3}}}, qkv(plain)},
                   {"causal B=1 h=2 T=7 d=5",
                    {{"q", {1, 2, 7, 5}}, {"k", {1, 2, 7, 5}}, {"v", {1, 2, 7, 5}}},
                    qkv(causal)},
                   {"T=3 Tk=5 dv=2 s=0.7",
                    {{"q", {2, 1, 3, 4}}, {"k", {2, 1, 5, 4}}, {"v", {2, 1, 5, 2}}},
                    qkv(AttentionOptions{0.7, false})},
                   {"T=1 Tk=4", {{"q", {1, 2, 1, 3}}, {"k", {1, 2, 4, 3}}, {"v", {1, 2, 4, 3}}}, qkv(plain)},
                   {"causal T=1", {{"q", {2, 1, 1, 3}}, {"k", {2, 1, 1, 3}}, {"v", {2, 1, 1, 2}}}, qkv(causal)},
                   // Causal with T above kQueryBlock: three query blocks, each one's products cut at its last key.
                   {"causal T=70 (three blocks)",
                    {{"q", {1, 2, 70, 3}}, {"k", {1, 2, 70, 3}}, {"v", {1, 2, 70, 2}}},
                    qkv(causal)},
                   // Q = 0: every row of P is 0, where β has its special case dβ(0) = I.
                   {"Q = 0 (β at 0)",
                    {{"q", {1, 2, 3, 3}, Fill::zeros}, {"k", {1, 2, 4, 3}}, {"v", {1, 2, 4, 2}}},
                    qkv(plain)}},
         .inputs = 3,
         .call = [](std::span<const Var> x,
                    const OpArgs& a) { return beta_attention(x[0], x[1], x[2], attention_options(a)); },
         // P = s·QKᵀ, Bβ = row_normalize(P) = β(P) per row, O = Bβ·V, with s = 1/√d; causal cases add M.
         .unfused =
             [](Tape&, std::span<const Var> x) {
               const double d = static_cast<double>(x[0].shape()[x[0].shape().rank() - 1]);
               return matmul(row_normalize(scale(matmul(x[0], transpose(x[1])), 1 / std::sqrt(d))), x[2]);
             }});
  return r.ops;
}

}  // namespace tapegrad
