// layer_norm over the last axis: x (..., C), weight w (C), bias b (C) → y (..., C).
//
// Per row x ∈ ℝᶜ:
//   μ = (1/C)·Σ_j x_j,   v = (1/C)·Σ_j (x_j − μ)²,   ρ = 1/√(v + ε),   x̂ = (x − μ)·ρ,   y = w ⊙ x̂ + b
//
// Differential of x̂. dμ = mean(dx); dv = (2/C)·Σ_j (x_j − μ)·dx_j (the dμ term drops since Σ_j (x_j − μ) = 0);
// dρ = −½ρ³·dv = −ρ²·mean(x̂ ⊙ dx). Then dx̂ = ρ·(dx − dμ) + (x − μ)·dρ, i.e.
//   dx̂ = ρ·(dx − mean(dx) − x̂·mean(x̂ ⊙ dx)),   J_x̂ = ρ·(I − 1 1ᵀ/C − x̂ x̂ᵀ/C)   (symmetric)
// ε sits inside ρ only, so the formula holds as written for every ε > 0 (mean(x̂²) = v/(v + ε) is never used).
//
//   VJP   ĝ = w ⊙ ȳ;  x̄ += ρ·(ĝ − mean(ĝ) − x̂·mean(x̂ ⊙ ĝ));  w̄ += Σ_rows ȳ ⊙ x̂;  b̄ += Σ_rows ȳ
//   JVP   ẏ = w ⊙ ρ·(ẋ − mean(ẋ) − x̂·mean(x̂ ⊙ ẋ)) + ẇ ⊙ x̂ + ḃ
// The node keeps x̂ (..., C), ρ (one per row) and w: all that either direction reads.
#include <cmath>

#include "ops/common.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

constexpr const char* kOp = "layer_norm";

// Forward, per row: x̂ and ρ saved, y = w ⊙ x̂ + b.        y, xhat, x: (rows, C); rstd: (rows); w, b: (C)
// Mean and variance in two passes (no E[x²] − μ² cancellation).
template <class T>
void layer_norm_forward(T* y, T* xhat, T* rstd, const T* x, const T* w, const T* b, T eps, int64_t rows,
                        int64_t C) {
  const T inv_c = T(1) / static_cast<T>(C);
  for (int64_t i = 0; i < rows; ++i) {
    const T* xi = x + i * C;
    T* hi = xhat + i * C;
    T* yi = y + i * C;
    T mu = 0;
    for (int64_t j = 0; j < C; ++j) mu += xi[j];
    mu *= inv_c;
    T var = 0;
    for (int64_t j = 0; j < C; ++j) var += (xi[j] - mu) * (xi[j] - mu);
    var *= inv_c;
    const T rho = 1 / std::sqrt(var + eps);
    rstd[i] = rho;
    for (int64_t j = 0; j < C; ++j) {
      hi[j] = (xi[j] - mu) * rho;
      yi[j] = w[j] * hi[j] + b[j];
    }
  }
}

// x̄ += ρ·(ĝ − mean(ĝ) − x̂·mean(x̂ ⊙ ĝ)) with ĝ = w ⊙ ȳ.           dx, xhat, dy: (rows, C); rstd: (rows); w: (C)
template <class T>
void layer_norm_vjp_x(T* dx, const T* xhat, const T* rstd, const T* w, const T* dy, int64_t rows, int64_t C) {
  const T inv_c = T(1) / static_cast<T>(C);
  for (int64_t i = 0; i < rows; ++i) {
    const T* hi = xhat + i * C;
    const T* gi = dy + i * C;
    T* di = dx + i * C;
    T g_mean = 0, hg_mean = 0;
    for (int64_t j = 0; j < C; ++j) {
      const T g = w[j] * gi[j];
      g_mean += g;
      hg_mean += hi[j] * g;
    }
    g_mean *= inv_c;
    hg_mean *= inv_c;
    const T rho = rstd[i];
    for (int64_t j = 0; j < C; ++j) di[j] += rho * (w[j] * gi[j] - g_mean - hi[j] * hg_mean);
  }
}

// w̄ += Σ_rows ȳ ⊙ x̂,  b̄ += Σ_rows ȳ; either may be null.             dw, db: (C); xhat, dy: (rows, C)
template <class T>
void layer_norm_vjp_affine(T* dw, T* db, const T* xhat, const T* dy, int64_t rows, int64_t C) {
  for (int64_t i = 0; i < rows; ++i) {
    const T* hi = xhat + i * C;
    const T* gi = dy + i * C;
    if (dw)
      for (int64_t j = 0; j < C; ++j) dw[j] += gi[j] * hi[j];
    if (db)
      for (int64_t j = 0; j < C; ++j) db[j] += gi[j];
  }
}

