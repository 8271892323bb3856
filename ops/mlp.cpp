// The transformer block's MLP as one node: linear, gelu, linear (models/gpt.cpp), in PyTorch's weight layout.
//
// x (N, C) (any leading axes), W₁ (H, C), b₁ (H) or none, W₂ (C′, H), b₂ (C′) or none:
//   u = x·W₁ᵀ + b₁          (N, H)
//   h = gelu(u)             (N, H)    either form of ops/gelu.hpp: exact h = u·Φ(u), or tanh h = ½u(1 + tanh(…))
//   y = h·W₂ᵀ + b₂          (N, C′)
// The chain rule through the three maps (linear.cpp's derivatives, gelu′ of ops/gelu.hpp):
//   VJP  W̄₂ += ȳᵀ·h,  b̄₂ += Σ_rows ȳ,  h̄ = ȳ·W₂,  ū = gelu′(u) ⊙ h̄,  W̄₁ += ūᵀ·x,  b̄₁ += Σ_rows ū,  x̄ += ū·W₁
//   JVP  u̇ = ẋ·W₁ᵀ + x·Ẇ₁ᵀ + ḃ₁,  ḣ = gelu′(u) ⊙ u̇,  ẏ = ḣ·W₂ᵀ + h·Ẇ₂ᵀ + ḃ₂
// What the fusion saves against linear → gelu → linear: the node keeps u and s (N·H each: s = Φ(u), or 1 − |t| for
// t the tanh of gelu's argument) and not h, which the VJP and JVP rebuild from them (u·s, or ½u(1 + t)); and the
// tape allocates no gradient for u and h: h, h̄ and ū (or ḣ) are two (N, H) arrays of the tape's scratch
// (engine/scratch.hpp), reserved when the node is recorded and shared with every other node of the tape, not kept
// per node (the forward takes h from it too; the second-order rule takes five). For the default GPT that is 4.7 MB
// less per block and step. Where the products run in bf16 the node does keep h, rounded (MlpRounded below): half
// of h's bytes, for a backward that neither recomputes h nor rounds it again.
// The forward adds b₁ to each row of u just before that row's gelu (gelu_forward_biased), one pass over u where
// add_rows and the gelu took two. With a residual r of y's shape, y = (h·W₂ᵀ + b₂) + r, r̄ += ȳ and ẏ += ṙ, as for
// linear (linear.cpp): the GPT block's x + mlp(ln_2(x)) in this node.
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "ops/products/blas.hpp"
#include "ops/sheet.hpp"
#include "ops/common.hpp"
#include "ops/gelu.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

constexpr const char* kOp = "mlp";

struct MlpDims {
  int64_t n, c, h, c_out;  // rows, input width, hidden width, output width
  GeluForm form;
};

// Where the products run in bf16: the operands each rounded once (ops/products/blas.hpp round_for_products), the
// forward's kept with the node for the backward. x, W₁, W₂ and h in the forward (so the backward neither recomputes
// h nor rounds it again for W̄₂), ȳ and ū once each in the backward for their two products: six roundings a step
// where the products would make twelve. All null in float32 and float64.
struct MlpRounded {
  uint16_t *x = nullptr, *w1 = nullptr, *w2 = nullptr, *h = nullptr;  // the forward's, kept
  uint16_t *g = nullptr, *ubar = nullptr;                             // the backward's, in its scratch
};

// u = x·W₁ᵀ + b₁, s and h = gelu(u) (h into `h`; s is Φ(u) or 1 − |tanh| of the argument), y = h·W₂ᵀ + b₂.
template <class T>
void mlp_forward(const MlpDims& d, const T* x, const T* w1, const T* b1, const T* w2, const T* b2, T* u, T* s, T* h,
                 T* y, const MlpRounded& r) {
  gemm(d.n, d.h, d.c, T(1), with_rounding(as_is(x, d.c), r.x), with_rounding(transposed(w1, d.c), r.w1), T(0), u, d.h);
  gelu_forward_biased(d.form, h, s, u, b1, d.n, d.h);  // u += b₁, h = gelu(u)
  if constexpr (std::is_same_v<T, float>)
    if (r.h) round_for_products(r.h, h, d.n, d.h, d.h);
  gemm(d.n, d.c_out, d.h, T(1), with_rounding(as_is(h, d.h), r.h), with_rounding(transposed(w2, d.h), r.w2), T(0), y,
       d.c_out);
  if (b2) add_rows(y, b2, d.n, d.c_out);
}

