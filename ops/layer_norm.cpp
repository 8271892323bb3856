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
// With ĝ = w ⊙ ȳ the VJP applies J_x̂ to ĝ (and w̄, b̄ sum over rows), the JVP applies it to ẋ; the second-order rule
// is the tangent of the VJP at a fixed ȳ, built from the JVP's pieces ρ̇ = −ρ²·mean(x̂ ⊙ ẋ) and x̂̇ = J_x̂·ẋ
// (docs/derivations.md §6.7). The three are stated once, in the sheet at the end of this file.
// The node keeps μ and ρ (one each per row) and reads x, the input's own value, to rebuild x̂ = (x − μ)·ρ where
// a direction needs it: two numbers per row instead of a copy of x̂.
//
// Work: rows run on the engine's threads; each row's sums run in independent lanes (ops/fast_math.hpp), so they
// vectorize and their order is fixed. w̄ and b̄ (sums over rows) go to one partial pair per range of rows (a chunk of
// the tape's scratch, engine/scratch.hpp), added in range order afterwards. A row's sums are chains of dependent
// additions (C/8 or C/4 long), so the rows go in blocks of four whose chains advance side by side, each row's sums
// in its own order: the same bits as a row at a time (ops_layer_norm_test), measured in docs/performance.md, "What
// the kernels' structure bought".
#include <algorithm>
#include <cmath>

#include "ops/sheet.hpp"
#include "engine/parallel.hpp"
#include "ops/common.hpp"
#include "ops/fast_math.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

constexpr const char* kOp = "layer_norm";

// Rows per range of the parallel loops: ~16k elements at least.
int64_t row_grain(int64_t C) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(C, 1)); }

// Σ_j a_j and Σ_j a_j·h_j over R rows (x, g ld apart), with a_j = w_j·g_j (w null: a_j = g_j) and
// h_j = (x_j − μ)·ρ, μ and ρ the row's: the two means of the VJP (and, without w, of the JVP). Four lanes a row:
// element j < 4⌊C/4⌋ to lane j mod 4, the rest to lane 0, the lanes added in pairs; each row's lanes are one vector
// of four, the R rows' chains side by side (see lane_sum_rows, ops/fast_math.hpp).
template <int R, class T>
void affine_row_sums(const T* w, const T* g, const T* x, int64_t ld, const T* mu, const T* rho, int64_t C, T* sum_a,
                     T* sum_ah) {
  using V = LaneVector<T, 4>;
  auto at = [](const T* p) { return lanes_at<T, 4>(p); };
  V s[R] = {}, h[R] = {};
  int64_t j = 0;
  for (; j + 4 <= C; j += 4)
    for (int r = 0; r < R; ++r) {
      const V a = w ? at(w + j) * at(g + r * ld + j) : at(g + r * ld + j);
      s[r] += a;
      h[r] += a * ((at(x + r * ld + j) - mu[r]) * rho[r]);
    }
  for (int r = 0; r < R; ++r) {
    T s0 = s[r][0], h0 = h[r][0];
    for (int64_t t = j; t < C; ++t) {
      const T a = w ? w[t] * g[r * ld + t] : g[r * ld + t];
      s0 += a;
      h0 += a * ((x[r * ld + t] - mu[r]) * rho[r]);
    }
    sum_a[r] = (s0 + s[r][1]) + (s[r][2] + s[r][3]);
    sum_ah[r] = (h0 + h[r][1]) + (h[r][2] + h[r][3]);
  }
}

// The rows of [begin, end) in blocks of kRowBlock, then one at a time: body.template operator()<R>(i) for the R rows
// from i. Every row's arithmetic is the same whichever block it falls in.
constexpr int kRowBlock = 4;
template <class F>
void each_block_of_rows(int64_t begin, int64_t end, F&& body) {
  int64_t i = begin;
  for (; i + kRowBlock <= end; i += kRowBlock) body.template operator()<kRowBlock>(i);
  for (; i < end; ++i) body.template operator()<1>(i);
}

