// The affine layer as one node, in PyTorch's weight layout so checkpoints carry over unchanged:
//   y = x·Wᵀ + b        x (N, in) (any leading axes), W (out, in), b (out) or none  →  y (N, out)
// The VJP is bilinear in (x, W) and linear in ȳ, so its tangent at a fixed ȳ (the second-order rule) is the VJP
// with the other factor's tangent, and b̄ does not move. The VJP, the JVP and that rule are stated once, in the
// sheet at the end of this file.
// With a residual r (y's shape) the output joins a residual stream: y = (x·Wᵀ + b) + r, added as the forward's last
// step, and r̄ += ȳ, ṙ into ẏ (r moves nothing else: no second-order term). The GPT's blocks pass their input, so
// the add the block would record, its output and its gradient buffer are not on the tape.
// Three gemm calls each way; the transposes are cblas flags, never copies.
// Where the products run in bf16 (ops/products/products.hpp runs_in_bf16: all three have the forward's n·out·in
// multiply-adds), x and W are rounded once, here, and the node keeps the rounded copies for its backward (dW reads
// x, dX reads W), which rounds ȳ once for both of its products: five roundings a step where the products would
// make seven, the copies shared by every thread.
#include <array>

#include "ops/products/blas.hpp"
#include "ops/sheet.hpp"
#include "ops/common.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

Var linear(Var x, Var w, Var b, Var residual) {
  const char* op = "linear";
  expect_float(op, x);
  expect_same_dtype(op, x, w);
  expect_min_rank(op, x, 1, "the input");
  if (w.rank() != 2 || w.shape()[1] != x.shape().back())
    fail("{}: weight must be (out, {}) for an input of shape {}, got {}", op, x.shape().back(), x.shape(), w.shape());
  const bool has_bias = b.defined(), has_residual = residual.defined();
  if (has_bias) {
    expect_same_dtype(op, x, b);
    if (b.rank() != 1 || b.shape()[0] != w.shape()[0])
      fail("{}: bias must be ({}) for a weight of shape {}, got {}", op, w.shape()[0], w.shape(), b.shape());
  }
  // x, W, then b and r where given: the order of gin and tin below.
  std::vector<Var> inputs{x, w};
  if (has_bias) inputs.push_back(b);
  if (has_residual) inputs.push_back(residual);
  Tape& tape = x.tape();
  for (const Var& v : inputs) (void)tape_of(op, {x, v});
  const int64_t n = x.shape().rows(), in = w.shape()[1], out = w.shape()[0];
  Shape yshape = x.shape();
  yshape[yshape.rank() - 1] = out;
  if (has_residual) expect_same_dtype(op, x, residual);
  expect_residual_shape(op, residual, yshape, x);
  const Tensor rv = has_residual ? residual.value() : Tensor{};
  const Tensor xv = x.value(), wv = w.value(), bv = has_bias ? b.value() : Tensor{};
  Tensor y = tape.empty(x.dtype(), yshape);
  const bool bf16 = x.dtype() == DType::f32 && runs_in_bf16(n, out, in);
  const ScratchNeed g16_need = scratch_need(DType::f32, {(n * out + 1) / 2});  // ȳ rounded, in the backward
  if (bf16) reserve_scratch(tape, g16_need.bytes());
  std::array<uint16_t*, 2> rounded{};  // x and W rounded, kept for the backward; null in float32 and float64
  if (bf16) {
    rounded = bf16_copies<2>(tape, {n * in, out * in});
    round_for_products(rounded[0], xv.data<float>(), n, in, in);
    round_for_products(rounded[1], wv.data<float>(), out, in, in);
  }
  const uint16_t *x16 = rounded[0], *w16 = rounded[1];
  dispatch_float(op, x.dtype(), [&]<class T>(T) {
    gemm(n, out, in, T(1), with_rounding(as_is(xv.data<T>(), in), x16),
         with_rounding(transposed(wv.data<T>(), in), w16), T(0), y.data<T>(), out);
    if (has_bias) add_rows(y.data<T>(), bv.data<T>(), n, out);
    if (has_residual) add_elements(y.data<T>(), rv.data<T>(), n * out);
  });
  const size_t residual_slot = has_bias ? 3 : 2;
  Tape* tp = &tape;
  auto vjp = [=](const Tensor& g, std::span<Tensor> gin) {
    dispatch_float(op, g.dtype(), [&]<class T>(T) {
      const T* pg = g.data<T>();
      uint16_t* g16 = nullptr;
      if (bf16 && runs_in_bf16(n, out, in) && gin[0].defined() && gin[1].defined()) {
        g16 = tp->scratch().take_one(g16_need).take<uint16_t>(n * out);
        round_for_products(g16, g.data<float>(), n, out, out);
      }
      if (gin[0].defined())
        gemm(n, in, out, T(1), with_rounding(as_is(pg, out), g16), with_rounding(as_is(wv.data<T>(), in), w16),
             beta_for<T>(*tp, 0), gin[0].data<T>(), in);
      if (gin[1].defined())
        gemm(out, in, n, T(1), with_rounding(transposed(pg, out), g16), with_rounding(as_is(xv.data<T>(), in), x16),
             beta_for<T>(*tp, 1), gin[1].data<T>(), in);
      if (has_bias && gin[2].defined()) {
        zero_if_fresh(*tp, 2, gin[2]);
        sum_rows(gin[2].data<T>(), pg, n, out);
      }
      if (has_residual && gin[residual_slot].defined())  // r̄ += ȳ, or r̄ = ȳ where fresh
        add_or_copy_elements(gin[residual_slot].data<T>(), pg, n * out, !tp->fresh_gradient(residual_slot));
    });
  };
  auto jvp = [=](std::span<const Tensor> tin, Tensor& ty) {
    dispatch_float(op, ty.dtype(), [&]<class T>(T) {
      T* pt = ty.data<T>();
      if (tin[0].defined())
        gemm(n, out, in, T(1), as_is(tin[0].data<T>(), in), transposed(wv.data<T>(), in), T(1), pt, out);
      if (tin[1].defined())
        gemm(n, out, in, T(1), as_is(xv.data<T>(), in), transposed(tin[1].data<T>(), in), T(1), pt, out);
      if (has_bias && tin[2].defined()) add_rows(pt, tin[2].data<T>(), n, out);
      if (has_residual && tin[residual_slot].defined()) add_elements(pt, tin[residual_slot].data<T>(), n * out);
    });
  };
  auto second = [=](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
    dispatch_float(op, g.dtype(), [&]<class T>(T) {
      const T* pg = g.data<T>();
      if (gin_dot[0].defined() && tin[1].defined())
        gemm(n, in, out, T(1), as_is(pg, out), as_is(tin[1].data<T>(), in), T(1), gin_dot[0].data<T>(), in);
      if (gin_dot[1].defined() && tin[0].defined())
        gemm(out, in, n, T(1), transposed(pg, out), as_is(tin[0].data<T>(), in), T(1), gin_dot[1].data<T>(), in);
    });
  };
  Var out_var = tape.record(op, std::span<const Var>(inputs), y, vjp, jvp, second);
  tape.vjp_writes_fresh(out_var);
  return out_var;
}

