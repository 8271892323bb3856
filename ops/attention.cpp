// Standard attention with an optional trainable additive bias, as one node (seeds 001, 004; math-notes §2–3).
//
// Per (b, h) slice, tokens as rows: Q (T, d), K (Tk, d), V (Tk, dv), the bias broadcast to (T, Tk),
// G = ∂L/∂O (T, dv), s the scale:
//   S = s·QKᵀ + B + M        M_ij = 0 where key j is visible to query i, −∞ where it is masked (causal: j > i)
//   A = softmax_row(S)        (T, Tk), exactly 0 at masked entries
//   O = A·V                   (T, dv)
// The node keeps A and O; the backward needs no other n×n tensor than one (T, Tk) scratch per slice.
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/blas.hpp"
#include "ops/attention.hpp"
#include "ops/attention_bias.hpp"
#include "ops/attention_shapes.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

// a[0..n) ← softmax(a[0..visible)) padded with zeros: a_j = exp(a_j − max) / Σ exp(a_k − max) for j < visible.
// Subtracting the row maximum keeps exp ≤ 1 (logits of ±1e4 stay finite). A row whose visible scores are all
// −∞ (fully masked by the bias) is defined as A_i = 0, so O_i = 0 and it passes no gradient.
template <class T>
void masked_softmax_row(T* a, int64_t visible, int64_t n) {
  T max = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < visible; ++j) max = std::max(max, a[j]);
  if (max == -std::numeric_limits<T>::infinity()) {
    std::fill(a, a + n, T(0));
    return;
  }
  T sum = 0;
  for (int64_t j = 0; j < visible; ++j) {
    a[j] = std::exp(a[j] - max);
    sum += a[j];
  }
  const T inv = 1 / sum;
  for (int64_t j = 0; j < visible; ++j) a[j] *= inv;
  std::fill(a + visible, a + n, T(0));
}

// Forward over all (b, h):  S = s·QKᵀ (gemm) + B (broadcast),  A = softmax_row(S + M),  O = A·V (gemm).
// q (B,h,T,d), k (B,h,Tk,d), v (B,h,Tk,dv), bias broadcast to (B,h,T,Tk) or null → a (B,h,T,Tk), o (B,h,T,dv).
template <class T>
void attention_forward(const AttentionDims& D, const T* q, const T* k, const T* v, const T* bias,
                       const BiasLayout& L, T* a, T* o) {
  const T s = static_cast<T>(D.scale);
  for (int64_t b = 0; b < D.B; ++b)
    for (int64_t h = 0; h < D.H; ++h) {
      const int64_t bh = b * D.H + h;
      T* a_bh = a + bh * D.T * D.Tk;
      gemm(false, true, D.T, D.Tk, D.d, s, q + bh * D.T * D.d, D.d, k + bh * D.Tk * D.d, D.d, T(0), a_bh, D.Tk);
      if (bias) add_bias_block(L, a_bh, D.Tk, bias, b, h, 0, D.T, 0, D.Tk);
      for (int64_t i = 0; i < D.T; ++i) masked_softmax_row(a_bh + i * D.Tk, D.visible(i), D.Tk);
      gemm(false, false, D.T, D.dv, D.Tk, T(1), a_bh, D.Tk, v + bh * D.Tk * D.dv, D.dv, T(0), o + bh * D.T * D.dv,
           D.dv);
    }
}

