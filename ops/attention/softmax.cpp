// Standard attention with an optional trainable additive bias, as one node (the attention-gradient and
// attention-bias posts; docs/derivations.md §2.1, §5).
//
// Per (b, h) slice, tokens as rows: Q (T, d), K (Tk, d), V (Tk, dv), the bias broadcast to (T, Tk),
// G = ∂L/∂O (T, dv), s the scale:
//   S = s·QKᵀ + bias + M     M_ij = 0 where key j is visible to query i, −∞ where it is masked (causal: j > i)
//   A = softmax_row(S)        (T, Tk), exactly 0 at masked entries
//   O = A·V                   (T, dv)
// The node keeps A and O; the backward needs no other n×n tensor than one (block, Tk) matrix of scratch per range
// of its loop over slices (engine/scratch.hpp).
//
// Work. The slices (b, h) are independent and run on the engine's threads, each slice on one thread. Within a
// slice, the queries go in blocks I = [i0, i1) of at most kQueryBlock rows; under the causal mask block I sees
// keys j < i1 only, so every product of the block stops at column i1 (A is 0 beyond it) and the causal forward,
// VJP and JVP do about half the multiply-adds of the full T × Tk products. Without the mask a block is all T rows.
#include <algorithm>
#include <cmath>
#include <limits>
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

// Forward of one slice, block by block:  S_I = s·Q_I Kᵀ (gemm) + B_I (broadcast),  A_I = softmax_row(S_I + M_I),
// O_I = A_I·V (gemm).                                                       a (T, Tk), o (T, dv) of the slice
// Kᵀ is one operand of every block's S_I product, packed at most once per slice (ops/products/blas.hpp
// SharedOperand).
template <class T>
void attention_forward(const AttentionDims& dims, const SliceInputs<T>& x, const BiasLayout& L, T* a, T* o) {
  const T s = static_cast<T>(dims.scale);
  thread_local std::vector<T> packed;
  thread_local std::vector<uint32_t> pairs;
  SharedOperand<T> k_t(transposed(x.k, dims.d), dims.d, dims.Tk, packed, &pairs);
  for_each_query_block(dims, [&](int64_t i0, int64_t rows, int64_t key_end) {
    T* a_blk = a + i0 * dims.Tk;
    gemm(rows, key_end, s, as_is(x.q + i0 * dims.d, dims.d), k_t, T(0), a_blk, dims.Tk);
    if (x.bias) add_bias_block(L, a_blk, dims.Tk, x.bias, x.b, x.head, i0, rows, 0, key_end);
    for (int64_t i = 0; i < rows; ++i) {
      T* a_i = a_blk + i * dims.Tk;
      softmax_row(a_i, a_i, dims.visible(i0 + i), dims.Tk, key_end);  // ops/row_maps.hpp
    }
    gemm(rows, dims.dv, key_end, T(1), as_is(a_blk, dims.Tk), as_is(x.v, dims.dv), T(0), o + i0 * dims.dv, dims.dv);
  });
}

// VJP of softmax attention, derived here once (the tiled node and the second-order rule use these steps; the
// attention-gradient post's Ω is this dS with s = 1, docs/derivations.md §2.1 maps its letters to these):
//   dV += AᵀG                                  (Tk, dv)
//   dA  = GVᵀ                                  (T, Tk)
//   D   = rowsum(A ⊙ dA) = rowsum(G ⊙ O)      (T):   Σ_j A_ij (G_i·V_j) = G_i·(Σ_j A_ij V_j) = G_i·O_i,
//                                                    so D costs O(T·dv) and no (T, Tk) temporary
//   dS  = A ⊙ (dA − D·1ᵀ)                     (T, Tk): softmax's row VJP (ops/row_maps.hpp) with the row term D_i
//   dQ += s·dS·K,   dK += s·dSᵀ·Q,   dB += dS summed over the broadcast axes of B (§5.4)
// A is 0 at masked entries, so dS is 0 there with no extra mask (−∞ masking).
// The attention-bias post's prose dS, dQ and dK are wrong; its code line is this dS: docs/derivations.md §5.3, §5.5.
// Block by block, every product above splits over the query rows I: dV[0:e] += A_Iᵀ G_I, dA_I = G_I V[0:e]ᵀ,
// dQ_I += s·dS_I K[0:e], dK[0:e] += s·dS_Iᵀ Q_I, with e = key_end(I).
// One slice; gq, gk, gv, gbias may be null (no gradient wanted); ds is a (block, Tk) scratch. Vᵀ, an operand of
// every block's dA_I product, is packed at most once per slice.
template <class T>
void attention_vjp(const AttentionDims& dims, const SliceInputs<T>& x, const T* a, const T* o, const T* g,
                   const BiasLayout& L, T* gq, T* gk, T* gv, T* gbias, T* ds) {
  const T s = static_cast<T>(dims.scale);
  const bool need_ds = gq || gk || gbias;
  thread_local std::vector<T> packed;
  thread_local std::vector<uint32_t> pairs;
  SharedOperand<T> v_t(transposed(x.v, dims.dv), dims.dv, dims.Tk, packed, &pairs);
  for_each_query_block(dims, [&](int64_t i0, int64_t rows, int64_t key_end) {
    const T* a_blk = a + i0 * dims.Tk;
    const T* g_blk = g + i0 * dims.dv;
    if (gv) gemm(key_end, dims.dv, rows, T(1), transposed(a_blk, dims.Tk), as_is(g_blk, dims.dv), T(1), gv, dims.dv);
    if (!need_ds) return;
    gemm(rows, key_end, T(1), as_is(g_blk, dims.dv), v_t, T(0), ds, key_end);
    for (int64_t i = 0; i < rows; ++i) {
      const T row_term = lane_dot(g_blk + i * dims.dv, o + (i0 + i) * dims.dv, dims.dv);  // D_i = G_i·O_i
      T* ds_i = ds + i * key_end;
      softmax_row_derivative<Into::replace>(ds_i, a_blk + i * dims.Tk, ds_i, row_term, key_end);  // ops/row_maps.hpp
    }
    if (gq) gemm(rows, dims.d, key_end, s, as_is(ds, key_end), as_is(x.k, dims.d), T(1), gq + i0 * dims.d, dims.d);
    if (gk) gemm(key_end, dims.d, rows, s, transposed(ds, key_end), as_is(x.q + i0 * dims.d, dims.d), T(1), gk, dims.d);
    if (gbias) accumulate_bias_grad_block(L, gbias, ds, key_end, x.b, x.head, i0, rows, 0, key_end);
  });
}