std::vector<OpSheet> linear_ops() {
  OpSheets r;
  r.add({.name = "linear",
         .family = "linear",
         .forward = "y = xWᵀ + b over the rows of x (+ r, a residual)",
         .vjp = "x̄ += ȳW, W̄ += ȳᵀx, b̄ += Σ_rows ȳ (r̄ += ȳ with a residual)",
         .jvp = "ẏ = ẋWᵀ + xẆᵀ + ḃ (+ ṙ)",
         .second_order = "ẋ̄ += ȳẆ, Ẇ̄ += ȳᵀẋ (b̄ and r̄ do not move)",
         .second_order_derivation = "6.2",
         // y = xWᵀ: numel(y)·in multiply-adds; backward and forward mode two products of the same size
         .cost =
             [](std::span<const Shape> in, const Shape& y) {
               const double forward = 2 * static_cast<double>(y.numel()) * static_cast<double>(in[1][1]);
               return OpCost{forward, 2 * forward, 2 * forward};
             },
         // Its gradcheck cases, each checked to first and second order by the suite:
         .cases = {{"with bias",
                    {{"x", {5, 4}}, {"W", {3, 4}}, {"b", {3}}},
                    [](Tape&, std::span<const Var> v) { return linear(v[0], v[1], v[2]); }},
                   {"no bias, rank 3",
                    {{"x", {2, 3, 4}}, {"W", {6, 4}}},
                    [](Tape&, std::span<const Var> v) { return linear(v[0], v[1]); }},
                   {"with bias and residual",
                    {{"x", {5, 4}}, {"W", {3, 4}}, {"b", {3}}, {"r", {5, 3}}},
                    [](Tape&, std::span<const Var> v) { return linear(v[0], v[1], v[2], v[3]); }},
                   {"residual, no bias, rank 3",
                    {{"x", {2, 3, 4}}, {"W", {6, 4}}, {"r", {2, 3, 6}}},
                    [](Tape&, std::span<const Var> v) { return linear(v[0], v[1], Var{}, v[2]); }}},
         // x, W and an optional b; with residual=true, the last value is the residual r.
         .inputs = {2, 4},
         .call =
             [](std::span<const Var> x, const OpArgs& a) {
               const bool residual = a.flag("residual", false);
               const size_t without = x.size() - (residual ? 1 : 0);  // x, W and b where given
               if (without < 2 || without > 3)
                 fail("linear: takes x, W and an optional b{}, got {} values", residual ? ", then the residual" : "",
                      x.size());
               return linear(x[0], x[1], without > 2 ? x[2] : Var{}, residual ? x.back() : Var{});
             },
         // y = x·Wᵀ (+ b).
         .unfused =
             [](Tape&, std::span<const Var> x) {
               const Var y = matmul(x[0], transpose(x[1]));
               return x.size() > 2 ? add(y, x[2]) : y;
             }});
  return r.ops;
}

}  // namespace tapegrad