// VJP (seed 001's gradient in the vectorized form of math-notes §2, with seed 004's bias):
//   dV += AᵀG                                  (Tk, dv)
//   dA  = GVᵀ                                  (T, Tk)
//   D   = rowsum(A ⊙ dA) = rowsum(G ⊙ O)      (T):   Σ_j A_ij (G_i·V_j) = G_i·(Σ_j A_ij V_j) = G_i·O_i,
//                                                    so D costs O(T·dv) and no (T, Tk) temporary
//   dS  = A ⊙ (dA − D·1ᵀ)                     (T, Tk): the softmax VJP row by row, dσ(p)ᵀ = diag(σ) − σσᵀ
//   dQ += s·dS·K,   dK += s·dSᵀ·Q,   dB += dS summed over the broadcast axes of B (math-notes §3)
// A is 0 at masked entries, so dS is 0 there with no extra mask (−∞ masking, math-notes §6).
// Where this departs from seed 004: its prose dS = dA ⊙ (dA − (dA·Aᵀ)1) is wrong twice, the first factor must
// be A, and the row term must be rowsum(A ⊙ dA), the DIAGONAL of dA·Aᵀ, not the row sums of dA·Aᵀ. Its code
// line `dS = dA * A - (A * dA).sum(dim=-1, keepdim=True) * A` (`*` element-wise), i.e. A ⊙ (dA − D·1ᵀ), is the
// form used here. Its prose dQ = dS·K and dK = dS·Q omit the scale s and the transpose of dS. Seed 001's Ω is
// this dS (with s = 1); its per-row loop is replaced by gemm.
// dq, dk, dv, dbias may be null (no gradient wanted); ds is a (T, Tk) scratch.
template <class T>
void attention_vjp(const AttentionDims& D, const T* q, const T* k, const T* v, const T* a, const T* o, const T* g,
                   const BiasLayout& L, T* dq, T* dk, T* dv, T* dbias, T* ds) {
  const T s = static_cast<T>(D.scale);
  const bool need_ds = dq || dk || dbias;
  for (int64_t b = 0; b < D.B; ++b)
    for (int64_t h = 0; h < D.H; ++h) {
      const int64_t bh = b * D.H + h;
      const T* a_bh = a + bh * D.T * D.Tk;
      const T* g_bh = g + bh * D.T * D.dv;
      const T* v_bh = v + bh * D.Tk * D.dv;
      if (dv) gemm(true, false, D.Tk, D.dv, D.T, T(1), a_bh, D.Tk, g_bh, D.dv, T(1), dv + bh * D.Tk * D.dv, D.dv);
      if (!need_ds) continue;
      gemm(false, true, D.T, D.Tk, D.dv, T(1), g_bh, D.dv, v_bh, D.dv, T(0), ds, D.Tk);
      const T* o_bh = o + bh * D.T * D.dv;
      for (int64_t i = 0; i < D.T; ++i) {
        T row_term = 0;  // D_i = G_i·O_i
        for (int64_t c = 0; c < D.dv; ++c) row_term += g_bh[i * D.dv + c] * o_bh[i * D.dv + c];
        const T* a_i = a_bh + i * D.Tk;
        T* ds_i = ds + i * D.Tk;
        for (int64_t j = 0; j < D.Tk; ++j) ds_i[j] = a_i[j] * (ds_i[j] - row_term);
      }
      if (dq) gemm(false, false, D.T, D.d, D.Tk, s, ds, D.Tk, k + bh * D.Tk * D.d, D.d, T(1), dq + bh * D.T * D.d, D.d);
      if (dk) gemm(true, false, D.Tk, D.d, D.T, s, ds, D.Tk, q + bh * D.T * D.d, D.d, T(1), dk + bh * D.Tk * D.d, D.d);
      if (dbias) accumulate_bias_grad_block(L, dbias, ds, D.Tk, b, h, 0, D.T, 0, D.Tk);
    }
}

