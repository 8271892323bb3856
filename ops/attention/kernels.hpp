// What the attention nodes share (softmax.cpp, tiled.cpp, beta.cpp, linear.cpp): the shape checks and dims of
// Q (B, h, T, d), K (B, h, Tk, d), V (B, h, Tk, dv), where each (b, h) slice starts in the tensors, the query blocks,
// the cost of a softmax-family node, and the layout of an additive bias on the scores and its broadcast.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "attention.hpp"
#include "../products/blas.hpp"
#include "../sheet.hpp"
#include "../../engine/tensor.hpp"
#include "../common.hpp"

namespace tapegrad {

struct AttentionDims {
  int64_t B = 0, H = 0, T = 0, Tk = 0, d = 0, dv = 0;
  double scale = 0;  // s, resolved: opt.scale, or 1/√d when opt.scale == 0
  bool causal = false;
  int64_t heads() const { return B * H; }
  // Keys visible to query i: j < visible(i).
  int64_t visible(int64_t i) const { return causal ? i + 1 : Tk; }
  // Slices (b, h) per range when a loop over slices runs on the engine's threads: a range holds at least ~2¹⁶
  // multiply-adds of the score products, so that handing it to another thread (a microsecond or more) costs
  // little; gradcheck-sized slices stay on the calling thread.
  int64_t slice_grain() const {
    const int64_t work = std::max<int64_t>(T * Tk * (d + dv), 1);
    return std::max<int64_t>(1, (int64_t{1} << 16) / work);
  }
};

// Slice bh = b·H + head: the element offset where it starts in each tensor of the attention nodes, and its (b, head),
// which place it in a bias (BiasLayout::offset: a bias broadcast over b or h has no slice of its own). The gradients
// and tangents of Q, K, V and O share their tensors' offsets.
struct SliceOffsets {
  int64_t q, k, v;  // Q (B, h, T, d), K (B, h, Tk, d), V (B, h, Tk, dv)
  int64_t o;        // O and its gradient G (B, h, T, dv)
  int64_t scores;   // a (B, h, T, Tk) matrix of the scores' shape: A, Bβ
  int64_t rows;     // a (B, h, T) vector of one value per query: L, r, den
  int64_t b, head;
  SliceOffsets(const AttentionDims& dims, int64_t bh)
      : q(bh * dims.T * dims.d),
        k(bh * dims.Tk * dims.d),
        v(bh * dims.Tk * dims.dv),
        o(bh * dims.T * dims.dv),
        scores(bh * dims.T * dims.Tk),
        rows(bh * dims.T),
        b(bh / dims.H),
        head(bh % dims.H) {}
};

// One slice's inputs for the kernels: its Q, K, V, and the whole bias (null without one) with the slice's (b, head).
template <class T>
struct SliceInputs {
  const T *q, *k, *v, *bias;
  int64_t b, head;
};
template <class T>
SliceInputs<T> slice_inputs(const SliceOffsets& at, const T* q, const T* k, const T* v, const T* bias) {
  return {q + at.q, k + at.k, v + at.v, bias, at.b, at.head};
}

// The query blocks of attention() and beta_attention(): within a slice the queries go in blocks I = [i0, i1) of
// at most kQueryBlock rows. Under the causal mask block I sees keys j < i1 only, so every product of the block
// stops at column i1 and the causal nodes do about half the multiply-adds of the full T × Tk products. Without
// the mask a block is all T rows.
// 32 rows: at T = 64 the causal blocks skip a quarter of the score products, and at T = 1024 32-row products
// ran as fast as 64- or 128-row ones (measured on one thread).
inline constexpr int64_t kQueryBlock = 32;

// The query blocks of a slice: f(i0, rows, key_end) for rows [i0, i0 + rows) that see keys [0, key_end).
template <class F>
void for_each_query_block(const AttentionDims& dims, F&& f) {
  const int64_t block = dims.causal ? kQueryBlock : dims.T;
  for (int64_t i0 = 0; i0 < dims.T; i0 += block) {
    const int64_t rows = std::min(block, dims.T - i0);
    f(i0, rows, dims.causal ? i0 + rows : dims.Tk);
  }
}

// The most rows a query block holds: a (rows, Tk) scratch per thread fits any block of for_each_query_block.
inline int64_t max_query_block_rows(const AttentionDims& dims) {
  return std::min(dims.T, dims.causal ? kQueryBlock : dims.T);
}

// Checks ranks, dtypes, and that B, h, d and Tk agree; causal needs T = Tk. Throws naming `op` and the shapes.
inline AttentionDims attention_dims(const char* op, const Var& q, const Var& k, const Var& v,
                                    const AttentionOptions& opt) {
  auto rank4 = [op](const Var& x, const char* what, const char* layout) {
    if (x.rank() != 4) fail("{}: {} must have rank 4 {}, got shape {}", op, what, layout, x.shape());
  };
  rank4(q, "Q", "(B, h, T, d)");
  rank4(k, "K", "(B, h, Tk, d)");
  rank4(v, "V", "(B, h, Tk, dv)");
  expect_float(op, q);
  expect_same_dtype(op, q, k);
  expect_same_dtype(op, q, v);
  const Shape &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  if (ks[0] != qs[0] || ks[1] != qs[1] || vs[0] != qs[0] || vs[1] != qs[1])
    fail("{}: batch and head axes differ: Q {}, K {}, V {} (expected the same (B, h) in all three)", op, qs, ks, vs);
  if (ks[3] != qs[3]) fail("{}: Q {} and K {} differ in d (last axis: {} vs {})", op, qs, ks, qs[3], ks[3]);
  if (vs[2] != ks[2])
    fail("{}: K {} and V {} differ in the number of keys Tk (axis 2: {} vs {})", op, ks, vs, ks[2], vs[2]);
  if (ks[2] < 1) fail("{}: K {} has no keys (Tk = 0)", op, ks);
  if (qs[3] < 1) fail("{}: Q {} and K {} have an empty feature axis (d = 0)", op, qs, ks);
  if (vs[3] < 1) fail("{}: V {} has an empty feature axis (dv = 0)", op, vs);
  // A NaN or infinite s makes every score NaN or ±∞: the softmax would give NaN or zeros without a word.
  if (!std::isfinite(opt.scale)) fail("{}: scale must be a finite number (0: 1/√d), got {}", op, opt.scale);
  if (opt.causal && qs[2] != ks[2])
    fail("{}: causal attention needs as many queries as keys, got Q {} (T = {}) and K {} (Tk = {})", op, qs, qs[2], ks,
         ks[2]);
  AttentionDims dims;
  dims.B = qs[0];
  dims.H = qs[1];
  dims.T = qs[2];
  dims.Tk = ks[2];
  dims.d = qs[3];
  dims.dv = vs[3];
  dims.scale = opt.scale != 0 ? opt.scale : 1.0 / std::sqrt(static_cast<double>(qs[3]));
  dims.causal = opt.causal;
  return dims;
}

// The cost of a softmax-family attention node, counted as the full products S = QKᵀ (T×Tk×d) and O = AV
// (T×Tk×dv) per slice, as PyTorch's path computes them (causal nodes skip the tiles above the diagonal, so they
// run fewer); backward's four products (dV, dA, dQ, dK) twice that, and forward mode's four (Q̇Kᵀ, QK̇ᵀ,
// (A ⊙ Ż)V, AV̇) too.
inline OpCost attention_cost(std::span<const Shape> in, const Shape&) {
  const Shape &q = in[0], &k = in[1], &v = in[2];
  const double slices = static_cast<double>(q[0] * q[1]), T = static_cast<double>(q[2]), Tk = static_cast<double>(k[2]);
  const double forward = 2 * slices * T * Tk * static_cast<double>(q[3] + v[3]);
  return {forward, 2 * forward, 2 * forward};
}

// The map softmax attention computes at `opt`, as taped ops (softmax.cpp): S = s·QKᵀ (+ bias) (+ M, a constant −∞
// above the diagonal when causal), A = softmax(S), O = AV. The `unfused` picture of each case of attention and of
// tiled_attention, which computes the same map.
Function unfused_attention_at(const AttentionOptions& opt);

// The options of an attention node called by name (its sheet's .call): scale= (0: 1/√d) and causal=.
inline AttentionOptions attention_options(const OpArgs& a) { return {a.number("scale", 0.0), a.flag("causal", false)}; }

// The bias. An additive bias on the attention scores S (B, h, T, Tk), taken by softmax.cpp and tiled.cpp.
//
// The bias broadcasts to (B, h, T, Tk) as in NumPy: its shape is aligned from the right, a missing leading axis
// or a size-1 axis repeats. The layouts in use: (B,h,T,Tk) full, (h,T,Tk) shared over the batch, (T,Tk) shared
// over batch and heads, (B,1,T,Tk) shared over heads, (B,1,1,Tk) a key-padding bias.
//
// With S = s·QKᵀ + bias (bias broadcast by the map E: bias ↦ its (B,h,T,Tk) broadcast), the derivatives are
//   forward  S[b,h,i,j]  += bias[off(b,h,i,j)]
//   JVP      Ṡ[b,h,i,j]  += ḃias[off(b,h,i,j)]                     (E is linear)
//   VJP      d bias[o]   += Σ_{(b,h,i,j): off(b,h,i,j) = o} dS[b,h,i,j]   (Eᵀ: a sum over exactly the broadcast axes)
// where off() is a dot product with strides that are 0 on broadcast axes (docs/derivations.md §5.4: sum over the
// missing leading axes, then over the size-1 axes keeping dims). The VJP adds, so a bias shared by several nodes
// accumulates. Broadcast axes make several (b, h) slices add into one dB element: callers that split the (b, h) loop
// across threads must not run two slices that share dB elements at once.

// Element strides of a bias along (b, head, i, j); 0 where that axis is broadcast.
struct BiasLayout {
  int64_t stride_b = 0, stride_h = 0, stride_i = 0, stride_j = 0;

