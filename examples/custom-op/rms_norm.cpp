// RMS normalization over the last axis, with a weight of that axis' size. Per row of C elements:
//   ρ = √(⟨x, x⟩/C + ε),   x̂ = x/ρ,   y = w ⊙ x̂                              x, x̂, y: (rows, C); w: (C); ρ: (rows)
// dρ = ⟨x, dx⟩/(Cρ) = ⟨x̂, dx⟩/C, so dx̂ = (dx − x̂·⟨x̂, dx⟩/C)/ρ, and
//   JVP  ẏ = w ⊙ (ẋ − x̂·⟨x̂, ẋ⟩/C)/ρ + ẇ ⊙ x̂
//   VJP  x̄ += (g − x̂·⟨x̂, g⟩/C)/ρ  with g = w ⊙ ȳ   (the x-Jacobian (I − x̂x̂ᵀ/C)/ρ is symmetric),   w̄ += Σ_rows ȳ ⊙ x̂
//   second order (Tape::hvp), the tangent of the VJP at a fixed ȳ, with ġ = ẇ ⊙ ȳ, m = ⟨x̂, g⟩/C and the JVP's
//   (1/ρ)˙ = −⟨x̂, ẋ⟩/(Cρ²), x̂̇ = (ẋ − x̂·⟨x̂, ẋ⟩/C)/ρ:
//        ẋ̄ += (1/ρ)˙·(g − x̂·m) + (ġ − x̂̇·m − x̂·ṁ)/ρ,   ṁ = (⟨x̂̇, g⟩ + ⟨x̂, ġ⟩)/C;   ẇ̄ += Σ_rows ȳ ⊙ x̂̇
// The node keeps x̂ and 1/ρ: every derivative is written in them.
//
// A claim, checked against this forward: "x̄ = w ⊙ ȳ/ρ" treats ρ as a constant and drops −x̂·⟨x̂, g⟩/(Cρ), a term
// of each row; the gradchecker rejects it and names a per-row term.
#include <cmath>

#include "ops/ops.hpp"

using namespace tapegrad;

namespace {

// x̂ = x/ρ and 1/ρ per row; y = w ⊙ x̂.                           y, xhat, x: (rows, C); inv_rho: (rows); w: (C)
template <class T>
void rms_norm_forward(T* y, T* xhat, T* inv_rho, const T* x, const T* w, int64_t rows, int64_t C, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * C;
    T ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    const T inv = T(1) / std::sqrt(ss / T(C) + T(eps));
    inv_rho[r] = inv;
    for (int64_t c = 0; c < C; ++c) {
      xhat[r * C + c] = xr[c] * inv;
      y[r * C + c] = w[c] * xhat[r * C + c];
    }
  }
}

// x̄ += (g − x̂·⟨x̂, g⟩/C)/ρ, g = w ⊙ ȳ;  w̄ += Σ_rows ȳ ⊙ x̂      dx, dy, xhat: (rows, C); dw, w: (C); either may be null
template <class T>
void rms_norm_vjp(T* dx, T* dw, const T* dy, const T* xhat, const T* inv_rho, const T* w, int64_t rows, int64_t C) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = dy + r * C;
    const T* h = xhat + r * C;
    if (dw)
      for (int64_t c = 0; c < C; ++c) dw[c] += g[c] * h[c];
    if (!dx) continue;
    T hg = 0;
    for (int64_t c = 0; c < C; ++c) hg += h[c] * w[c] * g[c];
    for (int64_t c = 0; c < C; ++c) dx[r * C + c] += (w[c] * g[c] - h[c] * hg / T(C)) * inv_rho[r];
  }
}

// ẏ += w ⊙ (ẋ − x̂·⟨x̂, ẋ⟩/C)/ρ + ẇ ⊙ x̂                          ty, tx, xhat: (rows, C); tw, w: (C); tx or tw may be null
template <class T>
void rms_norm_jvp(T* ty, const T* tx, const T* tw, const T* xhat, const T* inv_rho, const T* w, int64_t rows,
                  int64_t C) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* h = xhat + r * C;
    T* t = ty + r * C;
    if (tx) {
      const T* d = tx + r * C;
      T hd = 0;
      for (int64_t c = 0; c < C; ++c) hd += h[c] * d[c];
      for (int64_t c = 0; c < C; ++c) t[c] += w[c] * (d[c] - h[c] * hd / T(C)) * inv_rho[r];
    }
    if (tw)
      for (int64_t c = 0; c < C; ++c) t[c] += tw[c] * h[c];
  }
}

// The second-order term of the header.                                  out_x like x, out_w like w; or null
template <class T>
void rms_norm_second_order(T* out_x, T* out_w, const T* g_out, const T* tx, const T* tw, const T* xhat,
                           const T* inv_rho, const T* w, int64_t rows, int64_t C) {
  for (int64_t r = 0; r < rows; ++r) {
    const T *xh = xhat + r * C, *yb = g_out + r * C, *t = tx ? tx + r * C : nullptr;
    const T inv = inv_rho[r];
    T xh_t = 0, m = 0, xh_gdot = 0;
    for (int64_t c = 0; c < C; ++c) {
      if (t) xh_t += xh[c] * t[c];
      m += xh[c] * w[c] * yb[c];
      if (tw) xh_gdot += xh[c] * tw[c] * yb[c];
    }
    xh_t /= T(C), m /= T(C);
    const T inv_dot = -inv * inv * xh_t;
    T m_dot = xh_gdot;
    for (int64_t c = 0; c < C; ++c) m_dot += (t ? (t[c] - xh[c] * xh_t) * inv : T(0)) * w[c] * yb[c];
    m_dot /= T(C);
    for (int64_t c = 0; c < C; ++c) {
      const T g = w[c] * yb[c], g_dot = tw ? tw[c] * yb[c] : T(0);
      const T xh_dot = t ? (t[c] - xh[c] * xh_t) * inv : T(0);
      if (out_x) out_x[r * C + c] += inv_dot * (g - xh[c] * m) + (g_dot - xh_dot * m - xh[c] * m_dot) * inv;
      if (out_w) out_w[c] += yb[c] * xh_dot;
    }
  }
}

}  // namespace