// JVP (seed 000's total derivative of Att, with s and the bias):
//   Ż = s(Q̇Kᵀ + QK̇ᵀ) + Ḃ                       (T, Tk)   seed 000's z̃_i = q̃_i + k̃_i, row i of Ż
//   Ȯ = (A ⊙ Ż)V − rowsum(A ⊙ Ż) ⊙ O + A·V̇     (T, dv)   rowsum(A ⊙ Ż)_i = ⟨σ(p_i), z̃_i⟩ = seed 000's ι̃_i
// Seed 000 writes the middle term as (ι̃ ⊗ 1_nᵀ) ⊙ Att; Att is (n, d), so the factor must be 1_dᵀ: each row
// of O is scaled by its ι̃_i. Masked entries have A = 0 and contribute nothing. tq, tk, tv, tbias may be null
// (no tangent); z is a (T, Tk) scratch; the result is added into tout.
template <class T>
void attention_jvp(const AttentionDims& D, const T* q, const T* k, const T* v, const T* a, const T* o, const T* tq,
                   const T* tk, const T* tv, const T* tbias, const BiasLayout& L, T* tout, T* z) {
  const T s = static_cast<T>(D.scale);
  const bool need_z = tq || tk || tbias;
  for (int64_t b = 0; b < D.B; ++b)
    for (int64_t h = 0; h < D.H; ++h) {
      const int64_t bh = b * D.H + h;
      const T* a_bh = a + bh * D.T * D.Tk;
      T* t_bh = tout + bh * D.T * D.dv;
      if (need_z) {
        if (!tq && !tk) std::fill(z, z + D.T * D.Tk, T(0));
        if (tq) gemm(false, true, D.T, D.Tk, D.d, s, tq + bh * D.T * D.d, D.d, k + bh * D.Tk * D.d, D.d, T(0), z, D.Tk);
        if (tk)
          gemm(false, true, D.T, D.Tk, D.d, s, q + bh * D.T * D.d, D.d, tk + bh * D.Tk * D.d, D.d, T(tq ? 1 : 0), z,
               D.Tk);
        if (tbias) add_bias_block(L, z, D.Tk, tbias, b, h, 0, D.T, 0, D.Tk);
        const T* o_bh = o + bh * D.T * D.dv;
        for (int64_t i = 0; i < D.T; ++i) {
          const T* a_i = a_bh + i * D.Tk;
          T* z_i = z + i * D.Tk;
          T row_term = 0;  // ι̃_i = ⟨A_i, Ż_i⟩
          for (int64_t j = 0; j < D.Tk; ++j) {
            z_i[j] *= a_i[j];
            row_term += z_i[j];
          }
          for (int64_t c = 0; c < D.dv; ++c) t_bh[i * D.dv + c] -= row_term * o_bh[i * D.dv + c];
        }
        gemm(false, false, D.T, D.dv, D.Tk, T(1), z, D.Tk, v + bh * D.Tk * D.dv, D.dv, T(1), t_bh, D.dv);
      }
      if (tv) gemm(false, false, D.T, D.dv, D.Tk, T(1), a_bh, D.Tk, tv + bh * D.Tk * D.dv, D.dv, T(1), t_bh, D.dv);
    }
}

template <class T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}
template <class T>
T* mutable_data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace

Var attention(Var q, Var k, Var v, const AttentionOptions& opt, Var bias) {
  const char* op = "attention";
  Tape& tape = bias.defined() ? tape_of(op, {q, k, v, bias}) : tape_of(op, {q, k, v});
  const AttentionDims dims = attention_dims(op, q, k, v, opt);
  BiasLayout layout;
  Tensor bv;
  if (bias.defined()) {
    expect_same_dtype(op, q, bias);
    layout = bias_layout(op, bias.shape(), dims.B, dims.H, dims.T, dims.Tk);
    bv = bias.value();
  }
  const DType dtype = q.dtype();
  const Tensor qv = q.value(), kv = k.value(), vv = v.value();
  Tensor a = tape.empty(dtype, {dims.B, dims.H, dims.T, dims.Tk});
  Tensor o = tape.empty(dtype, {dims.B, dims.H, dims.T, dims.dv});
  dispatch_float(op, dtype, [&](auto tag) {
    using T = decltype(tag);
    attention_forward<T>(dims, qv.data<T>(), kv.data<T>(), vv.data<T>(), data_or_null<T>(bv), layout, a.data<T>(),
                         o.data<T>());
  });
  Tape* tp = &tape;
  auto vjp = [=](const Tensor& g, std::span<const Tensor> gin) {
    const Tensor dbias = gin.size() > 3 ? gin[3] : Tensor{};
    Tensor ds = tp->empty(dtype, {dims.T, dims.Tk});
    dispatch_float(op, dtype, [&](auto tag) {
      using T = decltype(tag);
      attention_vjp<T>(dims, qv.data<T>(), kv.data<T>(), vv.data<T>(), a.data<T>(), o.data<T>(), g.data<T>(), layout,
                       mutable_data_or_null<T>(gin[0]), mutable_data_or_null<T>(gin[1]),
                       mutable_data_or_null<T>(gin[2]), mutable_data_or_null<T>(dbias), ds.data<T>());
    });
  };
  auto jvp = [=](std::span<const Tensor> tin, const Tensor& tout) {
    const Tensor tbias = tin.size() > 3 ? tin[3] : Tensor{};
    Tensor z = tp->empty(dtype, {dims.T, dims.Tk});
    dispatch_float(op, dtype, [&](auto tag) {
      using T = decltype(tag);
      attention_jvp<T>(dims, qv.data<T>(), kv.data<T>(), vv.data<T>(), a.data<T>(), o.data<T>(),
                       data_or_null<T>(tin[0]), data_or_null<T>(tin[1]), data_or_null<T>(tin[2]),
                       data_or_null<T>(tbias), layout, tout.data<T>(), z.data<T>());
    });
  };
  if (bias.defined()) return tape.record(op, {q, k, v, bias}, o, vjp, jvp);
  return tape.record(op, {q, k, v}, o, vjp, jvp);
}

