// mse_loss against a plain loop in float32 and float64, its derivatives in both inputs, and its refusal of shapes
// that only match by broadcasting.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "checker/gradcheck.hpp"
#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

TEST_CASE_TEMPLATE("mse_loss is the mean of squared differences, with p̄ = 2d/n and t̄ = −2d/n", T, float, double) {
  const DType dtype = dtype_of<T>();
  const Shape s{3, 4};
  const Tensor p = random_tensor(s, dtype, 1), t = random_tensor(s, dtype, 2);
  const Tensor tp = random_tensor(s, dtype, 3), tt = random_tensor(s, dtype, 4);
  Function f = [](Tape&, std::span<const Var> x) { return mse_loss(x[0], x[1]); };
  const Derivatives d = derivatives(f, {p, t}, tensor_of({}, {1.0}, dtype), {tp, tt});
  REQUIRE(d.out.shape() == Shape{});
  double loss = 0, tangent = 0;
  const double n = 12;
  for (int64_t i = 0; i < 12; ++i) {
    const double di = p.item(i) - t.item(i);
    loss += di * di / n;
    tangent += 2 * di * (tp.item(i) - tt.item(i)) / n;
    CHECK(d.grads[0].item(i) == doctest::Approx(2 * di / n).epsilon(1e-6));
    CHECK(d.grads[1].item(i) == doctest::Approx(-2 * di / n).epsilon(1e-6));
  }
  CHECK(d.out.item() == doctest::Approx(loss).epsilon(1e-6));
  CHECK(d.tangent.item() == doctest::Approx(tangent).epsilon(1e-6));
}

TEST_CASE("mse_loss of a constant target: only the prediction gets a gradient") {
  Tape tape;
  Var p = tape.leaf(tensor_of({4}, {1, 2, 3, 4}, DType::f64));
  Var t = tape.constant(tensor_of({4}, {1, 1, 1, 1}, DType::f64));
  Var loss = mse_loss(p, t);
  CHECK(loss.value().item() == doctest::Approx((0 + 1 + 4 + 9) / 4.0));
  tape.backward(loss);
  const std::vector<double> expected{0, 0.5, 1, 1.5};
  CHECK(p.grad().to_vector() == expected);
  CHECK_FALSE(t.grad().defined());
}

TEST_CASE("mse_loss refuses shapes that only match by broadcasting, and other bad input") {
  Tape tape;
  auto leaf = [&](Shape s, DType d = DType::f32) { return tape.leaf(Tensor::zeros(d, s)); };
  SUBCASE("(N, 1) against (N), which p − t would broadcast to (N, N)") {
    check_message(error_of([&] {
                    mse_loss(leaf({5, 1}), leaf({5}));
                  }),
                  "mse_loss",
                  {"prediction (5, 1)", "target (5)", "expected a target of shape (5, 1)", "no broadcasting"});
    check_message(error_of([&] {
                    mse_loss(leaf({5}), leaf({5, 1}));
                  }),
                  "mse_loss", {"prediction (5)", "target (5, 1)", "expected a target of shape (5)"});
  }
  SUBCASE("other broadcastable pairs") {
    for (const auto& shapes : {std::pair{Shape{4, 3}, Shape{3}},
                               {Shape{4, 3}, Shape{1, 3}},
                               {Shape{4, 3}, Shape{}},
                               {Shape{2, 1, 3}, Shape{2, 4, 3}}}) {
      CAPTURE(shapes.first);
      CAPTURE(shapes.second);
      check_message(error_of([&] { mse_loss(leaf(shapes.first), leaf(shapes.second)); }), "mse_loss",
                    {"differ in shape"});
    }
  }
  SUBCASE("dtypes, integers, no elements") {
    check_message(error_of([&] { mse_loss(leaf({3}), leaf({3}, DType::f64)); }), "mse_loss", {"dtypes differ"});
    Var ids = tape.constant(Tensor::zeros(DType::i32, {3}));
    check_message(error_of([&] { mse_loss(ids, ids); }), "mse_loss", {"int32"});
    check_message(error_of([&] { mse_loss(leaf({0, 3}), leaf({0, 3})); }), "mse_loss", {"no elements"});
  }
}

TEST_CASE("mse_loss passes its gradcheck cases") {
  const OpSheet* op = builtin_registry().find("mse_loss");
  REQUIRE(op != nullptr);
  for (const GradcheckReport& r : gradcheck(*op)) CHECK(r.passed);
}
