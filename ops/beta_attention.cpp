// β-attention, as one node (seed 000; math-notes §1): softmax replaced by the row map β(x) = x / (1 + ‖x‖).
//
// Per (b, h) slice, tokens as rows: Q (T, d), K (Tk, d), V (Tk, dv), G = ∂L/∂O (T, dv), s the scale:
//   P  = (s·QKᵀ) ⊙ M           (T, Tk)   M_ij = 1 where key j is visible to query i, 0 where masked (causal: j > i)
//   Bβ = β(P) row-wise          (T, Tk)   Bβ_i = c_i·p_i,  r_i = ‖p_i‖,  c_i = 1/(1 + r_i)
//   O  = Bβ·V                   (T, dv)
// Masked scores are 0, not −∞ (β(−∞) is NaN): zero-masking equals β of the visible prefix padded with zeros.
// A row whose scores are all 0 gives Bβ_i = 0 and O_i = 0. The node keeps Bβ and r.
//
// The derivative of β (math-notes §1), with x ≠ 0, r = ‖x‖, c = 1/(1+r):
//   dβ(x)·h = c·h − c²(⟨x, h⟩/r)·x  =  c·h − (⟨β(x), h⟩/r)·β(x)      (x = β(x)/c),   dβ(0)·h = h
// The Jacobian c·I − c²xxᵀ/r is symmetric, so the VJP applies the same map to the cotangent.
// Where this departs from seed 000: its homogeneity property dβ(x)·h = f(x, h)·β(x) with
// f = ⟨x, h⟩/(r²(1 + r)) does not hold for β. Splitting h into its parts along and across x gives
//   dβ(x)·h = f(x, h)·β(x) + (I − xxᵀ/r²)·h/(1 + r),
// so the claimed form drops the second term (it is right only for h ∥ x; for h ⟂ x the true derivative is
// h/(1 + r) and the claim gives 0). Hence the seed's "simpler total derivative"
// dAtt_β·Θ̃ = (f̃ ⊗ 1_nᵀ) ⊙ Att_β(Θ) + Att_β(Q, K, Ṽ) (where 1_nᵀ would also have to be 1_dᵀ) is wrong, and the
// full row map below is needed.
#include <algorithm>
#include <cmath>

#include "engine/blas.hpp"
#include "ops/attention.hpp"
#include "ops/attention_shapes.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

// p[0..n) ← β(p[0..visible)) padded with zeros; returns r = ‖p[0..visible)‖ (the masked entries are 0).
template <class T>
T beta_row_forward(T* p, int64_t visible, int64_t n) {
  std::fill(p + visible, p + n, T(0));
  T sq = 0;
  for (int64_t j = 0; j < visible; ++j) sq += p[j] * p[j];
  const T r = std::sqrt(sq);
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
  T along = 0;
  if (r > 0) {
    for (int64_t j = 0; j < visible; ++j) along += beta[j] * u[j];
    along /= r;
  }
  for (int64_t j = 0; j < visible; ++j) u[j] = c * u[j] - along * beta[j];
  std::fill(u + visible, u + n, T(0));
}

// Forward over all (b, h): P = s·QKᵀ (gemm), masked to 0; Bβ = β(P) row-wise; O = Bβ·V (gemm).
// q (B,h,T,d), k (B,h,Tk,d), v (B,h,Tk,dv) → bb (B,h,T,Tk), r (B,h,T), o (B,h,T,dv).
template <class T>
void beta_attention_forward(const AttentionDims& D, const T* q, const T* k, const T* v, T* bb, T* r, T* o) {
  const T s = static_cast<T>(D.scale);
  for (int64_t bh = 0; bh < D.heads(); ++bh) {
    T* b_bh = bb + bh * D.T * D.Tk;
    gemm(false, true, D.T, D.Tk, D.d, s, q + bh * D.T * D.d, D.d, k + bh * D.Tk * D.d, D.d, T(0), b_bh, D.Tk);
    for (int64_t i = 0; i < D.T; ++i) r[bh * D.T + i] = beta_row_forward(b_bh + i * D.Tk, D.visible(i), D.Tk);
    gemm(false, false, D.T, D.dv, D.Tk, T(1), b_bh, D.Tk, v + bh * D.Tk * D.dv, D.dv, T(0), o + bh * D.T * D.dv,
         D.dv);
  }
}