// Forward, per row: μ and ρ saved, y = w ⊙ x̂ + b.            y, x: (rows, C); mean, rstd: (rows); w, b: (C)
// Mean and variance in two passes (no E[x²] − μ² cancellation); y holds x − μ between them. Rows go in blocks whose
// sums run side by side (lane_sum_rows); each row's sums are lane_sum's and lane_dot's.
template <class T>
void layer_norm_forward(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, T eps, int64_t rows, int64_t C) {
  const T inv_c = T(1) / static_cast<T>(C);
  parallel_for(rows, row_grain(C), [=](int64_t begin, int64_t end) {
    each_block_of_rows(begin, end, [&]<int R>(int64_t i0) {
      T mu[R], var[R];
      lane_sum_rows<R>(x + i0 * C, C, C, mu);
      for (int r = 0; r < R; ++r) {
        mu[r] *= inv_c;
        const T* xi = x + (i0 + r) * C;
        T* yi = y + (i0 + r) * C;
        for (int64_t j = 0; j < C; ++j) yi[j] = xi[j] - mu[r];
      }
      lane_dot_rows<R>(y + i0 * C, C, y + i0 * C, C, C, var);
      for (int r = 0; r < R; ++r) {
        const T rho = 1 / std::sqrt(var[r] * inv_c + eps);
        mean[i0 + r] = mu[r];
        rstd[i0 + r] = rho;
        T* yi = y + (i0 + r) * C;
        for (int64_t j = 0; j < C; ++j) yi[j] = w[j] * (yi[j] * rho) + b[j];
      }
    });
  });
}

// The scratch of layer_norm_vjp: one (2, C) partial of w̄ and b̄ per range of rows.
ScratchNeed affine_partials_need(DType dtype, int64_t rows, int64_t C) {
  return scratch_need(dtype, {2 * C}, parallel_chunks(rows, row_grain(C)));
}

// The VJP, row by row in one pass over x and ȳ (each row's x̂ and ĝ = w ⊙ ȳ serve all three):
//   x̄ += ρ·(ĝ − mean(ĝ) − x̂·mean(x̂ ⊙ ĝ)),   w̄ += Σ_rows ȳ ⊙ x̂,   b̄ += Σ_rows ȳ
// Any of dx, dw, db may be null. Each range of rows sums w̄ and b̄ into its own zeroed (2, C) partial, its chunk of
// `partials` (affine_partials_need), added into w̄ and b̄ in range order afterwards.
//                                                   dx, x, dy: (rows, C); mean, rstd: (rows); w, dw, db: (C)
template <class T>
void layer_norm_vjp(T* dx, T* dw, T* db, const T* x, const T* mean, const T* rstd, const T* w, const T* dy,
                    int64_t rows, int64_t C, const ScratchChunks& partials) {
  const T inv_c = T(1) / static_cast<T>(C);
  const bool affine = dw || db;
  const int64_t grain = row_grain(C), chunks = parallel_chunks(rows, grain);
  parallel_for(rows, grain, [=](int64_t begin, int64_t end, int64_t chunk) {
    T* pw = affine ? partials.chunk(chunk).zeroed<T>(2 * C) : nullptr;
    T* pb = affine ? pw + C : nullptr;
    each_block_of_rows(begin, end, [&]<int R>(int64_t i0) {
      T g_mean[R], hg_mean[R];
      if (dx) affine_row_sums<R>(w, dy + i0 * C, x + i0 * C, C, mean + i0, rstd + i0, C, g_mean, hg_mean);
      for (int r = 0; r < R; ++r) {
        const int64_t i = i0 + r;
        const T* xi = x + i * C;
        const T* gi = dy + i * C;
        const T mu = mean[i], rho = rstd[i];
        if (dx) {
          T* di = dx + i * C;
          const T gm = g_mean[r] * inv_c, hgm = hg_mean[r] * inv_c;
          for (int64_t j = 0; j < C; ++j) di[j] += rho * (w[j] * gi[j] - gm - ((xi[j] - mu) * rho) * hgm);
        }
        if (affine)
          for (int64_t j = 0; j < C; ++j) {
            pw[j] += gi[j] * ((xi[j] - mu) * rho);
            pb[j] += gi[j];
          }
      }
    });
  });
  if (!affine) return;
  for (int64_t c = 0; c < chunks; ++c) {
    const T* pw = partials.chunk(c).take<T>(2 * C);
    const T* pb = pw + C;
    if (dw)
      for (int64_t j = 0; j < C; ++j) dw[j] += pw[j];
    if (db)
      for (int64_t j = 0; j < C; ++j) db[j] += pb[j];
  }
}