  int64_t offset(int64_t b, int64_t head, int64_t i, int64_t j) const {
    return b * stride_b + head * stride_h + i * stride_i + j * stride_j;
  }
  // The offset of bias element (b, head, i, 0): the start of that score row's bias.
  int64_t row_offset(int64_t b, int64_t head, int64_t i) const { return b * stride_b + head * stride_h + i * stride_i; }
};

// Checks that `bias` broadcasts to the scores (B, h, T, Tk) and returns its strides. Throws naming `op`.
inline BiasLayout bias_layout(const char* op, const Shape& bias, int64_t B, int64_t h, int64_t T, int64_t Tk) {
  const Shape scores{B, h, T, Tk};
  if (bias.rank() > 4)
    fail("{}: bias {} must broadcast to the scores {} (B, h, T, Tk); it has rank {} > 4", op, bias, scores,
         bias.rank());
  int64_t strides[4] = {0, 0, 0, 0};
  int64_t stride = 1;
  for (int axis = 3; axis >= 0; --axis) {
    const int bias_axis = axis - (4 - bias.rank());
    if (bias_axis < 0) break;  // a missing leading axis: stride 0
    const int64_t n = bias[bias_axis];
    if (n != scores[axis] && n != 1)
      fail(
          "{}: bias {} does not broadcast to the scores {} (B, h, T, Tk): axis {} has size {}, expected {} or 1; "
          "allowed are e.g. (B,h,T,Tk), (h,T,Tk), (T,Tk), (B,1,T,Tk), (B,1,1,Tk)",
          op, bias, scores, bias_axis, n, scores[axis]);
    strides[axis] = n == 1 ? 0 : stride;
    stride *= n;
  }
  return {strides[0], strides[1], strides[2], strides[3]};
}

// The layout of an optional bias (an undefined Var: none) on the scores of q, its dtype and broadcast checked.
inline BiasLayout bias_layout(const char* op, const Var& q, const Var& bias, const AttentionDims& dims) {
  if (!bias.defined()) return {};
  expect_same_dtype(op, q, bias);
  return bias_layout(op, bias.shape(), dims.B, dims.H, dims.T, dims.Tk);
}

// S[i0 + r, j0 + c] += bias[off(b, head, i0 + r, j0 + c)] for a block of `rows` × `cols` scores, row stride ld.
// The forward adds bias, the JVP adds its tangent.
template <class T>
void add_bias_block(const BiasLayout& L, T* s, int64_t ld, const T* bias, int64_t b, int64_t head, int64_t i0,
                    int64_t rows, int64_t j0, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* br = bias + L.row_offset(b, head, i0 + r) + j0 * L.stride_j;
    T* sr = s + r * ld;
    if (L.stride_j == 1)
      for (int64_t c = 0; c < cols; ++c) sr[c] += br[c];
    else
      for (int64_t c = 0; c < cols; ++c) sr[c] += br[0];
  }
}