// VJP (math-notes §1):
//   dV += BβᵀG                                                    (Tk, dv)
//   dBβ = GVᵀ                                                     (T, Tk)
//   dP_i = c_i·dBβ_i − c_i²(⟨p_i, dBβ_i⟩/r_i)·p_i,  then dP ← M ⊙ dP   (T, Tk)
//   dQ += s·dP·K,   dK += s·dPᵀ·Q
// The mask on dP is required: P_ij = M_ij·s·q_i·k_j, so ∂L/∂(s·QKᵀ) = M ⊙ dP; without it dQ and dK pick up
// the masked entries' c·dBβ_ij. dq, dk, dv may be null; dp is a (T, Tk) scratch.
template <class T>
void beta_attention_vjp(const AttentionDims& D, const T* q, const T* k, const T* v, const T* bb, const T* r,
                        const T* g, T* dq, T* dk, T* dv, T* dp) {
  const T s = static_cast<T>(D.scale);
  for (int64_t bh = 0; bh < D.heads(); ++bh) {
    const T* b_bh = bb + bh * D.T * D.Tk;
    const T* g_bh = g + bh * D.T * D.dv;
    if (dv) gemm(true, false, D.Tk, D.dv, D.T, T(1), b_bh, D.Tk, g_bh, D.dv, T(1), dv + bh * D.Tk * D.dv, D.dv);
    if (!dq && !dk) continue;
    gemm(false, true, D.T, D.Tk, D.dv, T(1), g_bh, D.dv, v + bh * D.Tk * D.dv, D.dv, T(0), dp, D.Tk);
    for (int64_t i = 0; i < D.T; ++i)
      beta_row_derivative(dp + i * D.Tk, b_bh + i * D.Tk, r[bh * D.T + i], D.visible(i), D.Tk);
    if (dq) gemm(false, false, D.T, D.d, D.Tk, s, dp, D.Tk, k + bh * D.Tk * D.d, D.d, T(1), dq + bh * D.T * D.d, D.d);
    if (dk) gemm(true, false, D.Tk, D.d, D.T, s, dp, D.Tk, q + bh * D.T * D.d, D.d, T(1), dk + bh * D.Tk * D.d, D.d);
  }
}

// JVP (seed 000's Leibniz rule, with the full dβ):
//   Ṗ = (s(Q̇Kᵀ + QK̇ᵀ)) ⊙ M,   Ḃβ_i = dβ(p_i)·ṗ_i = c_i·ṗ_i − c_i²(⟨p_i, ṗ_i⟩/r_i)·p_i,   Ȯ = Ḃβ·V + Bβ·V̇
// tq, tk, tv may be null; pdot is a (T, Tk) scratch; the result is added into tout.
template <class T>
void beta_attention_jvp(const AttentionDims& D, const T* q, const T* k, const T* v, const T* bb, const T* r,
                        const T* tq, const T* tk, const T* tv, T* tout, T* pdot) {
  const T s = static_cast<T>(D.scale);
  for (int64_t bh = 0; bh < D.heads(); ++bh) {
    const T* b_bh = bb + bh * D.T * D.Tk;
    T* t_bh = tout + bh * D.T * D.dv;
    if (tq || tk) {
      if (tq) gemm(false, true, D.T, D.Tk, D.d, s, tq + bh * D.T * D.d, D.d, k + bh * D.Tk * D.d, D.d, T(0), pdot, D.Tk);
      if (tk)
        gemm(false, true, D.T, D.Tk, D.d, s, q + bh * D.T * D.d, D.d, tk + bh * D.Tk * D.d, D.d, T(tq ? 1 : 0), pdot,
             D.Tk);
      for (int64_t i = 0; i < D.T; ++i)
        beta_row_derivative(pdot + i * D.Tk, b_bh + i * D.Tk, r[bh * D.T + i], D.visible(i), D.Tk);
      gemm(false, false, D.T, D.dv, D.Tk, T(1), pdot, D.Tk, v + bh * D.Tk * D.dv, D.dv, T(1), t_bh, D.dv);
    }
    if (tv) gemm(false, false, D.T, D.dv, D.Tk, T(1), b_bh, D.Tk, tv + bh * D.Tk * D.dv, D.dv, T(1), t_bh, D.dv);
  }
}