// ẏ += w ⊙ ρ·(ẋ − mean(ẋ) − x̂·mean(x̂ ⊙ ẋ)) + ẇ ⊙ x̂ + ḃ; a null tangent contributes nothing.
//                                          ty, x, tx: (rows, C); mean, rstd: (rows); w, tw, tb: (C)
template <class T>
void layer_norm_jvp(T* ty, const T* x, const T* mean, const T* rstd, const T* w, const T* tx, const T* tw, const T* tb,
                    int64_t rows, int64_t C) {
  const T inv_c = T(1) / static_cast<T>(C);
  parallel_for(rows, row_grain(C), [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* xi = x + i * C;
      T* oi = ty + i * C;
      const T mu = mean[i], rho = rstd[i];
      if (tx) {
        const T* ti = tx + i * C;
        T t_mean, ht_mean;
        affine_row_sums<1>(static_cast<const T*>(nullptr), ti, xi, C, &mu, &rho, C, &t_mean, &ht_mean);
        t_mean *= inv_c;
        ht_mean *= inv_c;
        for (int64_t j = 0; j < C; ++j) oi[j] += w[j] * rho * (ti[j] - t_mean - ((xi[j] - mu) * rho) * ht_mean);
      }
      if (tw)
        for (int64_t j = 0; j < C; ++j) oi[j] += tw[j] * ((xi[j] - mu) * rho);
      if (tb)
        for (int64_t j = 0; j < C; ++j) oi[j] += tb[j];
    }
  });
}

void expect_affine_shape(const char* what, const Var& p, const Var& x) {
  const int64_t C = x.shape().back();
  if (p.rank() != 1 || p.shape()[0] != C)
    fail("{}: {} must have shape ({}), the size of the last axis of x {}, got {}", kOp, what, C, x.shape(), p.shape());
}

// Rows [begin, end) of the second-order term; ẇ̄'s sums added into out_w (a range's partial). xh and xh_dot are
// (C) arrays for x̂ and x̂̇ of a row.
template <class T>
void layer_norm_second_order_rows(T* out_x, T* out_w, const T* x, const T* mean, const T* rstd, const T* w, const T* g,
                                  const T* tx, const T* tw, int64_t begin, int64_t end, int64_t C, T* xh, T* xh_dot) {
  const T inv_c = T(1) / static_cast<T>(C);
  for (int64_t i = begin; i < end; ++i) {
    const T *xi = x + i * C, *gi = g + i * C, *ti = tx ? tx + i * C : nullptr;
    const T mu = mean[i], rho = rstd[i];
    T t_mean = 0, xh_t = 0, gh_mean = 0, xh_gh = 0, gh_dot_mean = 0;
    for (int64_t j = 0; j < C; ++j) {
      xh[j] = (xi[j] - mu) * rho;
      if (ti) t_mean += ti[j], xh_t += xh[j] * ti[j];
      gh_mean += w[j] * gi[j];
      xh_gh += xh[j] * w[j] * gi[j];
      if (tw) gh_dot_mean += tw[j] * gi[j];
    }
    t_mean *= inv_c, xh_t *= inv_c, gh_mean *= inv_c, xh_gh *= inv_c, gh_dot_mean *= inv_c;
    const T rho_dot = -rho * rho * xh_t;
    T m_dot = 0;
    for (int64_t j = 0; j < C; ++j) {
      xh_dot[j] = ti ? rho * (ti[j] - t_mean - xh[j] * xh_t) : T(0);
      m_dot += xh_dot[j] * w[j] * gi[j] + (tw ? xh[j] * tw[j] * gi[j] : T(0));
    }
    m_dot *= inv_c;
    for (int64_t j = 0; j < C; ++j) {
      const T gh = w[j] * gi[j], gh_dot = tw ? tw[j] * gi[j] : T(0);
      if (out_x)
        out_x[i * C + j] +=
            rho_dot * (gh - gh_mean - xh[j] * xh_gh) + rho * (gh_dot - gh_dot_mean - xh_dot[j] * xh_gh - xh[j] * m_dot);
      if (out_w) out_w[j] += gi[j] * xh_dot[j];
    }
  }
}

// The scratch of layer_norm_second_order: per range of rows, a (C) partial of ẇ̄ and x̂, x̂̇ of a row.
ScratchNeed second_order_need(DType dtype, int64_t rows, int64_t C) {
  return scratch_need(dtype, {C, C, C}, parallel_chunks(rows, row_grain(C)));
}

