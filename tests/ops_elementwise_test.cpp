// sigmoid, square, sqrt, abs and pow against the C library in float32 and float64, their derivatives at the
// special points (abs at 0, pow with p = 0, sigmoid far out), their domain errors; and pointwise() for an op
// defined outside the library.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "checker/gradcheck.hpp"
#include "ops/ops.hpp"
#include "ops/pointwise.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

struct Elementwise {
  std::vector<double> y, dy_dx, tangent;  // y, x̄ for ȳ = 1, ẏ for ẋ = 1
};

// y = op(x), the gradient for ȳ = 1 and the tangent for ẋ = 1, in the given dtype, as doubles.
Elementwise run(Var (*op)(Var), const std::vector<double>& x, DType dtype) {
  const Shape s{static_cast<int64_t>(x.size())};
  Function f = [op](Tape&, std::span<const Var> v) { return op(v[0]); };
  Tensor ones = tensor_of(s, std::vector<double>(x.size(), 1.0), dtype);
  std::vector<Tensor> xs{tensor_of(s, x, dtype)}, ts{ones};
  Derivatives d = derivatives(f, xs, ones, ts);
  return {d.out.to_vector(), d.grads[0].to_vector(), d.tangent.to_vector()};
}

Var pow_2_5(Var x) { return tapegrad::pow(x, 2.5); }
Var pow_3(Var x) { return tapegrad::pow(x, 3); }
Var pow_m1(Var x) { return tapegrad::pow(x, -1); }
Var pow_0(Var x) { return tapegrad::pow(x, 0); }

struct Reference {
  const char* name;
  Var (*op)(Var);
  double (*f)(double);
  double (*df)(double);
  std::vector<double> x;
};

}  // namespace

TEST_CASE_TEMPLATE("sigmoid, square, sqrt, abs and pow match the C library and their derivatives", T, float, double) {
  const DType dtype = dtype_of<T>();
  const double tol = dtype == DType::f32 ? 2e-6 : 1e-14;
  const std::vector<double> any{-3.5, -1.25, -0.5, 0.25, 0.75, 2.0, 4.5}, pos{0.05, 0.5, 1.0, 2.25, 9.0};
  const std::vector<Reference> refs{
      {"sigmoid", sigmoid, [](double v) { return 1 / (1 + std::exp(-v)); },
       [](double v) { return std::exp(-v) / ((1 + std::exp(-v)) * (1 + std::exp(-v))); }, any},
      {"square", square, [](double v) { return v * v; }, [](double v) { return 2 * v; }, any},
      {"sqrt", tapegrad::sqrt, [](double v) { return std::sqrt(v); }, [](double v) { return 0.5 / std::sqrt(v); }, pos},
      {"abs", tapegrad::abs, [](double v) { return std::fabs(v); }, [](double v) { return v > 0 ? 1.0 : -1.0; }, any},
      {"pow 2.5", pow_2_5, [](double v) { return std::pow(v, 2.5); }, [](double v) { return 2.5 * std::pow(v, 1.5); },
       pos},
      {"pow 3", pow_3, [](double v) { return v * v * v; }, [](double v) { return 3 * v * v; }, any},
      {"pow -1", pow_m1, [](double v) { return 1 / v; }, [](double v) { return -1 / (v * v); }, any},
  };
  for (const Reference& r : refs) {
    CAPTURE(r.name);
    const Elementwise e = run(r.op, r.x, dtype);
    for (size_t i = 0; i < r.x.size(); ++i) {
      CAPTURE(r.x[i]);
      CHECK(std::fabs(e.y[i] - r.f(r.x[i])) <= tol * (1 + std::fabs(r.f(r.x[i]))));
      CHECK(std::fabs(e.dy_dx[i] - r.df(r.x[i])) <= tol * (1 + std::fabs(r.df(r.x[i]))));
      CHECK(e.tangent[i] == e.dy_dx[i]);  // one diagonal Jacobian for both modes
    }
  }
}

TEST_CASE_TEMPLATE("abs has derivative 0 at x = 0, in both modes", T, float, double) {
  const Elementwise e = run(tapegrad::abs, {-0.0, 0.0, 1e-30, -1e-30}, dtype_of<T>());
  CHECK(e.y[0] == 0.0);
  CHECK(e.dy_dx[0] == 0.0);
  CHECK(e.dy_dx[1] == 0.0);
  CHECK(e.tangent[0] == 0.0);
  CHECK(e.tangent[1] == 0.0);
  CHECK(e.dy_dx[3] == -1.0);
  CHECK(e.dy_dx[2] == 1.0);  // the kink is at 0 only: ±1e-30 (a normal float32 too) have slope ±1
}

TEST_CASE_TEMPLATE("sigmoid far out is 0 or 1 with a zero derivative, never NaN", T, float, double) {
  const Elementwise e = run(sigmoid, {-1000.0, -80.0, 0.0, 80.0, 1000.0}, dtype_of<T>());
  CHECK(e.y[0] == 0.0);
  CHECK(e.y[2] == 0.5);
  CHECK(e.dy_dx[2] == 0.25);
  CHECK(e.y[4] == 1.0);
  for (double g : e.dy_dx) CHECK(std::isfinite(g));
  CHECK(e.dy_dx[0] == 0.0);
  CHECK(e.dy_dx[4] == 0.0);
}