// JVP (the β-attention post's total derivative of Att, docs/derivations.md §1.1, with s and the bias):
//   Ż = s(Q̇Kᵀ + QK̇ᵀ) + Ḃ                       (T, Tk)   the post's z̃_i = q̃_i + k̃_i, row i of Ż
//   Ȯ = (A ⊙ Ż)V − rowsum(A ⊙ Ż) ⊙ O + A·V̇     (T, dv)   rowsum(A ⊙ Ż)_i = ⟨σ(p_i), z̃_i⟩ = the post's ι̃_i
// The post writes the middle term as (ι̃ ⊗ 1_nᵀ) ⊙ Att; Att is (n, d), so the factor must be 1_dᵀ: each row
// of O is scaled by its ι̃_i. Masked entries have A = 0 and contribute nothing. Block by block, as the forward.
// One slice; tq, tk, tv, tbias may be null (no tangent); z is a (block, Tk) scratch; the result is added into
// tout.
template <class T>
void attention_jvp(const AttentionDims& dims, const SliceInputs<T>& x, const T* a, const T* o, const T* tq, const T* tk,
                   const T* tv, const T* tbias, const BiasLayout& L, T* tout, T* z) {
  const T s = static_cast<T>(dims.scale);
  const bool need_z = tq || tk || tbias;
  for_each_query_block(dims, [&](int64_t i0, int64_t rows, int64_t key_end) {
    const T* a_blk = a + i0 * dims.Tk;
    T* t_blk = tout + i0 * dims.dv;
    if (need_z) {
      if (!tq && !tk) std::fill(z, z + rows * key_end, T(0));
      if (tq)
        gemm(rows, key_end, dims.d, s, as_is(tq + i0 * dims.d, dims.d), transposed(x.k, dims.d), T(0), z, key_end);
      if (tk)
        gemm(rows, key_end, dims.d, s, as_is(x.q + i0 * dims.d, dims.d), transposed(tk, dims.d), T(tq ? 1 : 0), z,
             key_end);
      if (tbias) add_bias_block(L, z, key_end, tbias, x.b, x.head, i0, rows, 0, key_end);
      for (int64_t i = 0; i < rows; ++i) {
        const T* a_i = a_blk + i * dims.Tk;
        T* z_i = z + i * key_end;
        for (int64_t j = 0; j < key_end; ++j) z_i[j] *= a_i[j];
        const T row_term = lane_sum(z_i, key_end);  // ι̃_i = ⟨A_i, Ż_i⟩
        const T* o_i = o + (i0 + i) * dims.dv;
        for (int64_t c = 0; c < dims.dv; ++c) t_blk[i * dims.dv + c] -= row_term * o_i[c];
      }
      gemm(rows, dims.dv, key_end, T(1), as_is(z, key_end), as_is(x.v, dims.dv), T(1), t_blk, dims.dv);
    }
    if (tv) gemm(rows, dims.dv, key_end, T(1), as_is(a_blk, dims.Tk), as_is(tv, dims.dv), T(1), t_blk, dims.dv);
  });
}

}  // namespace