// The VJP of the header; gradients that are null are not computed. h and hbar are (n, H) scratch.
// With r.g and r.ubar set, ȳ and ū are rounded into them once for their two products each. The products add into
// x̄, W̄₁ and W̄₂ with β = 1, or write them with β = 0 (a fresh gradient buffer, Tape::fresh_gradient).
struct MlpBetas {
  double dx = 1, dw1 = 1, dw2 = 1;
};
template <class T>
void mlp_vjp(const MlpDims& d, const T* x, const T* w1, const T* w2, const T* u, const T* s, const T* g, T* dx, T* dw1,
             T* db1, T* dw2, T* db2, T* h, T* hbar, const MlpRounded& r, const MlpBetas& beta = {}) {
  if constexpr (std::is_same_v<T, float>)
    if (r.g) round_for_products(r.g, g, d.n, d.c_out, d.c_out);
  // h for W̄₂ is rebuilt from u and s, unless the forward kept it rounded for a bf16 product. h̄ = ȳ·W₂ first, then
  // h and ū = gelu′(u) ⊙ h̄ in one pass over u and s, then the products that read them (in any order the same bits:
  // none adds into another's).
  const bool h_needed = dw2 && (!r.h || !runs_in_bf16(d.c_out, d.h, d.n)), ubar_needed = dx || dw1 || db1;
  if (ubar_needed) {
    gemm(d.n, d.h, d.c_out, T(1), with_rounding(as_is(g, d.c_out), r.g), with_rounding(as_is(w2, d.h), r.w2), T(0),
         hbar, d.h);
    if (h_needed) gelu_value_and_derivative_in_place(d.form, h, hbar, u, s, d.n * d.h);  // h and ū
    else gelu_derivative_in_place(d.form, hbar, u, s, d.n * d.h);                        // ū
    if constexpr (std::is_same_v<T, float>)
      if (r.ubar) round_for_products(r.ubar, hbar, d.n, d.h, d.h);
  } else if (h_needed) {
    gelu_from_saved(d.form, h, u, s, d.n * d.h);
  }
  if (dw2)
    gemm(d.c_out, d.h, d.n, T(1), with_rounding(transposed(g, d.c_out), r.g), with_rounding(as_is(h, d.h), r.h),
         T(beta.dw2), dw2, d.h);
  if (db2) sum_rows(db2, g, d.n, d.c_out);
  if (dw1)
    gemm(d.h, d.c, d.n, T(1), with_rounding(transposed(hbar, d.h), r.ubar), with_rounding(as_is(x, d.c), r.x),
         T(beta.dw1), dw1, d.c);
  if (db1) sum_rows(db1, hbar, d.n, d.h);
  if (dx)
    gemm(d.n, d.c, d.h, T(1), with_rounding(as_is(hbar, d.h), r.ubar), with_rounding(as_is(w1, d.c), r.w1), T(beta.dx),
         dx, d.c);
}

// The JVP of the header, added into ty; null tangents contribute nothing. h and hdot are (n, H) scratch.
template <class T>
void mlp_jvp(const MlpDims& d, const T* x, const T* w1, const T* w2, const T* u, const T* s, const T* tx, const T* tw1,
             const T* tb1, const T* tw2, const T* tb2, T* ty, T* h, T* hdot) {
  if (tx || tw1 || tb1) {
    std::fill(hdot, hdot + d.n * d.h, T(0));
    if (tx) gemm(d.n, d.h, d.c, T(1), as_is(tx, d.c), transposed(w1, d.c), T(1), hdot, d.h);
    if (tw1) gemm(d.n, d.h, d.c, T(1), as_is(x, d.c), transposed(tw1, d.c), T(1), hdot, d.h);
    if (tb1) add_rows(hdot, tb1, d.n, d.h);
    gelu_derivative_in_place(d.form, hdot, u, s, d.n * d.h);  // ḣ
    gemm(d.n, d.c_out, d.h, T(1), as_is(hdot, d.h), transposed(w2, d.h), T(1), ty, d.c_out);
  }
  if (tw2) {
    gelu_from_saved(d.form, h, u, s, d.n * d.h);
    gemm(d.n, d.c_out, d.h, T(1), as_is(h, d.h), transposed(tw2, d.h), T(1), ty, d.c_out);
  }
  if (tb2) add_rows(ty, tb2, d.n, d.c_out);
}

