// Tiled attention: the map of attention() (docs/derivations.md §2.1, §5) computed tile by tile with an online softmax,
// so that the node keeps only O and the row log-sum-exp, never the T×Tk matrix A. This is the memory-lean node the
// attention-bias post aims at (its "minimal flashattn with trainable bias term"), with the gradient of the bias that
// fused kernels usually do not give (docs/derivations.md §5.6).
//
// Per (b, h) slice, tokens as rows: Q (T, d), K (Tk, d), V (Tk, dv), bias broadcast to (T, Tk), s the scale:
//   S = s·QKᵀ + bias + M,   A = softmax_row(S),   O = A·V        (M_ij = −∞ where causal hides key j > i)
// The scores are visited in tiles I × J of `block` query rows and `block` key columns. Under the causal mask a
// query tile I = [i0, i0 + r) sees keys j < i0 + r only, so the tiles entirely above the diagonal are skipped,
// and a tile that crosses the diagonal goes in sub-blocks of kSubRows query rows, each multiplied against the
// keys it sees only (at block = 64 this skips a quarter of a diagonal tile's products).
// Scratch per range of slices: two block×block tiles and a few block-long rows, whatever T. The slices (b, h) run on the
// engine's threads; float32 takes exp from ops/fast_math.hpp.
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

constexpr const char* kOp = "tiled_attention";

// The arrays of one range of slices: two block×block tiles and two block-long rows, from a chunk of the tape's
// scratch (engine/scratch.hpp; workspace_need gives its size). Not zeroed: every entry is written before it is read.
ScratchNeed workspace_need(DType dtype, int64_t block, int64_t chunks) {
  return scratch_need(dtype, {block * block, block * block, block, block}, chunks);
}
template <class T>
struct Workspace {
  Workspace(ScratchChunk s, int64_t block)
      : tile(s.take<T>(block * block)),
        tile2(s.take<T>(block * block)),
        row(s.take<T>(block)),
        row2(s.take<T>(block)) {}
  T *tile, *tile2, *row, *row2;
};

template <class T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// Keys visible to the query tile starting at i0 with r rows: causal tiles end at the tile's last query.
inline int64_t key_end(const AttentionDims& dims, int64_t i0, int64_t r) { return dims.causal ? i0 + r : dims.Tk; }

// Columns of the key tile [j0, j0 + c) that query i sees: all c, or under the causal mask the keys j ≤ i.
inline int64_t visible_cols(const AttentionDims& dims, int64_t i, int64_t j0, int64_t c) {
  return dims.causal ? std::clamp<int64_t>(i + 1 - j0, 0, c) : c;
}

constexpr int64_t kSubRows = 32;

// The parts of tile I × J (queries [i0, i0 + r), keys [j0, j0 + c)) that hold visible scores, as f(a0, rs, cs):
// rows [i0 + a0, i0 + a0 + rs) against keys [j0, j0 + cs). A tile below the diagonal (or without the mask) is
// one part; a tile that crosses it is cut into sub-blocks of kSubRows rows, and a sub-block's last row
// i0 + a0 + rs − 1 sees keys up to it, so cs = min(c, i0 + a0 + rs − j0). Entries outside the parts are masked.
template <class F>
void for_each_visible_part(const AttentionDims& dims, int64_t i0, int64_t r, int64_t j0, int64_t c, F&& f) {
  if (!dims.causal || j0 + c - 1 <= i0) return f(int64_t{0}, r, c);
  for (int64_t a0 = 0; a0 < r; a0 += kSubRows) {
    const int64_t rs = std::min(kSubRows, r - a0), cs = std::min(c, i0 + a0 + rs - j0);
    if (cs > 0) f(a0, rs, cs);
  }
}