Var attention(Var q, Var k, Var v, const AttentionOptions& opt, Var bias) {
  const char* op = "attention";
  Tape& tape = bias.defined() ? tape_of(op, {q, k, v, bias}) : tape_of(op, {q, k, v});
  const AttentionDims dims = attention_dims(op, q, k, v, opt);
  const BiasLayout layout = bias_layout(op, q, bias, dims);
  const Tensor bv = bias.defined() ? bias.value() : Tensor{};
  const DType dtype = q.dtype();
  const Tensor qv = q.value(), kv = k.value(), vv = v.value();
  Tensor a = tape.empty(dtype, {dims.B, dims.H, dims.T, dims.Tk}, "A = softmax(S)");
  Tensor o = tape.empty(dtype, {dims.B, dims.H, dims.T, dims.dv});
  const int64_t heads = dims.heads(), grain = dims.slice_grain();
  // Scratch (engine/scratch.hpp), per range of the loops over slices: a (block, Tk) matrix for the VJP's dS or the
  // JVP's Ż, or the second-order rule's six (T, Tk) matrices; and copies of dB where slices share bias elements.
  const int64_t block_scores = max_query_block_rows(dims) * dims.Tk;
  auto block_need = [=](int64_t chunks) { return scratch_need(dtype, {block_scores}, chunks); };
  auto slices_need = [=](int64_t chunks) { return scratch_need(dtype, {second_order_slice_elements(dims)}, chunks); };
  {
    const int64_t chunks = parallel_chunks(heads, grain);
    const bool bias_grad = bias.defined() && bias.requires_grad();
    const size_t parts = BiasGradChunks::need(dtype, bias_grad, bv.numel(), layout, dims, chunks).bytes();
    reserve_scratch(tape, block_need(chunks).bytes() + parts, slices_need(chunks).bytes() + parts);
  }
  dispatch_float(op, dtype, [&]<class T>(T) {
    const T *pq = qv.data<T>(), *pk = kv.data<T>(), *pv = vv.data<T>(), *pb = data_or_null<T>(bv);
    T *pa = a.data<T>(), *po = o.data<T>();
    parallel_for(heads, grain, [&](int64_t begin, int64_t end) {
      for (int64_t bh = begin; bh < end; ++bh) {
        const SliceOffsets at(dims, bh);
        attention_forward<T>(dims, slice_inputs(at, pq, pk, pv, pb), layout, pa + at.scores, po + at.o);
      }
    });
  });
  Tape* tp = &tape;
  auto vjp = [=](const Tensor& g, std::span<Tensor> gin) {
    const Tensor dbias = gin.size() > 3 ? gin[3] : Tensor{};
    const int64_t chunks = parallel_chunks(heads, grain);
    const std::array<ScratchChunks, 2> taken =
        tp->scratch().take(block_need(chunks), BiasGradChunks::need(dbias, layout, dims, chunks));
    const ScratchChunks& ds_chunks = taken[0];
    const ScratchChunks& parts = taken[1];
    BiasGradChunks dbias_at(dbias, layout, dims, chunks, parts);
    dispatch_float(op, dtype, [&]<class T>(T) {
      const T *pq = qv.data<T>(), *pk = kv.data<T>(), *pv = vv.data<T>(), *pb = data_or_null<T>(bv);
      T *dq = data_or_null<T>(gin[0]), *dk = data_or_null<T>(gin[1]);
      T* dv = data_or_null<T>(gin[2]);
      parallel_for(heads, grain, [&](int64_t begin, int64_t end, int64_t chunk) {
        T* db_chunk = dbias_at.target<T>(chunk);
        T* ds = ds_chunks.chunk(chunk).take<T>(block_scores);
        for (int64_t bh = begin; bh < end; ++bh) {
          const SliceOffsets at(dims, bh);
          attention_vjp<T>(dims, slice_inputs(at, pq, pk, pv, pb), a.data<T>() + at.scores, o.data<T>() + at.o,
                           g.data<T>() + at.o, layout, offset_or_null(dq, at.q), offset_or_null(dk, at.k),
                           offset_or_null(dv, at.v), db_chunk, ds);
        }
      });
      dbias_at.add_parts<T>();
    });
  };
  auto jvp = [=](std::span<const Tensor> tin, Tensor& tout) {
    const Tensor tbias = tin.size() > 3 ? tin[3] : Tensor{};
    const ScratchChunks z_chunks = tp->scratch().take(block_need(parallel_chunks(heads, grain)))[0];
    dispatch_float(op, dtype, [&]<class T>(T) {
      const T *pq = qv.data<T>(), *pk = kv.data<T>(), *pv = vv.data<T>(), *pb = data_or_null<T>(bv);
      const T *tq = data_or_null<T>(tin[0]), *tk = data_or_null<T>(tin[1]), *tv = data_or_null<T>(tin[2]);
      parallel_for(heads, grain, [&](int64_t begin, int64_t end, int64_t chunk) {
        T* z = z_chunks.chunk(chunk).take<T>(block_scores);
        for (int64_t bh = begin; bh < end; ++bh) {
          const SliceOffsets at(dims, bh);
          attention_jvp<T>(dims, slice_inputs(at, pq, pk, pv, pb), a.data<T>() + at.scores, o.data<T>() + at.o,
                           offset_or_null(tq, at.q), offset_or_null(tk, at.k), offset_or_null(tv, at.v),
                           data_or_null<T>(tbias), layout, tout.data<T>() + at.o, z);
        }
      });
    });
  };
  auto second = [=](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
    const Tensor tbias = tin.size() > 3 ? tin[3] : Tensor{}, dbias_dot = gin_dot.size() > 3 ? gin_dot[3] : Tensor{};
    const int64_t chunks = parallel_chunks(heads, grain);
    const std::array<ScratchChunks, 2> taken =
        tp->scratch().take(slices_need(chunks), BiasGradChunks::need(dbias_dot, layout, dims, chunks));
    const ScratchChunks& work_chunks = taken[0];
    const ScratchChunks& parts = taken[1];
    BiasGradChunks dbias_dot_at(dbias_dot, layout, dims, chunks, parts);
    dispatch_float(op, dtype, [&]<class T>(T) {
      const T *pq = qv.data<T>(), *pk = kv.data<T>(), *pv = vv.data<T>();
      const T *tq = data_or_null<T>(tin[0]), *tk = data_or_null<T>(tin[1]), *tv = data_or_null<T>(tin[2]);
      T *dq_dot = data_or_null<T>(gin_dot[0]), *dk_dot = data_or_null<T>(gin_dot[1]);
      T* dv_dot = data_or_null<T>(gin_dot[2]);
      parallel_for(heads, grain, [&](int64_t begin, int64_t end, int64_t chunk) {
        T* db_dot_chunk = dbias_dot_at.target<T>(chunk);
        T* work = work_chunks.chunk(chunk).take<T>(second_order_slice_elements(dims));
        for (int64_t bh = begin; bh < end; ++bh) {
          const SliceOffsets at(dims, bh);
          attention_second_order<T>(dims, pq + at.q, pk + at.k, pv + at.v, at.b, at.head, a.data<T>() + at.scores,
                                    g.data<T>() + at.o, offset_or_null(tq, at.q), offset_or_null(tk, at.k),
                                    offset_or_null(tv, at.v), data_or_null<T>(tbias), layout,
                                    offset_or_null(dq_dot, at.q), offset_or_null(dk_dot, at.k),
                                    offset_or_null(dv_dot, at.v), db_dot_chunk, work);
        }
      });
      dbias_dot_at.add_parts<T>();
    });
  };
  if (bias.defined()) return tape.record(op, {q, k, v, bias}, o, vjp, jvp, second);
  return tape.record(op, {q, k, v}, o, vjp, jvp, second);
}