// Second order (Tape::hvp): the tangent of the VJP at a fixed ȳ, with u̇ = ẋW₁ᵀ + xẆ₁ᵀ + ḃ₁, ḣ = gelu′(u) ⊙ u̇,
// h̄ = ȳW₂, ū = gelu′(u) ⊙ h̄ as in the VJP:
//   Ẇ̄₂ += ȳᵀḣ,   ū̇ = gelu″(u) ⊙ u̇ ⊙ h̄ + gelu′(u) ⊙ ȳẆ₂,
//   Ẇ̄₁ += ū̇ᵀx + ūᵀẋ,   ḃ̄₁ += Σ_rows ū̇,   ẋ̄ += ū̇W₁ + ūẆ₁        (b̄₂ = Σȳ does not move)
// gelu″ of either form is in ops/gelu.hpp. Null tangents contribute nothing; null outputs are not computed. The
// five (n, H) arrays h̄, ū, u̇, ḣ, ū̇ come from `scratch`.
template <class T>
void mlp_second_order(const MlpDims& d, const T* x, const T* w1, const T* w2, const T* u, const T* s, const T* g,
                      const T* tx, const T* tw1, const T* tb1, const T* tw2, T* dx, T* dw1, T* db1, T* dw2,
                      ScratchChunk scratch) {
  const int64_t nh = d.n * d.h;
  T *hbar = scratch.take<T>(nh), *ubar = scratch.take<T>(nh), *udot = scratch.take<T>(nh);
  T *hdot = scratch.take<T>(nh), *ubar_dot = scratch.take<T>(nh);
  gemm(d.n, d.h, d.c_out, T(1), as_is(g, d.c_out), as_is(w2, d.h), T(0), hbar, d.h);
  std::copy(hbar, hbar + nh, ubar);
  gelu_derivative_in_place(d.form, ubar, u, s, nh);
  std::fill(udot, udot + nh, T(0));
  if (tx) gemm(d.n, d.h, d.c, T(1), as_is(tx, d.c), transposed(w1, d.c), T(1), udot, d.h);
  if (tw1) gemm(d.n, d.h, d.c, T(1), as_is(x, d.c), transposed(tw1, d.c), T(1), udot, d.h);
  if (tb1) add_rows(udot, tb1, d.n, d.h);
  if (dw2) {
    std::copy(udot, udot + nh, hdot);
    gelu_derivative_in_place(d.form, hdot, u, s, nh);
    gemm(d.c_out, d.h, d.n, T(1), transposed(g, d.c_out), as_is(hdot, d.h), T(1), dw2, d.h);
  }
  std::fill(ubar_dot, ubar_dot + nh, T(0));
  gelu_curvature(d.form, ubar_dot, u, s, udot, hbar, nh);
  if (tw2) {
    T* hbar_dot = hdot;  // ȳẆ₂ (ḣ is no longer needed)
    gemm(d.n, d.h, d.c_out, T(1), as_is(g, d.c_out), as_is(tw2, d.h), T(0), hbar_dot, d.h);
    gelu_derivative(d.form, ubar_dot, u, s, hbar_dot, nh);
  }
  if (dw1) {
    gemm(d.h, d.c, d.n, T(1), transposed(ubar_dot, d.h), as_is(x, d.c), T(1), dw1, d.c);
    if (tx) gemm(d.h, d.c, d.n, T(1), transposed(ubar, d.h), as_is(tx, d.c), T(1), dw1, d.c);
  }
  if (db1) sum_rows(db1, ubar_dot, d.n, d.h);
  if (dx) {
    gemm(d.n, d.c, d.h, T(1), as_is(ubar_dot, d.h), as_is(w1, d.c), T(1), dx, d.c);
    if (tw1) gemm(d.n, d.c, d.h, T(1), as_is(ubar, d.h), as_is(tw1, d.c), T(1), dx, d.c);
  }
}

void expect_weight(const Var& w, int64_t rows, int64_t cols, const char* what, const Shape& x) {
  if (w.rank() != 2 || w.shape()[1] != cols || (rows >= 0 && w.shape()[0] != rows))
    fail("{}: {} must be ({}, {}) for an input of shape {}, got {}", kOp, what, rows >= 0 ? std::to_string(rows) : "H",
         cols, x, w.shape());
}

void expect_bias(const Var& b, int64_t n, const char* what, const Var& w) {
  if (b.defined() && (b.rank() != 1 || b.shape()[0] != n))
    fail("{}: {} must be ({}) for a weight of shape {}, got {}", kOp, what, n, w.shape(), b.shape());
}

}  // namespace

