// Cross-entropy of a row softmax against integer class targets, fused with a stable log-softmax.
//
// logits X (..., V), flattened to N rows x_r ∈ ℝ^V; targets t (...) int32 with t_r ∈ [0, V) → L of shape ():
//   p_r = softmax(x_r),   ℓ_r = −log p_r[t_r] = lse(x_r) − x_r[t_r],   L = (1/N)·Σ_r ℓ_r
// with lse(x) = log Σ_j exp(x_j). Since ∂lse/∂x = p,
//   ∂L/∂x_r = (p_r − e_{t_r}) / N
//   VJP  x̄_r += ḡ·(p_r − e_{t_r}) / N                    (ḡ the scalar upstream gradient)
//   JVP  L̇   = (1/N)·Σ_r (⟨p_r, ẋ_r⟩ − ẋ_r[t_r])
// targets are piecewise constant: no derivative.
// Second order (Tape::hvp): at a fixed ḡ only p_r moves in the VJP, ṗ_r = p_r ⊙ (ẋ_r − ⟨p_r, ẋ_r⟩):
//   ẋ̄_r += (ḡ/N)·p_r ⊙ (ẋ_r − ⟨p_r, ẋ_r⟩)
//
// Stability: with m_r = max_j x_r[j] and σ_r = Σ_j exp(x_r[j] − m_r), every exponent is ≤ 0 and the max term is
// 1, so σ_r ∈ [1, V] and log σ_r ∈ [0, log V] for any finite logits (±1e4 included):
//   ℓ_r = (m_r − x_r[t_r]) + log σ_r,     p_r[j] = exp((x_r[j] − m_r) − log σ_r)
// The node keeps m_r and log σ_r (the row log-sum-exp lse = m + log σ, in two parts) instead of p: N values each
// rather than N·V, and p is rebuilt in the VJP and JVP. Keeping the two parts apart matters in float32: at
// m = 1e4 the sum m + log σ rounds away ~1e-3 of log σ, which would be a 1e-3 relative error in p.
#include <algorithm>
#include <cmath>
#include <string>

#include "ops/sheet.hpp"
#include "engine/parallel.hpp"
#include "ops/common.hpp"
#include "ops/fast_math.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

// Rows per range of the parallel loops (~16k logits at least). The sums over rows (L and L̇) are taken per range
// in double and added in range order: the same result in every run for a given thread count.
int64_t row_grain(int64_t classes) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(classes, 1)); }

// Σ_r f(r, chunk) over rows [0, rows) on the engine's threads, each range (chunk) summing in double, the ranges
// added in order.
template <class F>
double sum_over_rows(int64_t rows, int64_t classes, F&& f) {
  const int64_t grain = row_grain(classes);
  double partial[256] = {};  // one per range: at most 256 threads (set_num_threads' limit)
  parallel_for(rows, grain, [&](int64_t begin, int64_t end, int64_t chunk) {
    double acc = 0;
    for (int64_t r = begin; r < end; ++r) acc += f(r, chunk);
    partial[chunk] = acc;
  });
  double total = 0;
  for (int64_t c = 0, n = parallel_chunks(rows, grain); c < n; ++c) total += partial[c];
  return total;
}

// The forward's scratch: one row of exp(x − m) per range of rows.
ScratchNeed forward_need(DType dtype, int64_t rows, int64_t classes) {
  return scratch_need(dtype, {classes}, parallel_chunks(rows, row_grain(classes)));
}

// X (N, V), t (N) → L = (1/N)·Σ_r ((m_r − x_r[t_r]) + log σ_r); writes m (N) and log σ (N). `exps`: forward_need's
// chunks. float32 takes exp from ops/fast_math.hpp; the max and σ run in eight lanes.
template <class T>
T cross_entropy_forward(const T* x, const int32_t* targets, int64_t rows, int64_t classes, T* row_max, T* row_log_sum,
                        const ScratchChunks& exps) {
  const double total = sum_over_rows(rows, classes, [&](int64_t r, int64_t chunk) {
    const T* xr = x + r * classes;
    T* e = exps.chunk(chunk).take<T>(classes);
    const T m = lane_max(xr + 1, classes - 1, xr[0]);
    for (int64_t j = 0; j < classes; ++j) e[j] = fast_exp(xr[j] - m);
    const T log_sigma = std::log(lane_sum(e, classes));
    row_max[r] = m;
    row_log_sum[r] = log_sigma;
    return static_cast<double>((m - xr[targets[r]]) + log_sigma);
  });
  return static_cast<T>(total / static_cast<double>(rows));
}