TEST_CASE("pow with p = 0 is 1 with derivative 0, also at x = 0") {
  const Elementwise e = run(pow_0, {-2.0, 0.0, 3.0}, DType::f64);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(e.y[i] == 1.0);
    CHECK(e.dy_dx[i] == 0.0);
  }
}

TEST_CASE("sqrt and pow refuse inputs where the result would be NaN or infinite") {
  Tape tape;
  Var x = tape.leaf(tensor_of({2, 2}, {1.0, 4.0, -0.5, 2.0}, DType::f32));
  check_message(error_of([&] { tapegrad::sqrt(x); }), "sqrt", {"element 2", "(2, 2)", "-0.5", "expected x ≥ 0"});
  check_message(error_of([&] { tapegrad::pow(x, 0.5); }), "pow", {"element 2", "-0.5", "p = 0.5"});
  CHECK(error_of([&] { tapegrad::pow(x, 3); }) == kNoError);  // an integer power of a negative number is defined
  Var z = tape.leaf(tensor_of({3}, {1.0, 0.0, 2.0}, DType::f64));
  check_message(error_of([&] { tapegrad::pow(z, -1); }), "pow", {"element 1", "(3)", "x ≠ 0", "p = -1"});
  CHECK(error_of([&] { tapegrad::sqrt(z); }) == kNoError);
  Var ids = tape.constant(Tensor::zeros(DType::i32, {2}));
  const std::pair<const char*, Var (*)(Var)> ops[] = {
      {"sigmoid", sigmoid}, {"square", square}, {"sqrt", tapegrad::sqrt}, {"abs", tapegrad::abs}, {"pow", pow_3}};
  for (const auto& named : ops)
    check_message(error_of([&] { named.second(ids); }), named.first, {"expected a float32 or float64 tensor", "int32"});
}

TEST_CASE("the registered new ops pass their gradcheck cases") {
  for (const char* name : {"sigmoid", "square", "sqrt", "abs", "pow"}) {
    CAPTURE(name);
    const OpSheet* op = builtin_registry().find(name);
    REQUIRE(op != nullptr);
    REQUIRE(!op->cases.empty());
    for (const GradcheckReport& r : gradcheck(*op)) CHECK(r.passed);
  }
}

// ---- pointwise(): an element-wise op of one's own ----

namespace {

// softsign y = x/(1 + |x|), f′ = 1/(1 + |x|)², as a user writes it (named apart from an op softsign in ops/).
Var user_softsign(Var x) {
  return pointwise(
      "user_softsign", x, [](auto v) { return v / (1 + std::abs(v)); },
      [](auto v) { return 1 / ((1 + std::abs(v)) * (1 + std::abs(v))); });
}
// f′ in y: the same map through df(x, y), with (1 − |y|)² = 1/(1 + |x|)².
Var softsign_in_y(Var x) {
  return pointwise(
      "softsign_y", x, [](auto v) { return v / (1 + std::abs(v)); },
      [](auto, auto y) { return (1 - std::abs(y)) * (1 - std::abs(y)); });
}

}  // namespace

TEST_CASE_TEMPLATE("pointwise builds forward, VJP and JVP from f and f′", T, float, double) {
  const DType dtype = dtype_of<T>();
  const std::vector<double> x{-4.0, -1.0, -0.25, 0.0, 0.5, 3.0};
  for (auto op : {user_softsign, softsign_in_y}) {
    const Elementwise e = run(op, x, dtype);
    for (size_t i = 0; i < x.size(); ++i) {
      const double d = 1 + std::fabs(x[i]);
      CHECK(e.y[i] == doctest::Approx(x[i] / d).epsilon(1e-6));
      CHECK(e.dy_dx[i] == doctest::Approx(1 / (d * d)).epsilon(1e-6));
      CHECK(e.tangent[i] == e.dy_dx[i]);
    }
  }
}

TEST_CASE("pointwise names its node, places it at the caller, and is gradchecked") {
  Tape tape;
  Var x = tape.leaf(tensor_of({2, 3}, {1, -2, 3, -4, 5, -6}, DType::f64));
  Var y = user_softsign(x);
  REQUIRE(tape.num_nodes() == 1);
  CHECK(std::string(tape.node(0).op) == "user_softsign");
  CHECK(contains(tape.node(0).where.file_name(), "ops_elementwise_test.cpp"));  // above, not the header
  CHECK(y.shape() == Shape{2, 3});

  Var ids = tape.constant(Tensor::zeros(DType::i32, {3}));
  check_message(error_of([&] { user_softsign(ids); }), "user_softsign", {"int32", "(3)"});

  Function f = [](Tape&, std::span<const Var> v) { return user_softsign(v[0]); };
  CHECK(gradcheck(f, {random_tensor({4, 5}, 11)}, {"x"}).passed);
  Function g = [](Tape&, std::span<const Var> v) { return softsign_in_y(v[0]); };
  CHECK(gradcheck(g, {random_tensor({4, 5}, 12)}, {"x"}).passed);
}

TEST_CASE("pointwise with a wrong f′ is caught by the gradchecker") {
  Function wrong = [](Tape&, std::span<const Var> v) {
    return pointwise(
        "softsign_wrong", v[0], [](auto s) { return s / (1 + std::abs(s)); },
        [](auto s) { return 1 / (1 + std::abs(s)); });  // forgets the square
  };
  CHECK_FALSE(gradcheck(wrong, {random_tensor({3, 4}, 13)}, {"x"}).passed);
}