// The second-order term of the header, rows on the engine's threads, each range with its chunk of `scratch`
// (second_order_need): ẇ̄'s row sums go to the range's zeroed (C) partial, added in range order. out_x, out_w: or null
template <class T>
void layer_norm_second_order(T* out_x, T* out_w, const T* x, const T* mean, const T* rstd, const T* w, const T* g,
                             const T* tx, const T* tw, int64_t rows, int64_t C, const ScratchChunks& scratch) {
  const int64_t grain = row_grain(C), chunks = parallel_chunks(rows, grain);
  parallel_for(rows, grain, [=](int64_t begin, int64_t end, int64_t chunk) {
    ScratchChunk mine = scratch.chunk(chunk);
    T* pw = mine.zeroed<T>(C);
    T *xh = mine.zeroed<T>(C), *xh_dot = mine.zeroed<T>(C);
    layer_norm_second_order_rows(out_x, out_w ? pw : nullptr, x, mean, rstd, w, g, tx, tw, begin, end, C, xh, xh_dot);
  });
  if (out_w)
    for (int64_t c = 0; c < chunks; ++c) {
      const T* pw = scratch.chunk(c).take<T>(C);
      for (int64_t j = 0; j < C; ++j) out_w[j] += pw[j];
    }
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
  Tensor mean = tape.empty(x.dtype(), {rows}, "μ per row");
  Tensor rstd = tape.empty(x.dtype(), {rows}, "ρ = 1/√(var + ε) per row");
  reserve_scratch(tape, affine_partials_need(x.dtype(), rows, C).bytes(),
                  second_order_need(x.dtype(), rows, C).bytes());
  dispatch_float(kOp, x.dtype(), [&]<class T>(T) {
    layer_norm_forward(y.data<T>(), mean.data<T>(), rstd.data<T>(), xv.data<T>(), wv.data<T>(), bv.data<T>(),
                       static_cast<T>(eps), rows, C);
  });
  Tape* tp = &tape;
  return tape.record(
      kOp, {x, weight, bias}, y,
      [=](const Tensor& g, std::span<Tensor> gin) {
        dispatch_float(kOp, g.dtype(), [&]<class T>(T) {
          const ScratchChunks partials = tp->scratch().take(affine_partials_need(g.dtype(), rows, C))[0];
          layer_norm_vjp(data_or_null<T>(gin[0]), data_or_null<T>(gin[1]), data_or_null<T>(gin[2]), xv.data<T>(),
                         mean.data<T>(), rstd.data<T>(), wv.data<T>(), g.data<T>(), rows, C, partials);
        });
      },
      [=](std::span<const Tensor> tin, Tensor& ty) {
        dispatch_float(kOp, ty.dtype(), [&]<class T>(T) {
          layer_norm_jvp(ty.data<T>(), xv.data<T>(), mean.data<T>(), rstd.data<T>(), wv.data<T>(),
                         data_or_null<T>(tin[0]), data_or_null<T>(tin[1]), data_or_null<T>(tin[2]), rows, C);
        });
      },
      [=](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
        dispatch_float(kOp, g.dtype(), [&]<class T>(T) {
          const ScratchChunks scratch = tp->scratch().take(second_order_need(g.dtype(), rows, C))[0];
          layer_norm_second_order(data_or_null<T>(gin_dot[0]), data_or_null<T>(gin_dot[1]), xv.data<T>(),
                                  mean.data<T>(), rstd.data<T>(), wv.data<T>(), g.data<T>(), data_or_null<T>(tin[0]),
                                  data_or_null<T>(tin[1]), rows, C, scratch);
        });
      });
}