// attention_qkv: the same map on the attention block's packed projection, the head split and merge inside the node.
// qkv (B, T, 3C) holds Q | K | V side by side, C = h·d columns each, head i's d columns at i·d within each; the
// output (B, T, C) holds head i's d columns at i·d:
//   O[b, t, i·d + e] = attention(Q_bi, K_bi, V_bi)[t, e]     Q_bi[t, e] = qkv[b, t, i·d + e], K_bi from column
//                                                            C + i·d, V_bi from 2C + i·d
// that is merge_heads(attention(split_heads(qkv, h, 0, C), split_heads(qkv, h, C, C), split_heads(qkv, h, 2C, C))),
// so its VJP, JVP and second-order rule are attention()'s with the moves of ops/heads.cpp around them. A slice's
// rows are copied out of qkv (and out of O, G and the tangents where a rule reads them), attention_forward,
// attention_vjp, attention_jvp and attention_second_order run on the copies unchanged, and what they give is
// written (added) back in place: the same operations on the same numbers as those five nodes, without the four
// (B, h, T, d) tensors and their gradient buffers that the split and merge put on the tape. The copies are one
// slice at a time per range of the loop, in the tape's scratch, so they stay in cache.
namespace {

// Head `head` of batch row b in a packed (B, T, W) tensor: T rows of d elements, W apart, from column head·d.
struct PackedHeads {
  int64_t T, W, d;
  int64_t at(int64_t b, int64_t head) const { return b * T * W + head * d; }
};
template <class T>
void copy_slice_out(T* slice, const T* packed, int64_t rows, int64_t d, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) std::copy_n(packed + r * ld, d, slice + r * d);
}
template <class T>
void copy_slice_in(T* packed, int64_t ld, const T* slice, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) std::copy_n(slice + r * d, d, packed + r * ld);
}
template <class T>
void add_slice_in(T* packed, int64_t ld, const T* slice, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t e = 0; e < d; ++e) packed[r * ld + e] += slice[r * d + e];
}

// The dims of attention_qkv's slices: T queries and as many keys, d = dv = C/h.
AttentionDims packed_attention_dims(const char* op, const Var& qkv, int64_t heads, const AttentionOptions& opt) {
  expect_float(op, qkv);
  if (qkv.rank() != 3) fail("{}: qkv must be (B, T, 3C), got shape {}", op, qkv.shape());
  const Shape& s = qkv.shape();
  if (s[2] % 3 != 0 || s[2] == 0)
    fail("{}: qkv {} must hold Q, K and V side by side, C columns each; its last axis {} is not 3C", op, s, s[2]);
  const int64_t C = s[2] / 3;
  if (heads < 1 || C % heads != 0)
    fail("{}: the C = {} columns of each of Q, K, V (qkv {}) do not split into {} heads of equal width", op, C, s,
         heads);
  if (s[1] < 1) fail("{}: qkv {} has no tokens (T = 0)", op, s);
  if (!std::isfinite(opt.scale)) fail("{}: scale must be a finite number (0: 1/√d), got {}", op, opt.scale);
  AttentionDims dims;
  dims.B = s[0];
  dims.H = heads;
  dims.T = dims.Tk = s[1];
  dims.d = dims.dv = C / heads;
  dims.scale = opt.scale != 0 ? opt.scale : 1.0 / std::sqrt(static_cast<double>(dims.d));
  dims.causal = opt.causal;
  return dims;
}