Var mlp(Var x, Var w1, Var b1, Var w2, Var b2, GeluForm form, Var residual) {
  std::vector<Var> inputs{x, w1, w2};
  if (b1.defined()) inputs.push_back(b1);
  if (b2.defined()) inputs.push_back(b2);
  if (residual.defined()) inputs.push_back(residual);
  Tape& tape = x.tape();
  for (const Var& v : inputs) {
    (void)tape_of(kOp, {x, v});
    expect_float(kOp, v);
    expect_same_dtype(kOp, x, v);
  }
  expect_min_rank(kOp, x, 1, "the input");
  const int64_t c = x.shape().back();
  expect_weight(w1, -1, c, "the first weight", x.shape());
  const int64_t hidden = w1.shape()[0];
  expect_weight(w2, -1, hidden, "the second weight", x.shape());
  expect_bias(b1, hidden, "the first bias", w1);
  expect_bias(b2, w2.shape()[0], "the second bias", w2);
  const MlpDims d{x.shape().rows(), c, hidden, w2.shape()[0], form};
  Shape y_shape = x.shape();
  y_shape[y_shape.rank() - 1] = d.c_out;
  expect_residual_shape(kOp, residual, y_shape, x);
  const Tensor rv = residual.defined() ? residual.value() : Tensor{};
  const Tensor xv = x.value(), w1v = w1.value(), w2v = w2.value();
  const Tensor b1v = b1.defined() ? b1.value() : Tensor{}, b2v = b2.defined() ? b2.value() : Tensor{};
  const DType dtype = x.dtype();
  Tensor u = tape.empty(dtype, {d.n, d.h}, "u = xW₁ᵀ + b₁"),
         s = tape.empty(dtype, {d.n, d.h}, form == GeluForm::exact ? "Φ(u)" : "1 − |tanh| of gelu's argument");
  Tensor y = tape.empty(dtype, y_shape);
  // Scratch (engine/scratch.hpp): two (N, H) arrays for the forward (h), the VJP (h, h̄) and the JVP (h, ḣ), five
  // for the second-order rule.
  // In bf16 (MlpRounded), the VJP's scratch also holds ȳ and ū rounded, and the forward's roundings stay on the tape.
  const bool bf16 = dtype == DType::f32 && runs_in_bf16(d.n, d.h, d.c);
  const ScratchNeed two = scratch_need(dtype, {d.n * d.h, d.n * d.h});
  const ScratchNeed vjp_need =
      bf16 ? scratch_need(dtype, {d.n * d.h, d.n * d.h, (d.n * d.c_out + 1) / 2, (d.n * d.h + 1) / 2}) : two;
  const ScratchNeed five = scratch_need(dtype, {d.n * d.h, d.n * d.h, d.n * d.h, d.n * d.h, d.n * d.h});
  reserve_scratch(tape, vjp_need.bytes(), five.bytes());
  MlpRounded rounded;
  if (bf16) {
    const std::array<uint16_t*, 4> kept = bf16_copies<4>(tape, {d.n * d.c, d.h * d.c, d.c_out * d.h, d.n * d.h});
    rounded = {kept[0], kept[1], kept[2], kept[3]};
    round_for_products(rounded.x, xv.data<float>(), d.n, d.c, d.c);
    round_for_products(rounded.w1, w1v.data<float>(), d.h, d.c, d.c);
    round_for_products(rounded.w2, w2v.data<float>(), d.c_out, d.h, d.h);
  }
  Tape* tp = &tape;
  dispatch_float(kOp, dtype, [&]<class T>(T) {
    T* h = tape.scratch().take_one(two).take<T>(d.n * d.h);
    mlp_forward(d, xv.data<T>(), w1v.data<T>(), data_or_null<T>(b1v), w2v.data<T>(), data_or_null<T>(b2v), u.data<T>(),
                s.data<T>(), h, y.data<T>(), rounded);
    if (rv.defined()) add_elements(y.data<T>(), rv.data<T>(), d.n * d.c_out);  // y += r, after b₂
  });
  // gin / tin follow `inputs`: x, W₁, W₂, then b₁, b₂ and the residual where given.
  const bool has_b1 = b1.defined(), has_b2 = b2.defined(), has_residual = residual.defined();
  const size_t residual_slot = 3 + (has_b1 ? 1 : 0) + (has_b2 ? 1 : 0);
  auto bias_slot = [has_b1, has_b2](std::span<const Tensor> slots, int which) {
    const size_t i1 = 3, i2 = has_b1 ? 4 : 3;
    if (which == 1) return has_b1 ? slots[i1] : Tensor{};
    return has_b2 ? slots[i2] : Tensor{};
  };
  auto vjp = [=](const Tensor& g, std::span<Tensor> gin) {
    dispatch_float(kOp, dtype, [&]<class T>(T) {
      ScratchChunk scratch = tp->scratch().take_one(vjp_need);
      T *h = scratch.take<T>(d.n * d.h), *hbar = scratch.take<T>(d.n * d.h);
      MlpRounded r = rounded;
      if (bf16 && runs_in_bf16(d.n, d.h, d.c)) {
        r.g = scratch.take<uint16_t>(d.n * d.c_out);
        r.ubar = scratch.take<uint16_t>(d.n * d.h);
      }
      if (has_b1) zero_if_fresh(*tp, 3, gin[3]);  // b̄₁ and b̄₂ are sums over rows, added into their buffers
      if (has_b2) zero_if_fresh(*tp, has_b1 ? 4 : 3, bias_slot(gin, 2));
      const MlpBetas betas{beta_for<double>(*tp, 0), beta_for<double>(*tp, 1), beta_for<double>(*tp, 2)};
      mlp_vjp(d, xv.data<T>(), w1v.data<T>(), w2v.data<T>(), u.data<T>(), s.data<T>(), g.data<T>(),
              data_or_null<T>(gin[0]), data_or_null<T>(gin[1]), data_or_null<T>(bias_slot(gin, 1)),
              data_or_null<T>(gin[2]), data_or_null<T>(bias_slot(gin, 2)), h, hbar, r, betas);
      if (has_residual && gin[residual_slot].defined())  // r̄ += ȳ, or r̄ = ȳ where fresh
        add_or_copy_elements(gin[residual_slot].data<T>(), g.data<T>(), d.n * d.c_out,
                             !tp->fresh_gradient(residual_slot));
    });
  };
  auto jvp = [=](std::span<const Tensor> tin, Tensor& ty) {
    dispatch_float(kOp, dtype, [&]<class T>(T) {
      ScratchChunk scratch = tp->scratch().take_one(two);
      T *h = scratch.take<T>(d.n * d.h), *hdot = scratch.take<T>(d.n * d.h);
      mlp_jvp(d, xv.data<T>(), w1v.data<T>(), w2v.data<T>(), u.data<T>(), s.data<T>(), data_or_null<T>(tin[0]),
              data_or_null<T>(tin[1]), data_or_null<T>(bias_slot(tin, 1)), data_or_null<T>(tin[2]),
              data_or_null<T>(bias_slot(tin, 2)), ty.data<T>(), h, hdot);
      if (has_residual && tin[residual_slot].defined())
        add_elements(ty.data<T>(), tin[residual_slot].data<T>(), d.n * d.c_out);  // ẏ += ṙ
    });
  };
  auto second = [=](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
    dispatch_float(kOp, dtype, [&]<class T>(T) {
      mlp_second_order(d, xv.data<T>(), w1v.data<T>(), w2v.data<T>(), u.data<T>(), s.data<T>(), g.data<T>(),
                       data_or_null<T>(tin[0]), data_or_null<T>(tin[1]), data_or_null<T>(bias_slot(tin, 1)),
                       data_or_null<T>(tin[2]), data_or_null<T>(gin_dot[0]), data_or_null<T>(gin_dot[1]),
                       data_or_null<T>(bias_slot(gin_dot, 1)), data_or_null<T>(gin_dot[2]),
                       tp->scratch().take_one(five));
    });
  };
  Var out = tape.record(kOp, std::span<const Var>(inputs), y, vjp, jvp, second);
  tape.vjp_writes_fresh(out);
  return out;
}