// ẏ += w ⊙ ρ·(ẋ − mean(ẋ) − x̂·mean(x̂ ⊙ ẋ)) + ẇ ⊙ x̂ + ḃ; a null tangent contributes nothing.
//                                                   ty, xhat, tx: (rows, C); rstd: (rows); w, tw, tb: (C)
template <class T>
void layer_norm_jvp(T* ty, const T* xhat, const T* rstd, const T* w, const T* tx, const T* tw, const T* tb,
                    int64_t rows, int64_t C) {
  const T inv_c = T(1) / static_cast<T>(C);
  for (int64_t i = 0; i < rows; ++i) {
    const T* hi = xhat + i * C;
    T* oi = ty + i * C;
    if (tx) {
      const T* ti = tx + i * C;
      T t_mean = 0, ht_mean = 0;
      for (int64_t j = 0; j < C; ++j) {
        t_mean += ti[j];
        ht_mean += hi[j] * ti[j];
      }
      t_mean *= inv_c;
      ht_mean *= inv_c;
      const T rho = rstd[i];
      for (int64_t j = 0; j < C; ++j) oi[j] += w[j] * rho * (ti[j] - t_mean - hi[j] * ht_mean);
    }
    if (tw)
      for (int64_t j = 0; j < C; ++j) oi[j] += tw[j] * hi[j];
    if (tb)
      for (int64_t j = 0; j < C; ++j) oi[j] += tb[j];
  }
}

template <class T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

void expect_affine_shape(const char* what, const Var& p, const Var& x) {
  const int64_t C = x.shape().back();
  if (p.rank() != 1 || p.shape()[0] != C)
    fail("{}: {} must have shape ({}), the size of the last axis of x {}, got {}", kOp, what, C, x.shape(),
         p.shape());
}

}  // namespace

Var layer_norm(Var x, Var weight, Var bias, double eps) {
  Tape& tape = tape_of(kOp, {x, weight, bias});
  expect_float(kOp, x);
  expect_float(kOp, weight);
  expect_float(kOp, bias);
  expect_min_rank(kOp, x, 1, "x");
  expect_same_dtype(kOp, x, weight);
  expect_same_dtype(kOp, x, bias);
  expect_affine_shape("weight", weight, x);
  expect_affine_shape("bias", bias, x);
  if (!(eps > 0) || !std::isfinite(eps))
    fail("{}: eps must be positive and finite, got {} (x {})", kOp, eps, x.shape());

  const Tensor xv = x.value(), wv = weight.value(), bv = bias.value();
  const int64_t C = x.shape().back();
  const int64_t rows = C == 0 ? 0 : xv.numel() / C;
  Tensor y = tape.empty(x.dtype(), x.shape());
  Tensor xhat = tape.empty(x.dtype(), x.shape());
  Tensor rstd = tape.empty(x.dtype(), {rows});
  dispatch_float(kOp, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    layer_norm_forward(y.data<T>(), xhat.data<T>(), rstd.data<T>(), xv.data<T>(), wv.data<T>(), bv.data<T>(),
                       static_cast<T>(eps), rows, C);
  });
  return tape.record(
      kOp, {x, weight, bias}, y,
      [=](const Tensor& g, std::span<const Tensor> gin) {
        dispatch_float(kOp, g.dtype(), [&](auto tag) {
          using T = decltype(tag);
          if (gin[0].defined())
            layer_norm_vjp_x(gin[0].data<T>(), xhat.data<T>(), rstd.data<T>(), wv.data<T>(), g.data<T>(), rows, C);
          if (gin[1].defined() || gin[2].defined())
            layer_norm_vjp_affine(data_or_null<T>(gin[1]), data_or_null<T>(gin[2]), xhat.data<T>(), g.data<T>(),
                                  rows, C);
        });
      },
      [=](std::span<const Tensor> tin, const Tensor& ty) {
        dispatch_float(kOp, ty.dtype(), [&](auto tag) {
          using T = decltype(tag);
          layer_norm_jvp(ty.data<T>(), xhat.data<T>(), rstd.data<T>(), wv.data<T>(), data_or_null<T>(tin[0]),
                         data_or_null<T>(tin[1]), data_or_null<T>(tin[2]), rows, C);
        });
      });
}

void register_layer_norm(Registry& r) {
  r.add({"layer_norm", "layer_norm",
         "ĝ = w⊙ȳ: x̄ += ρ(ĝ − mean ĝ − x̂·mean(x̂⊙ĝ)), w̄ += Σ ȳ⊙x̂, b̄ += Σ ȳ; "
         "ẏ = w⊙ρ(ẋ − mean ẋ − x̂·mean(x̂⊙ẋ)) + ẇ⊙x̂ + ḃ",
         {}});
  auto apply = [](Tape&, std::span<const Var> x) { return layer_norm(x[0], x[1], x[2]); };
  r.add_case("layer_norm", {"(4, 8)", {{"x", {4, 8}}, {"weight", {8}}, {"bias", {8}}}, apply});
  r.add_case("layer_norm", {"(2, 3, 6)", {{"x", {2, 3, 6}}, {"weight", {6}}, {"bias", {6}}}, apply});
}

}  // namespace tapegrad