// S = s·Q_I K_Jᵀ + B_IJ (r×c, row stride c) for queries [i0, i0 + r) and keys [j0, j0 + c). The causal mask M is
// not written here: the entries of keys j > query i are left as computed, and the softmax steps below read only
// each row's visible_cols and set the rest of the row to exp(−∞) = 0.
template <class T>
void score_tile(T* S, const SliceInputs<T>& x, const BiasLayout& L, const AttentionDims& dims, int64_t i0, int64_t r,
                int64_t j0, int64_t c) {
  gemm(r, c, dims.d, static_cast<T>(dims.scale), as_is(x.q + i0 * dims.d, dims.d),
       transposed(x.k + j0 * dims.d, dims.d), T(0), S, c);
  if (x.bias) add_bias_block(L, S, c, x.bias, x.b, x.head, i0, r, j0, c);
}

// A_IJ = exp(S − L_i) in place (r×c, queries [i0, i0 + r), keys [j0, j0 + c)): the softmax probabilities,
// recomputed from the saved row log-sum-exp L (lse, r). exp runs on the visible columns only; the masked ones
// are exp(−∞) = 0. A fully masked row (L_i = −∞) has A_i = 0, as in attention().
template <class T>
void probability_tile(T* S, const T* lse, const AttentionDims& dims, int64_t i0, int64_t r, int64_t j0, int64_t c) {
  for (int64_t a = 0; a < r; ++a) {
    T* s_row = S + a * c;
    const T l = lse[a];
    const int64_t vis = l == kNegInf<T> ? 0 : visible_cols(dims, i0 + a, j0, c);
    for (int64_t j = 0; j < vis; ++j) s_row[j] = fast_exp(s_row[j] - l);
    std::fill(s_row + vis, s_row + c, T(0));
  }
}

// ---- forward ----
// Online softmax over the key tiles J of a query tile, per row i: after the tiles seen so far
//   m_i = max_j S_ij,   ℓ_i = Σ_j exp(S_ij − m_i),   acc_i = Σ_j exp(S_ij − m_i) V_j
// and a new tile J rescales what was summed against the old maximum:
//   m′ = max(m, max_{j∈J} S_ij),  α = exp(m − m′),  ℓ′ = α·ℓ + Σ_{j∈J} exp(S_ij − m′),  acc′ = α·acc + P_J V_J
// with P_J = exp(S_iJ − m′) (every exponent ≤ 0, so logits of ±1e4 stay finite). At the end
//   O_i = acc_i/ℓ_i,   L_i = m_i + log ℓ_i = log Σ_j exp(S_ij)
// and L is all the backward needs to rebuild A_ij = exp(S_ij − L_i). A row with no visible key (all −∞ through
// the bias) keeps ℓ = 0: O_i = 0 and L_i = −∞.
// One step for rows [i, i + r) against keys [j0, j0 + c): P (r×c) holds their scores S on entry and P_J on exit;
// m, l (r) and acc (r, dv) are the rows' state. exp runs on the visible columns; masked ones are set to 0.
template <class T>
void online_softmax_step(T* P, T* m, T* l, T* acc, const AttentionDims& dims, int64_t i, int64_t r, int64_t j0,
                         int64_t c) {
  for (int64_t a = 0; a < r; ++a) {
    T* p_row = P + a * c;
    const int64_t vis = visible_cols(dims, i + a, j0, c);
    const T m_new = lane_max(p_row, vis, m[a]);
    if (m_new == kNegInf<T>) {  // nothing visible yet in this row
      std::fill(p_row, p_row + c, T(0));
      continue;
    }
    for (int64_t j = 0; j < vis; ++j) p_row[j] = fast_exp(p_row[j] - m_new);
    std::fill(p_row + vis, p_row + c, T(0));
    const T alpha = fast_exp(m[a] - m_new);  // 0 while m = −∞
    l[a] = alpha * l[a] + lane_sum(p_row, vis);
    if (m[a] != kNegInf<T> && alpha != T(1))  // acc is still 0 while m = −∞
      for (int64_t e = 0; e < dims.dv; ++e) acc[a * dims.dv + e] *= alpha;
    m[a] = m_new;
  }
}