template <class T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace

Var beta_attention(Var q, Var k, Var v, const AttentionOptions& opt) {
  const char* op = "beta_attention";
  Tape& tape = tape_of(op, {q, k, v});
  const AttentionDims dims = attention_dims(op, q, k, v, opt);
  const DType dtype = q.dtype();
  const Tensor qv = q.value(), kv = k.value(), vv = v.value();
  Tensor bb = tape.empty(dtype, {dims.B, dims.H, dims.T, dims.Tk});
  Tensor r = tape.empty(dtype, {dims.B, dims.H, dims.T});
  Tensor o = tape.empty(dtype, {dims.B, dims.H, dims.T, dims.dv});
  dispatch_float(op, dtype, [&](auto tag) {
    using T = decltype(tag);
    beta_attention_forward<T>(dims, qv.data<T>(), kv.data<T>(), vv.data<T>(), bb.data<T>(), r.data<T>(), o.data<T>());
  });
  Tape* tp = &tape;
  return tape.record(
      op, {q, k, v}, o,
      [=](const Tensor& g, std::span<const Tensor> gin) {
        Tensor dp = tp->empty(dtype, {dims.T, dims.Tk});
        dispatch_float(op, dtype, [&](auto tag) {
          using T = decltype(tag);
          beta_attention_vjp<T>(dims, qv.data<T>(), kv.data<T>(), vv.data<T>(), bb.data<T>(), r.data<T>(), g.data<T>(),
                                data_or_null<T>(gin[0]), data_or_null<T>(gin[1]), data_or_null<T>(gin[2]),
                                dp.data<T>());
        });
      },
      [=](std::span<const Tensor> tin, const Tensor& tout) {
        Tensor pdot = tp->empty(dtype, {dims.T, dims.Tk});
        dispatch_float(op, dtype, [&](auto tag) {
          using T = decltype(tag);
          beta_attention_jvp<T>(dims, qv.data<T>(), kv.data<T>(), vv.data<T>(), bb.data<T>(), r.data<T>(),
                                data_or_null<T>(tin[0]), data_or_null<T>(tin[1]), data_or_null<T>(tin[2]),
                                tout.data<T>(), pdot.data<T>());
        });
      });
}

void register_beta_attention(Registry& r) {
  r.add({"beta_attention", "beta_attention",
         "dV += BβᵀG; dP = M ⊙ dβ(P)(GVᵀ) with dβ(p)u = c·u − c²(⟨p,u⟩/r)p; dQ += s·dP·K; dK += s·dPᵀ·Q; "
         "Ȯ = dβ(P)(M ⊙ s(Q̇Kᵀ + QK̇ᵀ))·V + Bβ·V̇",
         {}});
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
  // Q = 0: every row of P is 0, where β has its special case dβ(0) = I.
  r.add_case("beta_attention", {"Q = 0 (β at 0)",
                                {{"q", {1, 2, 3, 3}, Fill::zeros}, {"k", {1, 2, 4, 3}}, {"v", {1, 2, 4, 2}}},
                                qkv(plain)});
}

}  // namespace tapegrad