// dB[off(b, head, i0 + r, j0 + c)] += dS[r, c] for a block of `rows` × `cols` score gradients, row stride ld:
// the adjoint of add_bias_block, summing over the broadcast axes.
template <class T>
void accumulate_bias_grad_block(const BiasLayout& L, T* dbias, const T* ds, int64_t ld, int64_t b, int64_t head,
                                int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    T* dr = dbias + L.row_offset(b, head, i0 + r) + j0 * L.stride_j;
    const T* gr = ds + r * ld;
    if (L.stride_j == 1) {
      for (int64_t c = 0; c < cols; ++c) dr[c] += gr[c];
    } else {
      T sum = 0;
      for (int64_t c = 0; c < cols; ++c) sum += gr[c];
      dr[0] += sum;
    }
  }
}

// The (T, Tk) matrices the second-order rule of softmax or β attention works in: six per slice, in one array of
// 6·T·Tk elements per range of its loop over slices (a chunk of the tape's scratch, engine/scratch.hpp: at long
// contexts they are megabytes, which fresh buffers would pay in page faults on every call).
inline constexpr int64_t kSecondOrderSliceMatrices = 6;
inline int64_t second_order_slice_elements(const AttentionDims& dims) {
  return kSecondOrderSliceMatrices * dims.T * dims.Tk;
}
// The six matrices of n elements each in `work`, zeroed (for each slice: the rule leaves what a missing tangent would
// give as it was).
template <class T>
std::array<T*, kSecondOrderSliceMatrices> zeroed_slice_matrices(T* work, int64_t n) {
  std::fill(work, work + kSecondOrderSliceMatrices * n, T(0));
  std::array<T*, kSecondOrderSliceMatrices> m;
  for (int64_t i = 0; i < kSecondOrderSliceMatrices; ++i) m[static_cast<size_t>(i)] = work + i * n;
  return m;
}