// X̄ (N, V) += (ḡ/N)·(p_r − e_{t_r}) row by row, p_r = exp((x_r − m_r) − log σ_r).
template <class T>
void cross_entropy_vjp(const T* x, const int32_t* targets, const T* row_max, const T* row_log_sum, int64_t rows,
                       int64_t classes, T g, T* gx) {
  const T coef = g / static_cast<T>(rows);
  parallel_for(rows, row_grain(classes), [=](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * classes;
      T* gr = gx + r * classes;
      const T m = row_max[r], log_sigma = row_log_sum[r];
      for (int64_t j = 0; j < classes; ++j) gr[j] += coef * fast_exp((xr[j] - m) - log_sigma);
      gr[targets[r]] -= coef;
    }
  });
}

// L̇ = (1/N)·Σ_r (⟨p_r, ẋ_r⟩ − ẋ_r[t_r]) with Ẋ (N, V).
template <class T>
T cross_entropy_jvp(const T* x, const int32_t* targets, const T* row_max, const T* row_log_sum, int64_t rows,
                    int64_t classes, const T* tx) {
  const double total = sum_over_rows(rows, classes, [&](int64_t r, int64_t) {
    const T* xr = x + r * classes;
    const T* tr = tx + r * classes;
    const T m = row_max[r], log_sigma = row_log_sum[r];
    T p_dot_t = 0;
    for (int64_t j = 0; j < classes; ++j) p_dot_t += fast_exp((xr[j] - m) - log_sigma) * tr[j];
    return static_cast<double>(p_dot_t - tr[targets[r]]);
  });
  return static_cast<T>(total / static_cast<double>(rows));
}

// Ẋ̄ (N, V) += (ḡ/N)·p_r ⊙ (ẋ_r − ⟨p_r, ẋ_r⟩), the second-order term of the header.
template <class T>
void cross_entropy_second_order(const T* x, const T* row_max, const T* row_log_sum, int64_t rows, int64_t classes, T g,
                                const T* tx, T* out) {
  const T coef = g / static_cast<T>(rows);
  parallel_for(rows, row_grain(classes), [=](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T *xr = x + r * classes, *tr = tx + r * classes;
      const T m = row_max[r], log_sigma = row_log_sum[r];
      T p_dot_t = 0;
      for (int64_t j = 0; j < classes; ++j) p_dot_t += fast_exp((xr[j] - m) - log_sigma) * tr[j];
      for (int64_t j = 0; j < classes; ++j)
        out[r * classes + j] += coef * fast_exp((xr[j] - m) - log_sigma) * (tr[j] - p_dot_t);
    }
  });
}

}  // namespace