void register_attention(Registry& r) {
  r.add({"attention", "attention",
         "dV += AᵀG; dS = A ⊙ (GVᵀ − rowsum(G ⊙ O)1ᵀ); dQ += s·dS·K; dK += s·dSᵀ·Q; dB += Σ_bcast dS; "
         "Ȯ = (A ⊙ Ż)V − rowsum(A ⊙ Ż) ⊙ O + AV̇ with Ż = s(Q̇Kᵀ + QK̇ᵀ) + Ḃ",
         {}});
  auto qkv = [](AttentionOptions opt) {
    return [opt](Tape&, std::span<const Var> x) { return attention(x[0], x[1], x[2], opt); };
  };
  auto qkv_bias = [](AttentionOptions opt) {
    return [opt](Tape&, std::span<const Var> x) { return attention(x[0], x[1], x[2], opt, x[3]); };
  };
  const AttentionOptions plain{}, causal{0, true};
  r.add_case("attention", {"B=2 h=2 T=4 d=3", {{"q", {2, 2, 4, 3}}, {"k", {2, 2, 4, 3}}, {"v", {2, 2, 4, 3}}},
                           qkv(plain)});
  r.add_case("attention", {"causal B=1 h=2 T=7 d=5", {{"q", {1, 2, 7, 5}}, {"k", {1, 2, 7, 5}}, {"v", {1, 2, 7, 5}}},
                           qkv(causal)});
  r.add_case("attention", {"T=3 Tk=5 dv=2 s=0.7", {{"q", {2, 1, 3, 4}}, {"k", {2, 1, 5, 4}}, {"v", {2, 1, 5, 2}}},
                           qkv(AttentionOptions{0.7, false})});
  r.add_case("attention", {"T=1 Tk=4", {{"q", {1, 2, 1, 3}}, {"k", {1, 2, 4, 3}}, {"v", {1, 2, 4, 3}}}, qkv(plain)});
  r.add_case("attention", {"causal T=1", {{"q", {2, 1, 1, 3}}, {"k", {2, 1, 1, 3}}, {"v", {2, 1, 1, 2}}},
                           qkv(causal)});
  // One case per bias layout; B=2, h=3, T=4, Tk=4 (causal) or 5.
  struct BiasCase {
    const char* name;
    Shape bias;
    bool causal;
  };
  for (const BiasCase& c : {BiasCase{"bias (B,h,T,Tk)", {2, 3, 4, 5}, false},
                            BiasCase{"bias (h,T,Tk) causal", {3, 4, 4}, true},
                            BiasCase{"bias (T,Tk)", {4, 5}, false},
                            BiasCase{"bias (B,1,T,Tk) causal", {2, 1, 4, 4}, true},
                            BiasCase{"bias (B,1,1,Tk)", {2, 1, 1, 5}, false}}) {
    const int64_t tk = c.causal ? 4 : 5;
    r.add_case("attention", {c.name,
                             {{"q", {2, 3, 4, 3}}, {"k", {2, 3, tk, 3}}, {"v", {2, 3, tk, 2}}, {"bias", c.bias}},
                             qkv_bias(AttentionOptions{0, c.causal})});
  }
}

}  // namespace tapegrad