Var rms_norm(Var x, Var w, double eps) {
  static constexpr const char* op = "rms_norm";
  expect_float(op, x);
  expect_same_dtype(op, x, w);
  expect_min_rank(op, x, 1, "x");
  if (w.rank() != 1 || w.shape()[0] != x.shape().back())
    fail("{}: the weight must have shape ({}) to match x {}, got {}", op, x.shape().back(), x.shape(), w.shape());
  if (!(eps > 0)) fail("{}: eps must be positive, got {}", op, eps);
  Tape& tape = tape_of(op, {x, w});
  const int64_t C = x.shape().back(), rows = x.shape().rows();
  const Tensor xv = x.value(), wv = w.value();
  Tensor y = tape.empty(x.dtype(), x.shape());
  Tensor xhat = tape.empty(x.dtype(), x.shape());
  Tensor inv_rho = tape.empty(x.dtype(), Shape{rows});
  dispatch_float(op, x.dtype(), [&]<class T>(T) {
    rms_norm_forward(y.data<T>(), xhat.data<T>(), inv_rho.data<T>(), xv.data<T>(), wv.data<T>(), rows, C, eps);
  });
  return tape.record(
      op, {x, w}, y,
      [=](const Tensor& g, std::span<Tensor> gin) {
        dispatch_float(op, g.dtype(), [&]<class T>(T) {
          rms_norm_vjp(data_or_null<T>(gin[0]), data_or_null<T>(gin[1]), g.data<T>(), xhat.data<T>(), inv_rho.data<T>(),
                       wv.data<T>(), rows, C);
        });
      },
      [=](std::span<const Tensor> tin, Tensor& ty) {
        dispatch_float(op, ty.dtype(), [&]<class T>(T) {
          rms_norm_jvp(ty.data<T>(), data_or_null<T>(tin[0]), data_or_null<T>(tin[1]), xhat.data<T>(),
                       inv_rho.data<T>(), wv.data<T>(), rows, C);
        });
      },
      [=](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
        dispatch_float(op, g.dtype(), [&]<class T>(T) {
          rms_norm_second_order(data_or_null<T>(gin_dot[0]), data_or_null<T>(gin_dot[1]), g.data<T>(),
                                data_or_null<T>(tin[0]), data_or_null<T>(tin[1]), xhat.data<T>(), inv_rho.data<T>(),
                                wv.data<T>(), rows, C);
        });
      });
}

namespace {

Var apply_rms_norm(Tape&, std::span<const Var> x) { return rms_norm(x[0], x[1]); }

// The claim: x̄ = w ⊙ ȳ/ρ (ρ held constant), w̄ = Σ_rows ȳ ⊙ x̂, in float64 at the forward's point.
void constant_rms_vjp(const ClaimPoint& at, const Tensor& g, std::span<Tensor> gin) {
  const Tensor &x = at.inputs[0], &w = at.inputs[1];
  const int64_t C = x.shape().back(), rows = x.shape().rows();
  const double *px = x.data<double>(), *pw = w.data<double>(), *pg = g.data<double>();
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += px[r * C + c] * px[r * C + c];
    const double inv = 1 / std::sqrt(ss / static_cast<double>(C) + 1e-6);
    for (int64_t c = 0; c < C; ++c) {
      if (gin[0].defined()) gin[0].data<double>()[r * C + c] += pw[c] * pg[r * C + c] * inv;
      if (gin[1].defined()) gin[1].data<double>()[c] += pg[r * C + c] * px[r * C + c] * inv;
    }
  }
}

}  // namespace

std::vector<OpSheet> rms_norm_ops() {
  return {{.name = "rms_norm",
           .family = "my_ops",
           .forward = "per row: y = w⊙x/ρ, ρ = √(mean x² + ε)",
           .vjp = "ρ = √(mean x² + ε), x̂ = x/ρ: x̄ += (w⊙ȳ − x̂⟨x̂, w⊙ȳ⟩/C)/ρ, w̄ += Σ ȳ⊙x̂",
           .jvp = "ẏ = w⊙(ẋ − x̂⟨x̂, ẋ⟩/C)/ρ + ẇ⊙x̂",
           .second_order = "g = w⊙ȳ, m = ⟨x̂, g⟩/C: ẋ̄ += (1/ρ)˙(g − x̂m) + (ġ − x̂̇m − x̂ṁ)/ρ, ẇ̄ += Σ ȳ⊙x̂̇",
           .cases = {{"rows", {{"x", {4, 6}}, {"w", {6}}}, apply_rms_norm},
                     {"rank 3", {{"x", {2, 3, 5}}, {"w", {5}, Fill::positive}}, apply_rms_norm}}}};
}

std::vector<OpSheet> rms_norm_claims() {
  return {{.name = "rms_norm_constant_rms",
           .family = "claims",
           .vjp = "x̄ = w⊙ȳ/ρ (ρ held constant), w̄ = Σ ȳ⊙x̂",
           .jvp = "no forward-mode rule",
           .cases = {{"rows",
                      {{"x", {4, 6}}, {"w", {6}}},
                      claimed({"rms_norm_constant_rms", apply_rms_norm, constant_rms_vjp, {}})}}}};
}