// layer norm's worked example (`tapegrad explain layer_norm --trace`, docs/learn.md §4): three rows of four, the
// forward and the VJP (layer_norm_vjp's formula) written again with primitive ops.
OpTrace layer_norm_trace() {
  return {.example = {"3 rows of 4",
                      {{"x", {3, 4}}, {"w", {4}}, {"b", {4}}},
                      [](Tape&, std::span<const Var> x) { return layer_norm(x[0], x[1], x[2]); }},
          .lines = [](TraceLines& t, std::span<const Var> x, const Var& g) -> std::vector<Var> {
            const Var eps = x[0].tape().constant(Tensor::from<double>(Shape{}, {1e-5}));
            const Var mu = t.show("μ = mean(x), per row", mean(x[0], -1, true));
            const Var centred = sub(x[0], mu);
            const Var one = x[0].tape().constant(Tensor::from<double>(Shape{}, {1.0}));
            const Var rho = t.show("ρ = 1/√(mean((x − μ)²) + ε), per row   (ε = 1e-5)",
                                   div(one, sqrt(add(mean(square(centred), -1, true), eps))));
            const Var xhat = t.show("x̂ = (x − μ)·ρ", mul(centred, rho));
            t.show("y = w ⊙ x̂ + b", add(mul(x[1], xhat), x[2]));
            t.part("VJP (ȳ given)");
            const Var gw = t.show("ĝ = w ⊙ ȳ", mul(x[1], g));
            const Var own = t.show("ρ·ĝ, x̄ without the row terms", mul(rho, gw));
            const Var mean_term = t.show("ρ·mean(ĝ), the row term of the mean", mul(rho, mean(gw, -1, true)));
            const Var var_term = t.show("ρ·x̂ ⊙ mean(ĝ ⊙ x̂), the row term of the variance",
                                        mul(rho, mul(xhat, mean(mul(gw, xhat), -1, true))));
            const Var xbar =
                t.show("x̄ = ρ·(ĝ − mean(ĝ) − x̂ ⊙ mean(ĝ ⊙ x̂)), means per row", sub(sub(own, mean_term), var_term));
            // w and b are read by every row: their gradients sum over all of x's leading axes
            const int64_t width = x[0].shape()[x[0].rank() - 1];
            auto over_rows = [&](const Var& v) { return sum(reshape(v, Shape{v.shape().numel() / width, width}), 0); };
            const Var wbar = t.show("w̄ = Σ over the rows of ȳ ⊙ x̂", over_rows(mul(g, xhat)));
            const Var bbar = t.show("b̄ = Σ over the rows of ȳ", over_rows(g));
            return {xbar, wbar, bbar};
          }};
}

// The sheet: what the kernels above implement, in one line each.
std::vector<OpSheet> layer_norm_ops() {
  OpSheets r;
  auto apply = [](Tape&, std::span<const Var> x) { return layer_norm(x[0], x[1], x[2]); };
  r.add({.name = "layer_norm",
         .family = "layer_norm",
         .forward = "per row: y = w⊙x̂ + b, x̂ = (x − mean x)·ρ, ρ = 1/√(var x + ε)",
         .vjp = "ĝ = w⊙ȳ: x̄ += ρ(ĝ − mean ĝ − x̂·mean(x̂⊙ĝ)), w̄ += Σ ȳ⊙x̂, b̄ += Σ ȳ",
         .jvp = "ẏ = w⊙ρ(ẋ − mean ẋ − x̂·mean(x̂⊙ẋ)) + ẇ⊙x̂ + ḃ",
         .second_order = "m = mean(x̂⊙ĝ), ĝ̇ = ẇ⊙ȳ, ρ̇ = −ρ²·mean(x̂⊙ẋ), x̂̇ = ρ(ẋ − mean ẋ − x̂·mean(x̂⊙ẋ)): "
                         "ẋ̄ += ρ̇(ĝ − mean ĝ − x̂m) + ρ(ĝ̇ − mean ĝ̇ − x̂̇m − x̂ṁ), ẇ̄ += Σ ȳ⊙x̂̇ (b̄ does not move)",
         .second_order_derivation = "6.7",
         .formulas_at = {{"forward", "ops/layer_norm.cpp", "layer_norm_forward"},
                         {"VJP", "ops/layer_norm.cpp", "layer_norm_vjp"},
                         {"JVP", "ops/layer_norm.cpp", "layer_norm_jvp"},
                         {"second order", "ops/layer_norm.cpp", "layer_norm_second_order_rows"}},
         // Its gradcheck cases, each checked to first and second order by the suite:
         .cases = {{"(4, 8)", {{"x", {4, 8}}, {"weight", {8}}, {"bias", {8}}}, apply},
                   {"(2, 3, 6)", {{"x", {2, 3, 6}}, {"weight", {6}}, {"bias", {6}}}, apply}},
         .inputs = 3,
         .call = [](std::span<const Var> x,
                    const OpArgs& a) { return layer_norm(x[0], x[1], x[2], a.number("eps", 1e-5)); },
         // c = x − mean x, ρ = (mean c² + ε)^(−½), y = w⊙(c·ρ) + b per row, with ε = 1e-5.
         .unfused =
             [](Tape& tape, std::span<const Var> x) {
               const Var c = sub(x[0], mean(x[0], -1, true));
               const Var eps = tape.constant(Tensor::full(x[0].dtype(), {1}, 1e-5));
               const Var rho = pow(add(mean(square(c), -1, true), eps), -0.5);
               return add(mul(mul(c, rho), x[1]), x[2]);
             },
         .trace = layer_norm_trace(),
         .derived_in = "ops/layer_norm.cpp"});
  return r.ops;
}

}  // namespace tapegrad
