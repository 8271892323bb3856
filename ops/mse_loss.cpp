// Mean squared error of a prediction p against a target t of the same shape, n elements:
//   L = (1/n) Σ_i d_i²,   d = p − t                                        p, t, d: one shape; L: ()
// dL = (2/n)·⟨d, dp − dt⟩ gives the VJP and the JVP; at a fixed L̄ only d moves in the VJP, by ḋ = ṗ − ṫ, which is
// the second-order rule. The three are stated once, in the sheet at the end of this file.
// The node keeps d. The shapes must be equal: p − t broadcasts (N, 1) against (N) to (N, N), whose mean is not
// the loss anyone meant, so mse_loss refuses it instead. Sums are taken in double (a float32 sum of 10⁶ squares
// drifts; see ops/reduce.cpp).
#include "ops/sheet.hpp"
#include "ops/common.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

// d = p − t;  returns Σ_i d_i²                                              d, p, t: (n)
template <class T>
double mse_forward(T* d, const T* p, const T* t, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    d[i] = p[i] - t[i];
    sum += static_cast<double>(d[i]) * static_cast<double>(d[i]);
  }
  return sum;
}

// p̄ += c·d,  t̄ −= c·d  with c = (2/n)·L̄                                    dp, dt, d: (n); dp or dt may be null
template <class T>
void mse_vjp(T* dp, T* dt, const T* d, T c, int64_t n) {
  if (dp)
    for (int64_t i = 0; i < n; ++i) dp[i] += c * d[i];
  if (dt)
    for (int64_t i = 0; i < n; ++i) dt[i] -= c * d[i];
}

// (2/n) Σ_i d_i (ṗ_i − ṫ_i)                                                 d, tp, tt: (n); tp or tt may be null
template <class T>
T mse_jvp(const T* d, const T* tp, const T* tt, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double dot = (tp ? static_cast<double>(tp[i]) : 0.0) - (tt ? static_cast<double>(tt[i]) : 0.0);
    sum += static_cast<double>(d[i]) * dot;
  }
  return static_cast<T>(2 * sum / static_cast<double>(n));
}

}  // namespace

Var mse_loss(Var prediction, Var target) {
  static constexpr const char* op = "mse_loss";
  Tape& tape = tape_of(op, {prediction, target});
  expect_float(op, prediction);
  expect_same_dtype(op, prediction, target);
  const Shape& ps = prediction.shape();
  if (!(ps == target.shape()))
    fail(
        "{}: prediction {} and target {} differ in shape: expected a target of shape {}, the prediction's "
        "(no broadcasting; reshape one of them if the difference is meant)",
        op, ps, target.shape(), ps);
  const int64_t n = ps.numel();
  if (n == 0) fail("{}: prediction {} has no elements; the mean over zero elements is undefined", op, ps);
  const Tensor pv = prediction.value(), tv = target.value();
  Tensor d = tape.empty(prediction.dtype(), ps, "prediction − target");
  Tensor y = tape.empty(prediction.dtype(), Shape{});
  dispatch_float(op, prediction.dtype(), [&]<class T>(T) {
    const double sum = mse_forward(d.data<T>(), pv.data<T>(), tv.data<T>(), n);
    y.data<T>()[0] = static_cast<T>(sum / static_cast<double>(n));
  });
  return tape.record(
      op, {prediction, target}, y,
      [=](const Tensor& g, std::span<Tensor> gin) {
        dispatch_float(op, g.dtype(), [&]<class T>(T) {
          const T c = static_cast<T>(2 * static_cast<double>(g.data<T>()[0]) / static_cast<double>(n));
          mse_vjp(data_or_null<T>(gin[0]), data_or_null<T>(gin[1]), d.data<T>(), c, n);
        });
      },
      [=](std::span<const Tensor> tin, Tensor& ty) {
        dispatch_float(op, ty.dtype(), [&]<class T>(T) {
          ty.data<T>()[0] += mse_jvp(d.data<T>(), data_or_null<T>(tin[0]), data_or_null<T>(tin[1]), n);
        });
      },
      [=](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
        dispatch_float(op, g.dtype(), [&]<class T>(T) {
          const T c = static_cast<T>(2 * static_cast<double>(g.data<T>()[0]) / static_cast<double>(n));
          const T *tp = data_or_null<T>(tin[0]), *tt = data_or_null<T>(tin[1]);
          T *out_p = data_or_null<T>(gin_dot[0]), *out_t = data_or_null<T>(gin_dot[1]);
          for (int64_t i = 0; i < n; ++i) {
            const T d_dot = (tp ? tp[i] : T(0)) - (tt ? tt[i] : T(0));
            if (out_p) out_p[i] += c * d_dot;
            if (out_t) out_t[i] -= c * d_dot;
          }
        });
      });
}

std::vector<OpSheet> mse_loss_ops() {
  OpSheets r;
  auto apply = [](Tape&, std::span<const Var> x) { return mse_loss(x[0], x[1]); };
  r.add({.name = "mse_loss",
         .family = "mse_loss",
         .forward = "L = mean((p − t)²), p and t of one shape",
         .vjp = "d = p − t: p̄ += (2/n)·L̄·d, t̄ −= (2/n)·L̄·d",
         .jvp = "L̇ = (2/n)·Σ d⊙(ṗ − ṫ)",
         .second_order = "ṗ̄ += (2/n)·L̄·(ṗ − ṫ), ṫ̄ −= (2/n)·L̄·(ṗ − ṫ)",
         .second_order_derivation = "6.3",
         .cost =
             [](std::span<const Shape> in, const Shape&) {
               const double n = static_cast<double>(in[0].numel());
               return OpCost{3 * n, 4 * n, 3 * n};
             },
         // Its gradcheck cases, each checked to first and second order by the suite:
         .cases = {{"matrix", {{"prediction", {4, 3}}, {"target", {4, 3}}}, apply},
                   {"column", {{"prediction", {5, 1}}, {"target", {5, 1}}}, apply},
                   {"rank 3", {{"prediction", {2, 3, 4}}, {"target", {2, 3, 4}}}, apply}},
         .inputs = 2,
         .call = [](std::span<const Var> x, const OpArgs&) { return mse_loss(x[0], x[1]); },
         // L = mean((p − t)²).
         .unfused = [](Tape&, std::span<const Var> x) { return mean(square(sub(x[0], x[1]))); }});
  return r.ops;
}

}  // namespace tapegrad