// A range's copies of one slice: Q, K, V, O, G; Q̄, K̄, V̄ (gradients or second-order terms, adjacent); Q̇, K̇, V̇; each
// (T, d). `rest`, the kernels' own scratch, follows them.
template <class T>
struct SliceCopies {
  static constexpr int64_t kArrays = 11;
  T *q, *k, *v, *o, *g, *gq, *gk, *gv, *tq, *tk, *tv, *rest;
  SliceCopies(T* base, int64_t n)
      : q(base),
        k(base + n),
        v(base + 2 * n),
        o(base + 3 * n),
        g(base + 4 * n),
        gq(base + 5 * n),
        gk(base + 6 * n),
        gv(base + 7 * n),
        tq(base + 8 * n),
        tk(base + 9 * n),
        tv(base + 10 * n),
        rest(base + 11 * n) {}
};

// body(copies, b, head, bh) for every slice bh = b·H + head, on the engine's threads, each range with its copies
// from the tape's scratch (`need`: SliceCopies and the kernels' scratch, per range).
template <class T, class Body>
void each_packed_slice(Tape& tape, const AttentionDims& dims, const ScratchNeed& need, int64_t per_range, Body&& body) {
  const ScratchChunks scratch = tape.scratch().take(need)[0];
  parallel_for(dims.heads(), dims.slice_grain(), [&](int64_t begin, int64_t end, int64_t chunk) {
    SliceCopies<T> c(scratch.chunk(chunk).take<T>(per_range), dims.T * dims.d);
    for (int64_t bh = begin; bh < end; ++bh) body(c, bh / dims.H, bh % dims.H, bh);
  });
}

}  // namespace

Function unfused_attention_at(const AttentionOptions& opt) {
  return [opt](Tape& tape, std::span<const Var> x) {
    const Var &q = x[0], &k = x[1];
    const int64_t T = q.shape()[q.rank() - 2], Tk = k.shape()[k.rank() - 2];
    const double s = opt.scale != 0 ? opt.scale : 1 / std::sqrt(static_cast<double>(q.shape()[q.rank() - 1]));
    Var scores = scale(matmul(q, transpose(k)), s);
    if (x.size() > 3) scores = add(scores, x[3]);
    if (opt.causal) {  // M: −∞ where key j is not visible to query i (j > i)
      std::vector<double> m(static_cast<size_t>(T * Tk), 0.0);
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = i + 1; j < Tk; ++j)
          m[static_cast<size_t>(i * Tk + j)] = -std::numeric_limits<double>::infinity();
      scores = add(scores, tape.constant(Tensor::from<double>(Shape{T, Tk}, m).to(q.dtype())));
    }
    return matmul(softmax(scores), x[2]);
  };
}