// o (T, dv), lse (T) of one slice.
template <class T>
void tiled_attention_forward(T* o, T* lse, const SliceInputs<T>& x, const BiasLayout& L, const AttentionDims& dims,
                             int64_t block, Workspace<T>& w) {
  T *P = w.tile, *m = w.row, *l = w.row2;
  for (int64_t i0 = 0; i0 < dims.T; i0 += block) {
    const int64_t r = std::min(block, dims.T - i0);
    T* oI = o + i0 * dims.dv;
    std::fill(m, m + r, kNegInf<T>);
    std::fill(l, l + r, T(0));
    std::fill(oI, oI + r * dims.dv, T(0));
    for (int64_t j0 = 0, j_end = key_end(dims, i0, r); j0 < j_end; j0 += block) {
      const int64_t c = std::min(block, j_end - j0);
      for_each_visible_part(dims, i0, r, j0, c, [&](int64_t a0, int64_t rs, int64_t cs) {
        T* acc = oI + a0 * dims.dv;
        score_tile(P, x, L, dims, i0 + a0, rs, j0, cs);
        online_softmax_step(P, m + a0, l + a0, acc, dims, i0 + a0, rs, j0, cs);
        gemm(rs, dims.dv, cs, T(1), as_is(P, cs), as_is(x.v + j0 * dims.dv, dims.dv), T(1), acc, dims.dv);
      });
    }
    for (int64_t a = 0; a < r; ++a) {
      if (l[a] == T(0)) {
        lse[i0 + a] = kNegInf<T>;
        continue;
      }
      const T inv = 1 / l[a];
      for (int64_t e = 0; e < dims.dv; ++e) oI[a * dims.dv + e] *= inv;
      lse[i0 + a] = m[a] + std::log(l[a]);
    }
  }
}

// ---- VJP ----
// The steps of ops/attention/softmax.cpp's attention_vjp (derived there), tile by tile, with A_IJ recomputed from L:
// D_I = G_I·O_I once per query block (it needs O only), then from each tile dV_J, dS_IJ, dQ_I, dK_J and dB.
// A is 0 at masked entries, so dS is 0 there. Each product runs on the visible parts of the tile (rows
// I′ ⊆ I, keys J′ ⊆ J, for_each_visible_part): the masked rest of A and dS is 0 and adds nothing.
// gq, gk, gv, gbias are added into; null ones are not computed.
template <class T>
void tiled_attention_vjp(T* gq, T* gk, T* gv, T* gbias, const T* g, const T* o, const T* lse, const SliceInputs<T>& x,
                         const BiasLayout& L, const AttentionDims& dims, int64_t block, Workspace<T>& w) {
  T *A = w.tile, *dS = w.tile2, *D = w.row;
  const T s = static_cast<T>(dims.scale);
  const bool need_ds = gq || gk || gbias;
  for (int64_t i0 = 0; i0 < dims.T; i0 += block) {
    const int64_t r = std::min(block, dims.T - i0);
    for (int64_t a = 0; a < r; ++a) D[a] = lane_dot(g + (i0 + a) * dims.dv, o + (i0 + a) * dims.dv, dims.dv);
    for (int64_t j0 = 0, j_end = key_end(dims, i0, r); j0 < j_end; j0 += block) {
      const int64_t c = std::min(block, j_end - j0);
      for_each_visible_part(dims, i0, r, j0, c, [&](int64_t a0, int64_t rs, int64_t cs) {
        const int64_t i = i0 + a0;  // rows [i, i + rs), keys [j0, j0 + cs)
        const T* gi = g + i * dims.dv;
        score_tile(A, x, L, dims, i, rs, j0, cs);
        probability_tile(A, lse + i, dims, i, rs, j0, cs);
        if (gv) gemm(cs, dims.dv, rs, T(1), transposed(A, cs), as_is(gi, dims.dv), T(1), gv + j0 * dims.dv, dims.dv);
        if (!need_ds) return;
        gemm(rs, cs, dims.dv, T(1), as_is(gi, dims.dv), transposed(x.v + j0 * dims.dv, dims.dv), T(0), dS, cs);
        for (int64_t a = 0; a < rs; ++a) {  // dS on the visible columns, 0 on the rest
          T *ds_row = dS + a * cs, *a_row = A + a * cs;
          const int64_t vis = visible_cols(dims, i + a, j0, cs);
          softmax_row_derivative<Into::replace>(ds_row, a_row, ds_row, D[a0 + a], vis);
          std::fill(ds_row + vis, ds_row + cs, T(0));
        }
        if (gq) gemm(rs, dims.d, cs, s, as_is(dS, cs), as_is(x.k + j0 * dims.d, dims.d), T(1), gq + i * dims.d, dims.d);
        if (gk)
          gemm(cs, dims.d, rs, s, transposed(dS, cs), as_is(x.q + i * dims.d, dims.d), T(1), gk + j0 * dims.d, dims.d);
        if (gbias) accumulate_bias_grad_block(L, gbias, dS, cs, x.b, x.head, i, rs, j0, cs);
      });
    }
  }
}

