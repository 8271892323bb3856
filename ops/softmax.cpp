// softmax and log_softmax over the last axis: x (..., n) → (..., n), each row on its own.
// The row maps and their derivations (shift by the row max, masked −∞ entries, fully masked rows) are in
// ops/row_maps.hpp; a node keeps only its output, which both its VJP and its JVP are written in.
#include <limits>

#include "ops/sheet.hpp"
#include "ops/common.hpp"
#include "ops/ops.hpp"
#include "ops/row_maps.hpp"

namespace tapegrad {

namespace {

struct Softmax {
  static constexpr const char* name = "softmax";
  template <class T>
  static void forward(T* y, const T* x, int64_t n) {
    softmax_row(y, x, n, n);
  }
  template <class T>
  static void vjp(T* dx, const T* y, const T* dy, int64_t n) {
    softmax_row_derivative<Into::add>(dx, y, dy, softmax_row_term(y, dy, n), n);
  }
  template <class T>
  static void jvp(T* ty, const T* y, const T* tx, int64_t n) {
    softmax_row_derivative<Into::add>(ty, y, tx, softmax_row_term(y, tx, n), n);
  }
  template <class T>
  static void second_order(T* out, const T* y, const T* g, const T* tx, int64_t n) {
    softmax_row_second_order(out, y, g, tx, n);
  }
};

struct LogSoftmax {
  static constexpr const char* name = "log_softmax";
  template <class T>
  static void forward(T* z, const T* x, int64_t n) {
    log_softmax_row(z, x, n);
  }
  template <class T>
  static void vjp(T* dx, const T* z, const T* dz, int64_t n) {
    log_softmax_row_vjp<Into::add>(dx, z, dz, n);
  }
  template <class T>
  static void jvp(T* tz, const T* z, const T* tx, int64_t n) {
    log_softmax_row_jvp<Into::add>(tz, z, tx, n);
  }
  template <class T>
  static void second_order(T* out, const T* z, const T* dz, const T* tx, int64_t n) {
    log_softmax_row_second_order(out, z, dz, tx, n);
  }
};

// One node per call: y = K(x) row by row; the node keeps y (σ(x) or log σ(x)) and nothing else.
template <class K>
Var row_distribution(Var x) {
  expect_float(K::name, x);
  expect_min_rank(K::name, x, 1, "its input");
  Tape& tape = x.tape();
  const Tensor xv = x.value();
  Tensor y = tape.empty(x.dtype(), x.shape());
  const int64_t cols = x.shape().back();
  const int64_t rows = cols == 0 ? 0 : x.shape().numel() / cols;
  dispatch_float(K::name, x.dtype(), [&]<class T>(T) {
    T* py = y.data<T>();
    const T* px = xv.data<T>();
    for (int64_t i = 0; i < rows; ++i) K::forward(py + i * cols, px + i * cols, cols);
  });
  return tape.record(
      K::name, {x}, y,
      [=](const Tensor& g, std::span<Tensor> gin) {
        if (!gin[0].defined()) return;
        dispatch_float(K::name, g.dtype(), [&]<class T>(T) {
          T* pgx = gin[0].data<T>();
          const T *py = y.data<T>(), *pg = g.data<T>();
          for (int64_t i = 0; i < rows; ++i) K::vjp(pgx + i * cols, py + i * cols, pg + i * cols, cols);
        });
      },
      [=](std::span<const Tensor> tin, Tensor& ty) {
        if (!tin[0].defined()) return;
        dispatch_float(K::name, ty.dtype(), [&]<class T>(T) {
          T* pty = ty.data<T>();
          const T *py = y.data<T>(), *ptx = tin[0].data<T>();
          for (int64_t i = 0; i < rows; ++i) K::jvp(pty + i * cols, py + i * cols, ptx + i * cols, cols);
        });
      },
      [=](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
        if (!tin[0].defined() || !gin_dot[0].defined()) return;
        dispatch_float(K::name, g.dtype(), [&]<class T>(T) {
          T* po = gin_dot[0].data<T>();
          const T *py = y.data<T>(), *pg = g.data<T>(), *ptx = tin[0].data<T>();
          for (int64_t i = 0; i < rows; ++i)
            K::second_order(po + i * cols, py + i * cols, pg + i * cols, ptx + i * cols, cols);
        });
      });
}

// x + M on the tape, with M a constant of x's shape that is −∞ where (row + column) % 3 == 0 and on every
// entry of row 1 (a fully masked row), 0 elsewhere: the masked-score path through a gradcheck.
Var add_mask(Tape& tape, Var x) {
  Tensor mask = Tensor::zeros(DType::f64, x.shape());
  const int64_t cols = x.shape().back(), rows = x.shape().numel() / cols;
  double* m = mask.data<double>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      if (i == 1 || (i + j) % 3 == 0) m[i * cols + j] = -std::numeric_limits<double>::infinity();
  return add(x, tape.constant(mask.to(x.dtype())));
}

}  // namespace

Var softmax(Var x) { return row_distribution<Softmax>(x); }
Var log_softmax(Var x) { return row_distribution<LogSoftmax>(x); }

// softmax's worked example (`tapegrad explain softmax --trace`, docs/learn.md §2): three rows of two, the forward
// and the VJP written again with primitive ops. Without the shift by max x, which changes no value.
OpTrace softmax_trace() {
  return {.example = {"3 rows of 2", {{"x", {3, 2}}}, [](Tape&, std::span<const Var> x) { return softmax(x[0]); }},
          .lines = [](TraceLines& t, std::span<const Var> x, const Var& g) -> std::vector<Var> {
            const Var e = t.show("e = exp(x)", exp(x[0]));
            const Var y = t.show("y = e / rowsum(e)", div(e, sum(e, -1, true)));
            t.part("VJP (ȳ given): x̄ = Jᵀȳ with J = diag(y) − y yᵀ per row");
            const Var own = t.show("y ⊙ ȳ, x̄ without the row term (diag(y)·ȳ alone)", mul(y, g));
            const Var d = t.show("D = rowsum(y ⊙ ȳ) = ⟨y, ȳ⟩, per row", sum(own, -1, true));
            const Var row = t.show("y ⊙ D, the row term (y yᵀ·ȳ)", mul(y, d));
            return {t.show("x̄ = y ⊙ ȳ − y ⊙ D = y ⊙ (ȳ − D)", sub(own, row))};
          }};
}

std::vector<OpSheet> softmax_ops() {
  OpSheets r;
  // Per element, one flop per operation (exp as one): forward max, subtract, exp, sum, divide; VJP and JVP a
  // product, a sum, a subtraction and a product.
  auto row_map_cost = [](std::span<const Shape> in, const Shape&) {
    const double n = static_cast<double>(in[0].numel());
    return OpCost{5 * n, 4 * n, 4 * n};
  };
  // The cases softmax and log_softmax share, then those of one op alone (own).
  auto row_cases = [](Var (*fn)(Var), std::vector<GradcheckCase> own = {}) {
    auto apply = [fn](Tape&, std::span<const Var> x) { return fn(x[0]); };
    std::vector<GradcheckCase> cases{{"width 5", {{"x", {4, 5}}}, apply},
                                     {"width 13", {{"x", {2, 13}}}, apply},
                                     {"rank 3", {{"x", {2, 3, 4}}}, apply},
                                     {"width 1", {{"x", {3, 1}}}, apply},
                                     // Logits near 1e4: the shift by the row max keeps the exponents in range.
                                     {"logits + 1e4", {{"x", {3, 6}}}, [fn](Tape& tape, std::span<const Var> x) {
                                        Tensor shift = Tensor::from<double>(Shape{}, {1e4});
                                        return fn(add(x[0], tape.constant(shift.to(x[0].dtype()))));
                                      }}};
    for (GradcheckCase& c : own) cases.push_back(std::move(c));
    return cases;
  };
  r.add({.name = "softmax",
         .family = "softmax",
         .forward = "per row: y = exp(x − max x) / Σ exp(x − max x)",
         .vjp = "per row: x̄ += y ⊙ (ȳ − ⟨y, ȳ⟩)",
         .jvp = "per row: ẏ = y ⊙ (ẋ − ⟨y, ẋ⟩)",
         .second_order = "per row: ẋ̄ += ẏ ⊙ (ȳ − ⟨y, ȳ⟩) − ⟨ẏ, ȳ⟩·y, ẏ = y ⊙ (ẋ − ⟨y, ẋ⟩)",
         .derivation = "2.1",
         .second_order_derivation = "6.4",
         .formulas_at = {{"forward", "ops/row_maps.hpp", "softmax_row"},
                         {"VJP and JVP", "ops/row_maps.hpp", "softmax_row_derivative"},
                         {"second order", "ops/row_maps.hpp", "softmax_row_second_order"}},
         .cost = row_map_cost,
         // Then masked scores (log_softmax is −∞ there, where no finite difference exists, so softmax only).
         // Its gradcheck cases, each checked to first and second order by the suite:
         .cases =
             row_cases(softmax, {{"masked -inf",
                                  {{"x", {4, 6}}},
                                  [](Tape& tape, std::span<const Var> x) { return softmax(add_mask(tape, x[0])); }}}),
         .inputs = 1,
         .call = [](std::span<const Var> x, const OpArgs&) { return softmax(x[0]); },
         .trace = softmax_trace()});
  r.add({.name = "log_softmax",
         .family = "softmax",
         .forward = "per row: z = x − max x − log Σ exp(x − max x)",
         .vjp = "per row: x̄ += z̄ − exp(z)·Σz̄",
         .jvp = "per row: ż = ẋ − ⟨exp(z), ẋ⟩",
         .second_order = "per row: ẋ̄ −= (Σz̄)·ṗ, p = exp(z), ṗ = p ⊙ (ẋ − ⟨p, ẋ⟩)",
         .second_order_derivation = "6.5",
         .formulas_at = {{"forward", "ops/row_maps.hpp", "log_softmax_row"},
                         {"VJP", "ops/row_maps.hpp", "log_softmax_row_vjp"},
                         {"JVP", "ops/row_maps.hpp", "log_softmax_row_jvp"},
                         {"second order", "ops/row_maps.hpp", "log_softmax_row_second_order"}},
         .cost = row_map_cost,
         // Its gradcheck cases, each checked to first and second order by the suite:
         .cases = row_cases(log_softmax),
         .inputs = 1,
         .call = [](std::span<const Var> x, const OpArgs&) { return log_softmax(x[0]); }});
  return r.ops;
}

}  // namespace tapegrad
