// row_normalize: β(x) = x / (1 + ‖x‖) over the last axis, x (..., n) → (..., n).
// The row map and its derivation (the full Jacobian c·I − (c²/r)·x xᵀ, symmetric; the identity at x = 0; why the
// β-attention post's homogeneity shortcut does not hold) are in ops/row_maps.hpp. The node keeps its output β and
// r = ‖x‖ per row, which both its VJP and its JVP are written in.
#include "ops/sheet.hpp"
#include "ops/common.hpp"
#include "ops/ops.hpp"
#include "ops/row_maps.hpp"

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
  Tensor r = tape.empty(x.dtype(), Shape{rows}, "r = ‖x‖ per row");
  dispatch_float(op, x.dtype(), [&]<class T>(T) {
    T *py = y.data<T>(), *pr = r.data<T>();
    const T* px = xv.data<T>();
    for (int64_t i = 0; i < rows; ++i) pr[i] = beta_row(py + i * cols, px + i * cols, cols, cols);
  });
  // x̄ += dβ(x)ᵀ·ȳ and ẏ = dβ(x)·ẋ: the Jacobian is symmetric, one kernel for both.
  auto jacobian_product = [=](Tensor out, const Tensor& u) {
    dispatch_float(op, out.dtype(), [&]<class T>(T) {
      T* po = out.data<T>();
      const T *pu = u.data<T>(), *py = y.data<T>(), *pr = r.data<T>();
      for (int64_t i = 0; i < rows; ++i)
        beta_row_derivative<Into::add>(po + i * cols, pu + i * cols, py + i * cols, pr[i], cols, cols);
    });
  };
  return tape.record(
      op, {x}, y,
      [=](const Tensor& g, std::span<Tensor> gin) {
        if (gin[0].defined()) jacobian_product(gin[0], g);
      },
      [=](std::span<const Tensor> tin, Tensor& ty) {
        if (tin[0].defined()) jacobian_product(ty, tin[0]);
      },
      [=](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
        if (!tin[0].defined() || !gin_dot[0].defined()) return;
        dispatch_float(op, g.dtype(), [&]<class T>(T) {
          T* po = gin_dot[0].data<T>();
          const T *pg = g.data<T>(), *pt = tin[0].data<T>(), *py = y.data<T>(), *pr = r.data<T>();
          for (int64_t i = 0; i < rows; ++i)
            beta_row_second_order(po + i * cols, pg + i * cols, pt + i * cols, py + i * cols, pr[i], cols);
        });
      });
}

// β's worked example (`tapegrad explain row_normalize --trace`, docs/learn.md §5): three rows of two, the forward
// and the VJP (beta_row_derivative's formula) written again with primitive ops.
OpTrace row_normalize_trace() {
  return {
      .example = {"3 rows of 2", {{"x", {3, 2}}}, [](Tape&, std::span<const Var> x) { return row_normalize(x[0]); }},
      .lines = [](TraceLines& t, std::span<const Var> x, const Var& g) -> std::vector<Var> {
        const Var one = x[0].tape().constant(Tensor::from<double>(Shape{}, {1.0}));
        const Var r = t.show("r = ‖x‖, per row", sqrt(sum(square(x[0]), -1, true)));
        const Var c = t.show("c = 1/(1 + r)", div(one, add(one, r)));
        const Var y = t.show("y = β(x) = c·x", mul(c, x[0]));
        t.part("VJP (ȳ given): x̄ = Jᵀȳ with J = c·I − y yᵀ/r per row (c·I alone is x̄ without the row term)");
        const Var own = t.show("c·ȳ, x̄ without the row term", mul(c, g));
        const Var k = t.show("k = ⟨y, ȳ⟩/r, per row", div(sum(mul(y, g), -1, true), r));
        const Var row = t.show("k·y, the row term (y yᵀ·ȳ/r)", mul(k, y));
        return {t.show("x̄ = c·ȳ − k·y", sub(own, row))};
      }};
}

std::vector<OpSheet> row_normalize_ops() {
  OpSheets r;
  auto apply = [](Tape&, std::span<const Var> x) { return row_normalize(x[0]); };
  r.add({.name = "row_normalize",
         .family = "row_normalize",
         .forward = "per row: y = β(x) = x/(1 + ‖x‖)",
         .vjp = "per row, r = ‖x‖, c = 1/(1+r): x̄ += c·ȳ − (⟨y,ȳ⟩/r)·y; identity at x = 0",
         .jvp = "per row: ẏ = c·ẋ − (⟨y,ẋ⟩/r)·y; identity at x = 0",
         .second_order = "per row, x̄ = c·ȳ − k·y with k = ⟨y, ȳ⟩/r: ẋ̄ += ċ·ȳ − k̇·y − k·ẏ, ṙ = ⟨x, ẋ⟩/r, "
                         "ċ = −c²ṙ, k̇ = ⟨ẏ, ȳ⟩/r − k·ṙ/r; 0 at x = 0 (β is not C² there)",
         .derivation = "1.2, 1.3",
         .second_order_derivation = "6.6",
         .formulas_at = {{"forward", "ops/row_maps.hpp", "beta_row"},
                         {"VJP and JVP", "ops/row_maps.hpp", "beta_row_derivative"},
                         {"second order", "ops/row_maps.hpp", "beta_row_second_order"}},
         // Per element, one flop per operation: forward square, sum, scale; VJP and JVP a dot product (2) and
         // c·u − k·x (3); √ and the divisions once per row.
         .cost =
             [](std::span<const Shape> in, const Shape&) {
               const double n = static_cast<double>(in[0].numel());
               return OpCost{3 * n, 5 * n, 5 * n};
             },
         // Its gradcheck cases, each checked to first and second order by the suite:
         .cases = {{"rows", {{"x", {4, 6}}}, apply},
                   {"x = 0", {{"x", {3, 5}, Fill::zeros}}, apply},
                   {"rank 3", {{"x", {2, 3, 4}}}, apply}},
         .inputs = 1,
         .call = [](std::span<const Var> x, const OpArgs&) { return row_normalize(x[0]); },
         .trace = row_normalize_trace()});
  return r.ops;
}

}  // namespace tapegrad