// ---- JVP ----
// The β-attention post's total derivative of attention (docs/derivations.md §1.1), with the scale and the bias:
//   Ż = s(Q̇Kᵀ + QK̇ᵀ) + Ḃ,   Ȯ_i = Σ_j A_ij Ż_ij V_j − (Σ_j A_ij Ż_ij)·O_i + Σ_j A_ij V̇_j
// summed tile by tile (on the visible parts of each tile, as the VJP): per part, Z = A_IJ ⊙ Ż_IJ adds Z V_J and
// A_IJ V̇_J to Ȯ_I and rowsum(Z) to ι_I; after the last tile Ȯ_i −= ι_i·O_i. (The post writes the middle term
// with 1_nᵀ; O is T×dv, so it is 1_dvᵀ.)
// q_dot, k_dot, v_dot, bias_dot are null where the tangent is zero; the result is added into o_dot.
template <class T>
void tiled_attention_jvp(T* o_dot, const T* q_dot, const T* k_dot, const T* v_dot, const T* bias_dot, const T* o,
                         const T* lse, const SliceInputs<T>& x, const BiasLayout& L, const AttentionDims& dims,
                         int64_t block, Workspace<T>& w) {
  T *A = w.tile, *Z = w.tile2, *iota = w.row;
  const T s = static_cast<T>(dims.scale);
  const bool need_z = q_dot || k_dot || bias_dot;
  for (int64_t i0 = 0; i0 < dims.T; i0 += block) {
    const int64_t r = std::min(block, dims.T - i0);
    T* odI = o_dot + i0 * dims.dv;
    std::fill(iota, iota + r, T(0));
    for (int64_t j0 = 0, j_end = key_end(dims, i0, r); j0 < j_end; j0 += block) {
      const int64_t c = std::min(block, j_end - j0);
      for_each_visible_part(dims, i0, r, j0, c, [&](int64_t a0, int64_t rs, int64_t cs) {
        const int64_t i = i0 + a0;  // rows [i, i + rs), keys [j0, j0 + cs)
        T* od = odI + a0 * dims.dv;
        score_tile(A, x, L, dims, i, rs, j0, cs);
        probability_tile(A, lse + i, dims, i, rs, j0, cs);
        if (need_z) {
          if (!q_dot && !k_dot) std::fill(Z, Z + rs * cs, T(0));
          if (q_dot)
            gemm(rs, cs, dims.d, s, as_is(q_dot + i * dims.d, dims.d), transposed(x.k + j0 * dims.d, dims.d), T(0), Z,
                 cs);
          if (k_dot)
            gemm(rs, cs, dims.d, s, as_is(x.q + i * dims.d, dims.d), transposed(k_dot + j0 * dims.d, dims.d),
                 T(q_dot ? 1 : 0), Z, cs);
          if (bias_dot) add_bias_block(L, Z, cs, bias_dot, x.b, x.head, i, rs, j0, cs);
          for (int64_t a = 0; a < rs; ++a)
            for (int64_t j = 0; j < cs; ++j) {
              Z[a * cs + j] *= A[a * cs + j];
              iota[a0 + a] += Z[a * cs + j];
            }
          gemm(rs, dims.dv, cs, T(1), as_is(Z, cs), as_is(x.v + j0 * dims.dv, dims.dv), T(1), od, dims.dv);
        }
        if (v_dot) gemm(rs, dims.dv, cs, T(1), as_is(A, cs), as_is(v_dot + j0 * dims.dv, dims.dv), T(1), od, dims.dv);
      });
    }
    if (need_z)
      for (int64_t a = 0; a < r; ++a)
        for (int64_t e = 0; e < dims.dv; ++e) odI[a * dims.dv + e] -= iota[a] * o[(i0 + a) * dims.dv + e];
  }
}

}  // namespace