std::vector<OpSheet> mlp_ops() {
  OpSheets r;
  r.add(
      {.name = kOp,
       .family = "mlp",
       .forward = "y = gelu(xW₁ᵀ + b₁)W₂ᵀ + b₂ (+ r, a residual; gelu exact, x·Φ(x), or of the tanh form)",
       .vjp = "u = xW₁ᵀ + b₁, h = gelu(u): W̄₂ += ȳᵀh, b̄₂ += Σȳ, ū = gelu′(u) ⊙ ȳW₂, W̄₁ += ūᵀx, b̄₁ += Σū, "
              "x̄ += ūW₁ (r̄ += ȳ with a residual)",
       .jvp = "ẏ = (gelu′(u) ⊙ (ẋW₁ᵀ + xẆ₁ᵀ + ḃ₁))W₂ᵀ + hẆ₂ᵀ + ḃ₂ (+ ṙ)",
       .second_order = "u̇ = ẋW₁ᵀ + xẆ₁ᵀ + ḃ₁, ḣ = gelu′(u) ⊙ u̇, h̄ = ȳW₂: Ẇ̄₂ += ȳᵀḣ, "
                       "ū̇ = gelu″(u) ⊙ u̇ ⊙ h̄ + gelu′(u) ⊙ ȳẆ₂, Ẇ̄₁ += ū̇ᵀx + ūᵀẋ, ḃ̄₁ += Σū̇, ẋ̄ += ū̇W₁ + ūẆ₁",
       .second_order_derivation = "6.8",
       // rows × (C·H + H·out) multiply-adds forward; backward and forward mode twice that (two products for
       // each: x̄ and W̄, or ẋWᵀ and xẆᵀ)
       .cost =
           [](std::span<const Shape> in, const Shape& y) {
             const double H = static_cast<double>(in[1][0]), C = static_cast<double>(in[1][1]);
             const double out = static_cast<double>(y[y.rank() - 1]), rows = static_cast<double>(y.numel()) / out;
             const double forward = 2 * rows * (C * H + H * out);
             return OpCost{forward, 2 * forward, 2 * forward};
           },
       // Its gradcheck cases, each checked to first and second order by the suite:
       .cases = {{"exact gelu, biases, x (5, 4), H = 6, out 3",
                  {{"x", {5, 4}}, {"w1", {6, 4}}, {"b1", {6}}, {"w2", {3, 6}}, {"b2", {3}}},
                  [](Tape&, std::span<const Var> v) { return mlp(v[0], v[1], v[2], v[3], v[4], GeluForm::exact); }},
                 {"tanh gelu, biases, x (5, 4), H = 6, out 3",
                  {{"x", {5, 4}}, {"w1", {6, 4}}, {"b1", {6}}, {"w2", {3, 6}}, {"b2", {3}}},
                  [](Tape&, std::span<const Var> v) { return mlp(v[0], v[1], v[2], v[3], v[4], GeluForm::tanh); }},
                 {"exact gelu, no biases, x (2, 3, 4), H = 8",
                  {{"x", {2, 3, 4}}, {"w1", {8, 4}}, {"w2", {4, 8}}},
                  [](Tape&, std::span<const Var> v) { return mlp(v[0], v[1], {}, v[2], {}, GeluForm::exact); }},
                 {"tanh gelu, first bias only, x (3, 5), H = 7",
                  {{"x", {3, 5}}, {"w1", {7, 5}}, {"b1", {7}}, {"w2", {2, 7}}},
                  [](Tape&, std::span<const Var> v) { return mlp(v[0], v[1], v[2], v[3], {}, GeluForm::tanh); }},
                 {"exact gelu, no biases, residual, x (3, 4), H = 6",
                  {{"x", {3, 4}}, {"w1", {6, 4}}, {"w2", {5, 6}}, {"r", {3, 5}}},
                  [](Tape&, std::span<const Var> v) { return mlp(v[0], v[1], {}, v[2], {}, GeluForm::exact, v[3]); }}},
       // x, W₁, b₁, W₂, b₂, and with residual=true the residual r; form= exact or tanh (the default).
       .inputs = {5, 6},
       .call =
           [](std::span<const Var> x, const OpArgs& a) {
             const std::string name = a.text("form", "tanh");
             const std::optional<GeluForm> form = gelu_form_named(name);
             if (!form) fail("{}: form must be exact or tanh, got '{}'", kOp, name);
             const bool residual = a.flag("residual", false);
             if (x.size() != (residual ? 6u : 5u))
               fail("{}: takes x, W₁, b₁, W₂, b₂{}, got {} values", kOp, residual ? " and the residual" : "", x.size());
             return mlp(x[0], x[1], x[2], x[3], x[4], *form, residual ? x[5] : Var{});
           },
       // u = xW₁ᵀ + b₁, h = gelu(u) (the exact form, as the first case), y = hW₂ᵀ + b₂.
       .unfused = [](Tape&,
                     std::span<const Var> x) { return linear(gelu_erf(linear(x[0], x[1], x[2])), x[3], x[4]); }});
  return r.ops;
}

}  // namespace tapegrad