Var attention_qkv(Var qkv, int64_t heads, const AttentionOptions& opt) {
  const char* op = "attention_qkv";
  Tape& tape = tape_of(op, {qkv});
  const AttentionDims dims = packed_attention_dims(op, qkv, heads, opt);
  const int64_t T_ = dims.T, d = dims.d, C = dims.H * d, n = T_ * d;
  const PackedHeads in{T_, 3 * C, d}, out{T_, C, d};
  const DType dtype = qkv.dtype();
  const Tensor xv = qkv.value();
  Tensor a = tape.empty(dtype, {dims.B, dims.H, T_, T_}, "A = softmax(S)");
  Tensor o = tape.empty(dtype, {dims.B, T_, C});
  // Per range: the slice's copies, then a (block, Tk) matrix for the VJP's dS or the JVP's Ż, or the second-order
  // rule's six (T, Tk) matrices.
  const int64_t copies = SliceCopies<float>::kArrays * n, block = max_query_block_rows(dims) * T_,
                second = second_order_slice_elements(dims);
  auto need = [=](int64_t per_range) {
    return scratch_need(dtype, {per_range}, parallel_chunks(dims.heads(), dims.slice_grain()));
  };
  reserve_scratch(tape, need(copies + block).bytes(), need(copies + second).bytes());
  const BiasLayout no_bias{};
  // The three heads of slice (b, head) copied out of a qkv-shaped tensor (the values, or their tangents).
  auto read_heads = [=]<class T>(T* q, T* k, T* v, const T* x, int64_t b, int64_t head) {
    const T* xs = x + in.at(b, head);
    copy_slice_out(q, xs, T_, d, in.W);
    copy_slice_out(k, xs + C, T_, d, in.W);
    copy_slice_out(v, xs + 2 * C, T_, d, in.W);
  };
  auto read_qkv = [=]<class T>(SliceCopies<T>& c, const T* x, int64_t b, int64_t head) {
    read_heads(c.q, c.k, c.v, x, b, head);
  };
  // Q̄, K̄, V̄ (or their second-order terms) of slice (b, head) added into a qkv-shaped gradient, or written into it
  // where the buffer is fresh (Tape::fresh_gradient): the slices cover it.
  auto add_into_qkv = [=]<class T>(T* dx, const SliceCopies<T>& c, int64_t b, int64_t head, bool add = true) {
    T* ds = dx + in.at(b, head);
    for (int part = 0; part < 3; ++part) {
      const T* from = part == 0 ? c.gq : part == 1 ? c.gk : c.gv;
      if (add) add_slice_in(ds + part * C, in.W, from, T_, d);
      else copy_slice_in(ds + part * C, in.W, from, T_, d);
    }
  };
  dispatch_float(op, dtype, [&]<class T>(T) {
    const T* x = xv.data<T>();
    T *pa = a.data<T>(), *po = o.data<T>();
    each_packed_slice<T>(tape, dims, need(copies), copies, [&](SliceCopies<T>& c, int64_t b, int64_t head, int64_t bh) {
      read_qkv(c, x, b, head);
      attention_forward<T>(dims, {c.q, c.k, c.v, nullptr, b, head}, no_bias, pa + bh * T_ * T_, c.o);
      copy_slice_in(po + out.at(b, head), out.W, c.o, T_, d);
    });
  });
  Tape* tp = &tape;
  auto vjp = [=](const Tensor& g, std::span<Tensor> gin) {
    if (!gin[0].defined()) return;
    dispatch_float(op, dtype, [&]<class T>(T) {
      const T *x = xv.data<T>(), *pa = a.data<T>(), *po = o.data<T>(), *pg = g.data<T>();
      T* dx = gin[0].data<T>();
      const bool add = !tp->fresh_gradient(0);
      each_packed_slice<T>(*tp, dims, need(copies + block), copies + block,
                           [&](SliceCopies<T>& c, int64_t b, int64_t head, int64_t bh) {
                             read_qkv(c, x, b, head);
                             copy_slice_out(c.o, po + out.at(b, head), T_, d, out.W);
                             copy_slice_out(c.g, pg + out.at(b, head), T_, d, out.W);
                             std::fill(c.gq, c.gq + 3 * n, T(0));
                             attention_vjp<T>(dims, {c.q, c.k, c.v, nullptr, b, head}, pa + bh * T_ * T_, c.o, c.g,
                                              no_bias, c.gq, c.gk, c.gv, nullptr, c.rest);
                             add_into_qkv(dx, c, b, head, add);
                           });
    });
  };
  auto jvp = [=](std::span<const Tensor> tin, Tensor& tout) {
    if (!tin[0].defined()) return;
    dispatch_float(op, dtype, [&]<class T>(T) {
      const T *x = xv.data<T>(), *pa = a.data<T>(), *po = o.data<T>(), *tx = tin[0].data<T>();
      T* pt = tout.data<T>();
      each_packed_slice<T>(*tp, dims, need(copies + block), copies + block,
                           [&](SliceCopies<T>& c, int64_t b, int64_t head, int64_t bh) {
                             read_qkv(c, x, b, head);
                             read_heads(c.tq, c.tk, c.tv, tx, b, head);
                             copy_slice_out(c.o, po + out.at(b, head), T_, d, out.W);
                             std::fill(c.g, c.g + n, T(0));  // Ȯ of the slice
                             attention_jvp<T>(dims, {c.q, c.k, c.v, nullptr, b, head}, pa + bh * T_ * T_, c.o, c.tq,
                                              c.tk, c.tv, nullptr, no_bias, c.g, c.rest);
                             add_slice_in(pt + out.at(b, head), out.W, c.g, T_, d);
                           });
    });
  };
  auto second_order = [=](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
    if (!tin[0].defined() || !gin_dot[0].defined()) return;
    dispatch_float(op, dtype, [&]<class T>(T) {
      const T *x = xv.data<T>(), *pa = a.data<T>(), *pg = g.data<T>(), *tx = tin[0].data<T>();
      T* dx_dot = gin_dot[0].data<T>();
      each_packed_slice<T>(*tp, dims, need(copies + second), copies + second,
                           [&](SliceCopies<T>& c, int64_t b, int64_t head, int64_t bh) {
                             read_qkv(c, x, b, head);
                             read_heads(c.tq, c.tk, c.tv, tx, b, head);
                             copy_slice_out(c.g, pg + out.at(b, head), T_, d, out.W);
                             std::fill(c.gq, c.gq + 3 * n, T(0));
                             attention_second_order<T>(dims, c.q, c.k, c.v, b, head, pa + bh * T_ * T_, c.g, c.tq, c.tk,
                                                       c.tv, nullptr, no_bias, c.gq, c.gk, c.gv, nullptr, c.rest);
                             add_into_qkv(dx_dot, c, b, head);
                           });
    });
  };
  Var result = tape.record(op, {qkv}, o, vjp, jvp, second_order);
  tape.vjp_writes_fresh(result);
  return result;
}