Var cross_entropy(Var logits, Var targets) {
  constexpr const char* op = "cross_entropy";
  Tape& tape = tape_of(op, {logits, targets});
  expect_float(op, logits);
  if (targets.dtype() != DType::i32) fail("{}: targets must be int32, got {} {}", op, targets.dtype(), targets.shape());
  expect_min_rank(op, logits, 1, "logits (..., V)");
  const Shape& ls = logits.shape();
  const int64_t classes = ls.back();
  Shape leading(ls.dims().first(static_cast<size_t>(ls.rank() - 1)));
  if (!(targets.shape() == leading))
    fail("{}: targets of shape {} do not match logits {}: expected targets of shape {} (the logits' leading axes)", op,
         targets.shape(), ls, leading);
  if (classes == 0) fail("{}: logits {} have no classes (V = 0)", op, ls);
  const int64_t rows = leading.numel();
  if (rows == 0) fail("{}: logits {} have no rows; the mean over zero rows is undefined", op, ls);
  const Tensor xv = logits.value(), tv = targets.value();
  const int32_t* pt = tv.data<int32_t>();
  for (int64_t r = 0; r < rows; ++r)
    if (pt[r] < 0 || pt[r] >= classes)
      fail("{}: target {} at targets{} is out of range for V = {} classes (logits {}, targets {})", op, pt[r],
           multi_index(tv.shape(), r), classes, ls, tv.shape());

  Tensor loss = tape.empty(xv.dtype(), Shape{});
  Tensor row_max = tape.empty(xv.dtype(), Shape{rows}, "m: row max");
  Tensor row_log_sum = tape.empty(xv.dtype(), Shape{rows}, "log Σ exp(x − m) per row");
  reserve_scratch(tape, forward_need(xv.dtype(), rows, classes).bytes());
  const ScratchChunks exps = tape.scratch().take(forward_need(xv.dtype(), rows, classes))[0];
  dispatch_float(op, xv.dtype(), [&]<class T>(T) {
    loss.data<T>()[0] =
        cross_entropy_forward(xv.data<T>(), pt, rows, classes, row_max.data<T>(), row_log_sum.data<T>(), exps);
  });
  return tape.record(
      op, {logits, targets}, loss,
      [xv, tv, row_max, row_log_sum, rows, classes](const Tensor& g, std::span<Tensor> gin) {
        if (!gin[0].defined()) return;
        dispatch_float(op, g.dtype(), [&]<class T>(T) {
          cross_entropy_vjp(xv.data<T>(), tv.data<int32_t>(), row_max.data<T>(), row_log_sum.data<T>(), rows, classes,
                            g.data<T>()[0], gin[0].data<T>());
        });
      },
      [xv, tv, row_max, row_log_sum, rows, classes](std::span<const Tensor> tin, Tensor& ty) {
        if (!tin[0].defined()) return;
        dispatch_float(op, ty.dtype(), [&]<class T>(T) {
          ty.data<T>()[0] += cross_entropy_jvp(xv.data<T>(), tv.data<int32_t>(), row_max.data<T>(),
                                               row_log_sum.data<T>(), rows, classes, tin[0].data<T>());
        });
      },
      [xv, row_max, row_log_sum, rows, classes](const Tensor& g, std::span<const Tensor> tin,
                                                std::span<Tensor> gin_dot) {
        if (!tin[0].defined() || !gin_dot[0].defined()) return;
        dispatch_float(op, g.dtype(), [&]<class T>(T) {
          cross_entropy_second_order(xv.data<T>(), row_max.data<T>(), row_log_sum.data<T>(), rows, classes,
                                     g.data<T>()[0], tin[0].data<T>(), gin_dot[0].data<T>());
        });
      });
}

std::vector<OpSheet> cross_entropy_ops() {
  OpSheets r;
  auto loss = [](Tape&, std::span<const Var> x) { return cross_entropy(x[0], x[1]); };
  r.add({.name = "cross_entropy",
         .family = "cross_entropy",
         .forward = "L = (1/N)·Σ_r (log Σ_v exp x_r[v] − x_r[t_r]) over the N rows r with targets t_r",
         .vjp = "x̄_r += ḡ·(p_r − e_{t_r})/N, p_r = softmax(x_r); targets not differentiable",
         .jvp = "L̇ = (1/N)·Σ_r (⟨p_r, ẋ_r⟩ − ẋ_r[t_r])",
         .second_order = "ẋ̄_r += (ḡ/N)·ṗ_r, ṗ_r = p_r ⊙ (ẋ_r − ⟨p_r, ẋ_r⟩)",
         .second_order_derivation = "6.5",
         // Its gradcheck cases, each checked to first and second order by the suite:
         .cases = {{"logits (5, 7)", {{"logits", {5, 7}}, {"targets", {5}, Fill::indices, 7}}, loss},
                   {"logits (2, 3, 4)", {{"logits", {2, 3, 4}}, {"targets", {2, 3}, Fill::indices, 4}}, loss},
                   {"one row: logits (6)", {{"logits", {6}}, {"targets", {}, Fill::indices, 6}}, loss}},
         // A row of logits all −∞ puts probability on no class: log Σ exp = −∞, and L = −∞ + ∞.
         .undefined_edges = {"masked_rows=nan"},
         .inputs = 2,
         .call = [](std::span<const Var> x, const OpArgs&) { return cross_entropy(x[0], x[1]); },
         // L = −(1/N)·Σ log_softmax(x) ⊙ E, the pick of x_r[t_r] a product with the one-hot rows E of the targets.
         .unfused =
             [](Tape& tape, std::span<const Var> x) {
               const Tensor& t = x[1].value();
               const int64_t classes = x[0].shape()[x[0].shape().rank() - 1];
               Tensor onehot = Tensor::zeros(x[0].dtype(), x[0].shape());
               dispatch_float("cross_entropy", onehot.dtype(), [&]<class T>(T) {
                 for (int64_t row = 0; row < t.numel(); ++row)
                   onehot.data<T>()[row * classes + t.data<int32_t>()[row]] = T(1);
               });
               return scale(sum(mul(log_softmax(x[0]), tape.constant(onehot))), -1.0 / static_cast<double>(t.numel()));
             }});
  return r.ops;
}

}  // namespace tapegrad
