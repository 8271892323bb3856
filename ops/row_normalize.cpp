// row_normalize: β(x) = x / (1 + ‖x‖) over the last axis, x (..., n) → (..., n).
// The row kernels and the derivation (the full Jacobian c·I − (c²/r)·x xᵀ, symmetric; the identity at x = 0; why
// the β-attention post's homogeneity shortcut does not hold) are in ops/row_normalize.hpp. The node keeps x, which
// both its VJP and its JVP are written in.
#include "engine/gradcheck/registry.hpp"
#include "ops/common.hpp"
#include "ops/ops.hpp"
#include "ops/row_normalize.hpp"

namespace tapegrad {

Var row_normalize(Var x) {
  static constexpr const char* op = "row_normalize";
  expect_float(op, x);
  expect_min_rank(op, x, 1, "its input");
  Tape& tape = x.tape();
  const Tensor xv = x.value();
  Tensor y = tape.empty(x.dtype(), x.shape());
  const int64_t cols = x.shape().back();
  const int64_t rows = cols == 0 ? 0 : x.shape().numel() / cols;
  dispatch_float(op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    row_normalize_forward(y.data<T>(), xv.data<T>(), rows, cols);
  });
  return tape.record(
      op, {x}, y,
      [=](const Tensor& g, std::span<const Tensor> gin) {
        if (!gin[0].defined()) return;
        dispatch_float(op, g.dtype(), [&](auto tag) {
          using T = decltype(tag);
          row_normalize_vjp(gin[0].data<T>(), xv.data<T>(), g.data<T>(), rows, cols);
        });
      },
      [=](std::span<const Tensor> tin, const Tensor& ty) {
        if (!tin[0].defined()) return;
        dispatch_float(op, ty.dtype(), [&](auto tag) {
          using T = decltype(tag);
          row_normalize_jvp(ty.data<T>(), xv.data<T>(), tin[0].data<T>(), rows, cols);
        });
      });
}

void register_row_normalize(Registry& r) {
  r.add({.name = "row_normalize",
         .family = "row_normalize",
         .equation =
             "per row, c = 1/(1+‖x‖): x̄ += c·ȳ − c²(⟨x,ȳ⟩/‖x‖)·x; ẏ = c·ẋ − c²(⟨x,ẋ⟩/‖x‖)·x; identity at x = 0",
         // Per element, one flop per operation: forward square, sum, scale; VJP and JVP a dot product (2) and
         // c·u − k·x (3); √ and the divisions once per row.
         .cost = [](std::span<const Shape> in, const Shape&) {
           const double n = static_cast<double>(in[0].numel());
           return OpCost{3 * n, 5 * n, 5 * n};
         },
         .forward = "per row: y = β(x) = x/(1 + ‖x‖)",
         .derivation = "1.2, 1.3"});
  auto apply = [](Tape&, std::span<const Var> x) { return row_normalize(x[0]); };
  r.add_case("row_normalize", {"rows", {{"x", {4, 6}}}, apply});
  r.add_case("row_normalize", {"x = 0", {{"x", {3, 5}, Fill::zeros}}, apply});
  r.add_case("row_normalize", {"rank 3", {{"x", {2, 3, 4}}}, apply});
}

}  // namespace tapegrad