// attention's worked example (`tapegrad explain attention --trace`, docs/learn.md §3): a batch of 2, one head,
// T = 3, d = 2, and a (T, T) bias shared by the batch; the forward and the VJP (attention_vjp's steps) written again
// with primitive ops, down to the bias's gradient, dS summed over the batch.
OpTrace attention_trace() {
  return {.example = {"B=2 h=1 T=3 d=2, a (3, 3) bias",
                      {{"q", {2, 1, 3, 2}}, {"k", {2, 1, 3, 2}}, {"v", {2, 1, 3, 2}}, {"bias", {3, 3}}},
                      [](Tape&, std::span<const Var> x) { return attention(x[0], x[1], x[2], {}, x[3]); }},
          .lines = [](TraceLines& t, std::span<const Var> x, const Var& g) -> std::vector<Var> {
            const Var &q = x[0], &k = x[1], &v = x[2], &bias = x[3];
            const double s = 1 / std::sqrt(static_cast<double>(q.shape()[q.rank() - 1]));  // 1/√d
            const Var scores = t.show("S = s·Q·Kᵀ + bias   (s = 1/√d)", add(scale(matmul(q, transpose(k)), s), bias));
            const Var a = t.show("A = softmax(S), per row", softmax(scores));
            const Var o = t.show("O = A·V", matmul(a, v));
            t.part("VJP (G = Ō given)");
            const Var dv = t.show("dV = Aᵀ·G", matmul(transpose(a), g));
            const Var da = t.show("dA = G·Vᵀ", matmul(g, transpose(v)));
            // softmax's row term, as attention_vjp computes it: from G and O, without dA
            const Var d = t.show("D = rowsum(G ⊙ O), one number per query row, as the code computes it",
                                 sum(mul(g, o), -1, true));
            t.show("rowsum(A ⊙ dA), softmax's ⟨y, ȳ⟩: the same D, as Σ_j A_ij (G_i·V_j) = G_i·(Σ_j A_ij V_j) = G_i·O_i",
                   sum(mul(a, da), -1, true));
            const Var ds = t.show("dS = A ⊙ (dA − D·1ᵀ)", mul(a, sub(da, d)));
            const Var dq = t.show("dQ = s·dS·K", scale(matmul(ds, k), s));
            const Var dk = t.show("dK = s·dSᵀ·Q", scale(matmul(transpose(ds), q), s));
            // the bias is read by every batch element and head it is broadcast over: dS summed over those axes
            Var db = ds;
            while (db.rank() > bias.rank()) db = sum(db, 0);
            for (int axis = 0; axis < bias.rank(); ++axis)
              if (bias.shape()[axis] == 1 && db.shape()[axis] != 1) db = sum(db, axis, true);
            db = t.show("d(bias) = dS summed over the axes the bias is broadcast along (batch, heads)", db);
            return {dq, dk, dv, db};
          }};
}