// The products that open the second-order rule of softmax and β attention, one slice, into (T, Tk) matrices:
// dA = GVᵀ; GV̇ᵀ when V has a tangent; s(Q̇Kᵀ + QK̇ᵀ) from the tangents Q and K have. What a missing tangent would
// give is left as it was (the callers start from zeros).
template <class T>
void second_order_scores(const AttentionDims& dims, const T* q, const T* k, const T* v, const T* g, const T* tq,
                         const T* tk, const T* tv, T* da, T* gv_dot, T* z) {
  const int64_t T_ = dims.T, Tk = dims.Tk, d = dims.d, dv = dims.dv;
  const T s = static_cast<T>(dims.scale);
  gemm(T_, Tk, dv, T(1), as_is(g, dv), transposed(v, dv), T(0), da, Tk);
  if (tv) gemm(T_, Tk, dv, T(1), as_is(g, dv), transposed(tv, dv), T(0), gv_dot, Tk);
  if (tq) gemm(T_, Tk, d, s, as_is(tq, d), transposed(k, d), T(0), z, Tk);
  if (tk) gemm(T_, Tk, d, s, as_is(q, d), transposed(tk, d), tq ? T(1) : T(0), z, Tk);
}

// The products that close it, one slice, from the moved weights Ȧ (T, Tk) and the score gradient dS and its
// tangent dṠ (T, Tk):  dV̇ += ȦᵀG,  dQ̇ += s(dṠ·K + dS·K̇),  dK̇ += s(dṠᵀ·Q + dSᵀ·Q̇). Outputs and tangents may be null.
template <class T>
void second_order_products(const AttentionDims& dims, const T* q, const T* k, const T* g, const T* tq, const T* tk,
                           const T* a_dot, const T* ds, const T* ds_dot, T* out_q, T* out_k, T* out_v) {
  const int64_t T_ = dims.T, Tk = dims.Tk, d = dims.d, dv = dims.dv;
  const T s = static_cast<T>(dims.scale);
  if (out_v) gemm(Tk, dv, T_, T(1), transposed(a_dot, Tk), as_is(g, dv), T(1), out_v, dv);
  if (out_q) {
    gemm(T_, d, Tk, s, as_is(ds_dot, Tk), as_is(k, d), T(1), out_q, d);
    if (tk) gemm(T_, d, Tk, s, as_is(ds, Tk), as_is(tk, d), T(1), out_q, d);
  }
  if (out_k) {
    gemm(Tk, d, T_, s, transposed(ds_dot, Tk), as_is(q, d), T(1), out_k, d);
    if (tq) gemm(Tk, d, T_, s, transposed(ds, Tk), as_is(tq, d), T(1), out_k, d);
  }
}