Var tiled_attention(Var q, Var k, Var v, const AttentionOptions& opt, Var bias, int64_t block) {
  Tape& tape = bias.defined() ? tape_of(kOp, {q, k, v, bias}) : tape_of(kOp, {q, k, v});
  const AttentionDims dims = attention_dims(kOp, q, k, v, opt);
  if (block < 1) fail("{}: block must be at least 1 key column, got {} (q {})", kOp, block, q.shape());
  const BiasLayout layout = bias_layout(kOp, q, bias, dims);
  const Tensor bv = bias.defined() ? bias.value() : Tensor{};
  const DType dtype = q.dtype();
  const Tensor qv = q.value(), kv = k.value(), vv = v.value();
  // The node's whole saved state: O (B, h, T, dv) and L (B, h, T), next to the inputs' own values.
  Tensor o = tape.empty(dtype, {dims.B, dims.H, dims.T, dims.dv});
  Tensor lse = tape.empty(dtype, {dims.B, dims.H, dims.T}, "L = m + log ℓ per row");
  const int64_t blk = std::min(block, std::max(dims.T, dims.Tk));
  const int64_t heads = dims.heads(), grain = dims.slice_grain();
  // Scratch (engine/scratch.hpp), per range of the loops over slices: the forward's, VJP's and JVP's Workspace; for
  // the second-order rule, A and the rule's six (T, Tk) matrices; and copies of dB where slices share bias elements.
  const int64_t slice_scores = dims.T * dims.Tk, work_elements = second_order_slice_elements(dims);
  auto slices_need = [=](int64_t chunks) { return scratch_need(dtype, {slice_scores, work_elements}, chunks); };
  {
    const int64_t chunks = parallel_chunks(heads, grain);
    const bool bias_grad = bias.defined() && bias.requires_grad();
    const size_t parts = BiasGradChunks::need(dtype, bias_grad, bv.numel(), layout, dims, chunks).bytes();
    reserve_scratch(tape, workspace_need(dtype, blk, chunks).bytes() + parts, slices_need(chunks).bytes() + parts);
  }
  Tape* tp = &tape;
  const ScratchChunks forward_chunks =
      tape.scratch().take(workspace_need(dtype, blk, parallel_chunks(heads, grain)))[0];
  dispatch_float(kOp, dtype, [&]<class T>(T) {
    parallel_for(heads, grain, [&](int64_t begin, int64_t end, int64_t chunk) {
      Workspace<T> w(forward_chunks.chunk(chunk), blk);
      for (int64_t bh = begin; bh < end; ++bh) {
        const SliceOffsets at(dims, bh);
        const SliceInputs<T> x = slice_inputs(at, qv.data<T>(), kv.data<T>(), vv.data<T>(), data_or_null<T>(bv));
        tiled_attention_forward(o.data<T>() + at.o, lse.data<T>() + at.rows, x, layout, dims, blk, w);
      }
    });
  });
  auto vjp = [=](const Tensor& g, std::span<Tensor> gin) {
    const Tensor gbias = gin.size() > 3 ? gin[3] : Tensor{};
    const int64_t chunks = parallel_chunks(heads, grain);
    const std::array<ScratchChunks, 2> taken =
        tp->scratch().take(workspace_need(dtype, blk, chunks), BiasGradChunks::need(gbias, layout, dims, chunks));
    const ScratchChunks& w_chunks = taken[0];
    const ScratchChunks& parts = taken[1];
    BiasGradChunks gbias_at(gbias, layout, dims, chunks, parts);
    dispatch_float(kOp, dtype, [&]<class T>(T) {
      T *gq = data_or_null<T>(gin[0]), *gk = data_or_null<T>(gin[1]), *gv = data_or_null<T>(gin[2]);
      parallel_for(heads, grain, [&](int64_t begin, int64_t end, int64_t chunk) {
        Workspace<T> w(w_chunks.chunk(chunk), blk);
        T* gb_chunk = gbias_at.target<T>(chunk);
        for (int64_t bh = begin; bh < end; ++bh) {
          const SliceOffsets at(dims, bh);
          const SliceInputs<T> x = slice_inputs(at, qv.data<T>(), kv.data<T>(), vv.data<T>(), data_or_null<T>(bv));
          tiled_attention_vjp(offset_or_null(gq, at.q), offset_or_null(gk, at.k), offset_or_null(gv, at.v), gb_chunk,
                              g.data<T>() + at.o, o.data<T>() + at.o, lse.data<T>() + at.rows, x, layout, dims, blk, w);
        }
      });
      gbias_at.add_parts<T>();
    });
  };
  auto jvp = [=](std::span<const Tensor> tin, Tensor& tout) {
    const Tensor tbias = tin.size() > 3 ? tin[3] : Tensor{};
    const ScratchChunks w_chunks = tp->scratch().take(workspace_need(dtype, blk, parallel_chunks(heads, grain)))[0];
    dispatch_float(kOp, dtype, [&]<class T>(T) {
      const T *tq = data_or_null<T>(tin[0]), *tk = data_or_null<T>(tin[1]), *tv = data_or_null<T>(tin[2]);
      parallel_for(heads, grain, [&](int64_t begin, int64_t end, int64_t chunk) {
        Workspace<T> w(w_chunks.chunk(chunk), blk);
        for (int64_t bh = begin; bh < end; ++bh) {
          const SliceOffsets at(dims, bh);
          const SliceInputs<T> x = slice_inputs(at, qv.data<T>(), kv.data<T>(), vv.data<T>(), data_or_null<T>(bv));
          tiled_attention_jvp(tout.data<T>() + at.o, offset_or_null(tq, at.q), offset_or_null(tk, at.k),
                              offset_or_null(tv, at.v), data_or_null<T>(tbias), o.data<T>() + at.o,
                              lse.data<T>() + at.rows, x, layout, dims, blk, w);
        }
      });
    });
  };
  // Second order: the fused node's rule (ops/attention/kernels.hpp) on A = exp(S − L) rebuilt per slice, whole:
  // a (T, Tk) matrix at a time, which the first order never holds (a Hessian-vector product is not a training path).
  auto second = [=](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
    const Tensor tbias = tin.size() > 3 ? tin[3] : Tensor{}, dbias_dot = gin_dot.size() > 3 ? gin_dot[3] : Tensor{};
    const int64_t chunks = parallel_chunks(heads, grain);
    const std::array<ScratchChunks, 2> taken =
        tp->scratch().take(slices_need(chunks), BiasGradChunks::need(dbias_dot, layout, dims, chunks));
    const ScratchChunks& work_chunks = taken[0];
    const ScratchChunks& parts = taken[1];
    BiasGradChunks dbias_dot_at(dbias_dot, layout, dims, chunks, parts);
    dispatch_float(kOp, dtype, [&]<class T>(T) {
      const T *tq = data_or_null<T>(tin[0]), *tk = data_or_null<T>(tin[1]), *tv = data_or_null<T>(tin[2]);
      T *dq_dot = data_or_null<T>(gin_dot[0]), *dk_dot = data_or_null<T>(gin_dot[1]);
      T* dv_dot = data_or_null<T>(gin_dot[2]);
      parallel_for(heads, grain, [&](int64_t begin, int64_t end, int64_t chunk) {
        T* db_dot_chunk = dbias_dot_at.target<T>(chunk);
        ScratchChunk mine = work_chunks.chunk(chunk);
        T *a = mine.zeroed<T>(slice_scores), *work = mine.take<T>(work_elements);
        for (int64_t bh = begin; bh < end; ++bh) {
          const SliceOffsets at(dims, bh);
          const SliceInputs<T> x = slice_inputs(at, qv.data<T>(), kv.data<T>(), vv.data<T>(), data_or_null<T>(bv));
          score_tile(a, x, layout, dims, 0, dims.T, 0, dims.Tk);
          probability_tile(a, lse.data<T>() + at.rows, dims, 0, dims.T, 0, dims.Tk);
          attention_second_order<T>(dims, x.q, x.k, x.v, x.b, x.head, a, g.data<T>() + at.o, offset_or_null(tq, at.q),
                                    offset_or_null(tk, at.k), offset_or_null(tv, at.v), data_or_null<T>(tbias), layout,
                                    offset_or_null(dq_dot, at.q), offset_or_null(dk_dot, at.k),
                                    offset_or_null(dv_dot, at.v), db_dot_chunk, work);
        }
      });
      dbias_dot_at.add_parts<T>();
    });
  };
  if (bias.defined()) return tape.record(kOp, {q, k, v, bias}, o, vjp, jvp, second);
  return tape.record(kOp, {q, k, v}, o, vjp, jvp, second);
}