std::vector<OpSheet> attention_ops() {
  OpSheets r;
  // A case at `opt`: Q, K, V and, where a fourth input is given, the bias; with its unfused form at `opt`.
  auto qkv = [](std::string name, std::vector<InputSpec> inputs, AttentionOptions opt) {
    GradcheckCase c{std::move(name), std::move(inputs), [opt](Tape&, std::span<const Var> x) {
                      return attention(x[0], x[1], x[2], opt, x.size() > 3 ? x[3] : Var{});
                    }};
    c.unfused = unfused_attention_at(opt);
    return c;
  };
  const AttentionOptions plain{}, causal{0, true};
  // Where both nodes' formulas are: the kernels of this file, `more`, and the second-order rule.
  auto kernels_and = [](std::vector<FormulaPlace> more) {
    std::vector<FormulaPlace> places{{"forward", "ops/attention/softmax.cpp", "attention_forward"},
                                     {"VJP", "ops/attention/softmax.cpp", "attention_vjp"},
                                     {"JVP", "ops/attention/softmax.cpp", "attention_jvp"}};
    places.insert(places.end(), more.begin(), more.end());
    places.push_back({"second order", "ops/attention/kernels.hpp", "attention_second_order"});
    return places;
  };
  // One case per bias layout; B=2, h=3, T=4, Tk=4 (causal) or 5.
  auto bias_case = [&](const char* name, Shape bias, bool causal_mask) {
    const int64_t tk = causal_mask ? 4 : 5;
    return qkv(name, {{"q", {2, 3, 4, 3}}, {"k", {2, 3, tk, 3}}, {"v", {2, 3, tk, 2}}, {"bias", bias}},
               AttentionOptions{0, causal_mask});
  };
  r.add(
      {.name = "attention",
       .family = "attention/softmax",
       .forward = "O = AV, A = softmax(S) per row, S = s·QKᵀ + bias + M (M: −∞ above the diagonal when causal)",
       .vjp = "dV += AᵀG; dS = A ⊙ (GVᵀ − rowsum(G ⊙ O)1ᵀ); dQ += s·dS·K; dK += s·dSᵀ·Q; d(bias) += Σ_bcast dS",
       .jvp = "Ȯ = (A ⊙ Ż)V − rowsum(A ⊙ Ż) ⊙ O + AV̇ with Ż = s(Q̇Kᵀ + QK̇ᵀ) + ḃias",
       .second_order = attention_second_order_rule,
       .derivation = "2.1, 1.1, 5.3, 5.4",
       .second_order_derivation = "6.9",
       .formulas_at = kernels_and({{"softmax rows", "ops/row_maps.hpp", "softmax_row"},
                                   {"their VJP and JVP", "ops/row_maps.hpp", "softmax_row_derivative"}}),
       .cost = attention_cost,
       // Its gradcheck cases, each checked to first and second order by the suite:
       .cases = {qkv("B=2 h=2 T=4 d=3", {{"q", {2, 2, 4, 3}}, {"k", {2, 2, 4, 3}}, {"v", {2, 2, 4, 3}}}, plain),
                 qkv("causal B=1 h=2 T=7 d=5", {{"q", {1, 2, 7, 5}}, {"k", {1, 2, 7, 5}}, {"v", {1, 2, 7, 5}}}, causal),
                 qkv("T=3 Tk=5 dv=2 s=0.7", {{"q", {2, 1, 3, 4}}, {"k", {2, 1, 5, 4}}, {"v", {2, 1, 5, 2}}},
                     AttentionOptions{0.7, false}),
                 qkv("T=1 Tk=4", {{"q", {1, 2, 1, 3}}, {"k", {1, 2, 4, 3}}, {"v", {1, 2, 4, 3}}}, plain),
                 qkv("causal T=1", {{"q", {2, 1, 1, 3}}, {"k", {2, 1, 1, 3}}, {"v", {2, 1, 1, 2}}}, causal),
                 // Causal with T above kQueryBlock: three query blocks, each one's products cut at its last key; the
                 // bias shared by the four heads sums into dB from two threads' partial copies (two slices per thread).
                 qkv("causal T=70 bias (T,Tk)",
                     {{"q", {1, 4, 70, 3}}, {"k", {1, 4, 70, 3}}, {"v", {1, 4, 70, 2}}, {"bias", {70, 70}}}, causal),
                 bias_case("bias (B,h,T,Tk)", {2, 3, 4, 5}, false), bias_case("bias (h,T,Tk) causal", {3, 4, 4}, true),
                 bias_case("bias (T,Tk)", {4, 5}, false), bias_case("bias (B,1,T,Tk) causal", {2, 1, 4, 4}, true),
                 bias_case("bias (B,1,1,Tk)", {2, 1, 1, 5}, false)},
       // Q, K, V and an optional bias.
       .inputs = {3, 4},
       .call =
           [](std::span<const Var> x, const OpArgs& a) {
             return attention(x[0], x[1], x[2], attention_options(a), x.size() > 3 ? x[3] : Var{});
           },
       .unfused = unfused_attention_at(plain),
       .trace = attention_trace()});
  auto packed = [](int64_t heads, AttentionOptions opt) {
    return [heads, opt](Tape&, std::span<const Var> x) { return attention_qkv(x[0], heads, opt); };
  };
  r.add(
      {.name = "attention_qkv",
       .family = "attention/softmax",
       .forward = "O = attention(Q, K, V) per head, merged to (B, T, C); Q | K | V = qkv (B, T, 3C), h heads of d each",
       .vjp = "attention's VJP per head; dQ, dK, dV added into the columns of q̄kv their heads came from",
       .jvp = "attention's JVP per head on the heads of q̇kv; Ȯ merged as O",
       .second_order = attention_second_order_rule,
       .derivation = "2.1, 1.1",
       .second_order_derivation = "6.9",
       .formulas_at = kernels_and({{"the heads' copies", "ops/attention/softmax.cpp", "attention_qkv"}}),
       // attention's cost on its heads: B·h slices of T queries and keys, d = C/h wide, so 2·B·T²·(C + C)
       // whatever h is
       .cost =
           [](std::span<const Shape> in, const Shape&) {
             const Shape& x = in[0];
             const double B = static_cast<double>(x[0]), T = static_cast<double>(x[1]),
                          C = static_cast<double>(x[2] / 3);
             const double forward = 2 * B * T * T * (C + C);
             return OpCost{forward, 2 * forward, 2 * forward};
           },
       // Its gradcheck cases, each checked to first and second order by the suite:
       .cases = {{"B=2 T=4 C=6, 2 heads", {{"qkv", {2, 4, 18}}}, packed(2, plain)},
                 {"causal B=1 T=7 C=10, 2 heads", {{"qkv", {1, 7, 30}}}, packed(2, causal)},
                 // three query blocks, each one's products cut at its last key; two slices per thread
                 {"causal T=70 C=8, 4 heads, s=0.7", {{"qkv", {1, 70, 24}}}, packed(4, AttentionOptions{0.7, true})}},
       .inputs = 1,
       .call = [](std::span<const Var> x,
                  const OpArgs& a) { return attention_qkv(x[0], a.integer("heads"), attention_options(a)); },
       // The heads split out of qkv, S = s·QKᵀ, A = softmax(S), O = AV, the heads merged (the first case: 2 heads).
       .unfused =
           [](Tape&, std::span<const Var> x) {
             const int64_t C = x[0].shape()[2] / 3;
             const Var q = split_heads(x[0], 2, 0, C), k = split_heads(x[0], 2, C, C),
                       v = split_heads(x[0], 2, 2 * C, C);
             const Var s = scale(matmul(q, transpose(k)), 1 / std::sqrt(static_cast<double>(C / 2)));
             return merge_heads(matmul(softmax(s), v));
           }});
  return r.ops;
}

}  // namespace tapegrad