// The rule in one line, as the registry of both nodes gives it to tapegrad explain.
inline constexpr const char* attention_second_order_rule =
    "Ȧ = A ⊙ (Ż − rowsum(A ⊙ Ż)), dA = GVᵀ: dṠ = Ȧ ⊙ (dA − rowsum(A ⊙ dA)) − rowsum(Ȧ ⊙ dA)·A "
    "+ A ⊙ (GV̇ᵀ − rowsum(A ⊙ GV̇ᵀ)); dV̇ += ȦᵀG, dQ̇ += s(dṠ·K + dS·K̇), dK̇ += s(dṠᵀ·Q + dSᵀ·Q̇), d(bias) moves by Σ_bcast "
    "dṠ";

// Second order (Tape::hvp) of softmax attention (the fused and the tiled node), one slice (b, head) with its
// probabilities A (T, Tk): the tangent of the VJP at a fixed G (docs/derivations.md §6.9). With dA = GVᵀ and dS as
// in the VJP (ops/attention/softmax.cpp, attention_vjp), and the JVP's Ż = s(Q̇Kᵀ + QK̇ᵀ) + ḃias, Ȧ = A ⊙ (Ż − ⟨A_i, Ż_i⟩):
//   dṠ = Ȧ ⊙ (dA − ⟨A_i, dA_i⟩) − ⟨Ȧ_i, dA_i⟩·A + A ⊙ (GV̇ᵀ − ⟨A_i, (GV̇ᵀ)_i⟩)     (softmax's rule, ops/row_maps.hpp,
//                                                                             plus its VJP of the moved dA)
//   dV̇ += ȦᵀG,   dQ̇ += s(dṠ·K + dS·K̇),   dK̇ += s(dṠᵀ·Q + dSᵀ·Q̇),   d(bias) moves by Σ_bcast dṠ
// Dense over the (T, Tk) slice: A is 0 at masked entries, so the mask needs no other care. The products go through
// gemm (ops/products/blas.hpp), the row terms are plain loops. Outputs and tangents may be null. `work` holds
// second_order_slice_elements(dims) elements of scratch.
template <class T>
void attention_second_order(const AttentionDims& dims, const T* q, const T* k, const T* v, int64_t b, int64_t head,
                            const T* a, const T* g, const T* tq, const T* tk, const T* tv, const T* tbias,
                            const BiasLayout& L, T* out_q, T* out_k, T* out_v, T* out_bias, T* work) {
  const int64_t T_ = dims.T, Tk = dims.Tk;
  auto [da, ds, z, a_dot, da_dot, ds_dot] = zeroed_slice_matrices(work, T_ * Tk);
  second_order_scores(dims, q, k, v, g, tq, tk, tv, da, da_dot, z);  // dA, GV̇ᵀ, Ż − Ḃ
  if (tbias) add_bias_block(L, z, Tk, tbias, b, head, 0, T_, 0, Tk);
  for (int64_t i = 0; i < T_; ++i) {
    const T* ai = a + i * Tk;
    T a_da = 0, a_z = 0, a_dad = 0;
    for (int64_t j = 0; j < Tk; ++j) {
      const size_t e = static_cast<size_t>(i * Tk + j);
      a_da += ai[j] * da[e], a_z += ai[j] * z[e], a_dad += ai[j] * da_dot[e];
    }
    T adot_da = 0;
    for (int64_t j = 0; j < Tk; ++j) {
      const size_t e = static_cast<size_t>(i * Tk + j);
      ds[e] = ai[j] * (da[e] - a_da);
      a_dot[e] = ai[j] * (z[e] - a_z);
      adot_da += a_dot[e] * da[e];
    }
    for (int64_t j = 0; j < Tk; ++j) {
      const size_t e = static_cast<size_t>(i * Tk + j);
      ds_dot[e] = a_dot[e] * (da[e] - a_da) - adot_da * ai[j] + ai[j] * (da_dot[e] - a_dad);
    }
  }
  second_order_products(dims, q, k, g, tq, tk, a_dot, ds, ds_dot, out_q, out_k, out_v);
  if (out_bias) accumulate_bias_grad_block(L, out_bias, ds_dot, Tk, b, head, 0, T_, 0, Tk);
}