std::vector<OpSheet> tiled_attention_ops() {
  OpSheets r;
  // A case at `opt` in tiles of `block`: Q, K, V and, where a fourth input is given, the bias; with its unfused form
  // at `opt` (the tiles are how the map is computed, not what it is).
  auto qkv = [](std::string name, std::vector<InputSpec> inputs, AttentionOptions opt, int64_t block) {
    GradcheckCase c{std::move(name), std::move(inputs), [opt, block](Tape&, std::span<const Var> x) {
                      return tiled_attention(x[0], x[1], x[2], opt, x.size() > 3 ? x[3] : Var{}, block);
                    }};
    c.unfused = unfused_attention_at(opt);
    return c;
  };
  auto qkv_inputs = [](int64_t B, int64_t h, int64_t T, int64_t Tk, int64_t d, int64_t dv) {
    return std::vector<InputSpec>{{"q", {B, h, T, d}}, {"k", {B, h, Tk, d}}, {"v", {B, h, Tk, dv}}};
  };
  auto with_bias = [](std::vector<InputSpec> inputs, Shape bias) {
    inputs.push_back({"bias", bias});
    return inputs;
  };
  const AttentionOptions plain{}, causal{0, true};
  // One case per bias layout; B=2, h=2, T=7, Tk=7 (causal) or 5, block=3.
  auto bias_case = [&](const char* name, Shape bias, bool causal_mask) {
    const int64_t tk = causal_mask ? 7 : 5;
    return qkv(name, with_bias(qkv_inputs(2, 2, 7, tk, 3, 2), bias), AttentionOptions{0, causal_mask}, 3);
  };
  r.add(
      {.name = kOp,
       .family = "attention/tiled",
       .forward = "attention's O = softmax(s·QKᵀ + bias + M)·V, over key blocks with an online softmax (m, ℓ per row)",
       .vjp = "online softmax keeps O and L = m + log ℓ; A_IJ = exp(S_IJ − L); "
              "dS = A ⊙ (GVᵀ − rowsum(G ⊙ O)1ᵀ); dQ += s·dS·K; dK += s·dSᵀ·Q; dV += AᵀG; d(bias) += Σ_bcast dS",
       .jvp = "Ȯ = (A ⊙ Ż)V − rowsum(A ⊙ Ż) ⊙ O + AV̇, tile by tile",
       .second_order = attention_second_order_rule,
       .derivation = "5.6, 2.1",
       .second_order_derivation = "6.9",
       .formulas_at = {{"forward", "ops/attention/tiled.cpp", "tiled_attention_forward"},
                       {"VJP", "ops/attention/tiled.cpp", "tiled_attention_vjp"},
                       {"JVP", "ops/attention/tiled.cpp", "tiled_attention_jvp"},
                       {"second order", "ops/attention/kernels.hpp", "attention_second_order"}},
       .cost = attention_cost,
       // Its gradcheck cases, each checked to first and second order by the suite:
       .cases = {qkv("T=7 d=5 dv=3 block=3", qkv_inputs(2, 2, 7, 7, 5, 3), plain, 3),
                 qkv("causal T=7 d=5 dv=3 block=3", qkv_inputs(2, 2, 7, 7, 5, 3), causal, 3),
                 qkv("causal T=7 block=2", qkv_inputs(1, 2, 7, 7, 3, 2), causal, 2),
                 qkv("T=5 Tk=8 block=3 s=0.7", qkv_inputs(2, 1, 5, 8, 4, 2), AttentionOptions{0.7, false}, 3),
                 qkv("causal T=7 one tile (block=64)", qkv_inputs(1, 2, 7, 7, 4, 3), causal, 64),
                 qkv("causal T=1", qkv_inputs(2, 1, 1, 1, 3, 2), causal, 3),
                 // Diagonal tiles of more than kSubRows rows go in sub-blocks: 45 = 32 + 13 rows in one tile; at T=70
                 // the second query tile [48, 70) has one full key tile and a diagonal one of 22 rows.
                 qkv("causal T=45 block=48 (sub-blocks)", qkv_inputs(1, 2, 45, 45, 3, 2), causal, 48),
                 qkv("causal T=70 block=48 (sub-blocks)", qkv_inputs(1, 1, 70, 70, 3, 2), causal, 48),
                 bias_case("bias (B,h,T,Tk) block=3", {2, 2, 7, 5}, false),
                 bias_case("bias (B,h,T,Tk) causal block=3", {2, 2, 7, 7}, true),
                 bias_case("bias (h,T,Tk) causal block=3", {2, 7, 7}, true),
                 bias_case("bias (T,Tk) block=3", {7, 5}, false),
                 bias_case("bias (B,1,T,Tk) causal block=3", {2, 1, 7, 7}, true),
                 bias_case("bias (B,1,1,Tk) block=3", {2, 1, 1, 5}, false),
                 qkv("bias (T,Tk) causal T=40 block=40 (sub-blocks)",
                     with_bias(qkv_inputs(1, 1, 40, 40, 3, 2), {40, 40}), causal, 40)},
       // Q, K, V and an optional bias.
       .inputs = {3, 4},
       .call =
           [](std::span<const Var> x, const OpArgs& a) {
             return tiled_attention(x[0], x[1], x[2], attention_options(a), x.size() > 3 ? x[3] : Var{},
                                    a.integer("block", 64));
           },
       // The map attention's is; the tiles and the online softmax are how it is computed, not what.
       .unfused = unfused_attention_at(plain)});
  return r.ops;
}

}  // namespace tapegrad