// Where each chunk of a VJP's parallel (b, h) loop adds its dB. Slices that share bias elements (a bias broadcast
// over b or h) must not add into them at once: then every chunk but the first sums into its own zeroed copy of dB
// (chunks − 1 copies of the tape's scratch, engine/scratch.hpp: need() says how much), which add_parts adds to dB in
// chunk order afterwards, so the sum is the same in every run. Without a dB (an undefined tensor) every target is
// null.
class BiasGradChunks {
 public:
  // Whether the copies are needed, for a dB (has_grad) of a bias of this layout, the loop in `chunks` ranges.
  static bool shared(bool has_grad, const BiasLayout& L, const AttentionDims& dims, int64_t chunks) {
    return has_grad && chunks > 1 && ((L.stride_b == 0 && dims.B > 1) || (L.stride_h == 0 && dims.H > 1));
  }
  // The scratch of the copies of a dB of `numel` elements: none where they are not needed.
  static ScratchNeed need(DType dtype, bool has_grad, int64_t numel, const BiasLayout& L, const AttentionDims& dims,
                          int64_t chunks) {
    return shared(has_grad, L, dims, chunks) ? scratch_need(dtype, {numel}, chunks - 1) : ScratchNeed{};
  }
  static ScratchNeed need(const Tensor& dbias, const BiasLayout& L, const AttentionDims& dims, int64_t chunks) {
    return need(dbias.dtype(), dbias.defined(), dbias.numel(), L, dims, chunks);
  }

  // `parts`: what the scratch gave for need(dbias, L, dims, chunks).
  BiasGradChunks(const Tensor& dbias, const BiasLayout& L, const AttentionDims& dims, int64_t chunks,
                 const ScratchChunks& parts)
      : dbias_(dbias), shared_(shared(dbias.defined(), L, dims, chunks)), parts_(parts), chunks_(chunks) {}

  // The dB of range `chunk`: call it once per range, at the range's start (a copy is zeroed here).
  template <class T>
  T* target(int64_t chunk) {
    if (!dbias_.defined()) return nullptr;
    if (!shared_ || chunk == 0) return dbias_.data<T>();
    return parts_.chunk(chunk - 1).zeroed<T>(dbias_.numel());
  }

  template <class T>
  void add_parts() {
    if (!shared_) return;
    T* db = dbias_.data<T>();
    for (int64_t c = 0; c + 1 < chunks_; ++c) {
      const T* part = parts_.chunk(c).take<T>(dbias_.numel());
      for (int64_t e = 0; e < dbias_.numel(); ++e) db[e] += part[e];
    }
  }

 private:
  Tensor dbias_;
  bool shared_;
  ScratchChunks parts_;
  int64_t chunks_;
};

}  // namespace tapegrad
