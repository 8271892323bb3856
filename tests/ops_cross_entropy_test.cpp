// cross_entropy: forward against the unfused −log softmax, uniform logits, logits of ±1e4, the analytic
// gradient (p − onehot)·ḡ/N and tangent, and the errors.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

std::vector<double> smooth_logits(size_t n) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 2.0 * std::sin(1.7 * static_cast<double>(i) + 0.3);
  return v;
}

template <class T>
Tensor tensor_of(Shape s, const std::vector<double>& v) {
  std::vector<T> w(v.begin(), v.end());
  return Tensor::from<T>(s, std::span<const T>(w));
}

// softmax of row r of x (rows of length V), computed the plain way in long double.
std::vector<double> naive_softmax_row(const std::vector<double>& x, size_t r, size_t classes) {
  long double z = 0;
  for (size_t j = 0; j < classes; ++j) z += std::exp(static_cast<long double>(x[r * classes + j]));
  std::vector<double> p(classes);
  for (size_t j = 0; j < classes; ++j)
    p[j] = static_cast<double>(std::exp(static_cast<long double>(x[r * classes + j])) / z);
  return p;
}

// (1/N)·Σ_r −log softmax(x_r)[t_r], unfused.
double naive_cross_entropy(const std::vector<double>& x, const std::vector<int32_t>& t, size_t classes) {
  double total = 0;
  for (size_t r = 0; r < t.size(); ++r) total += -std::log(naive_softmax_row(x, r, classes)[static_cast<size_t>(t[r])]);
  return total / static_cast<double>(t.size());
}

template <class T>
double tolerance() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-12;
}

}  // namespace

TEST_CASE_TEMPLATE("cross_entropy matches the mean of −log softmax(x_r)[t_r]", T, float, double) {
  struct Case {
    Shape logits, targets;
    std::vector<int32_t> t;
  };
  for (const Case& c : {Case{{3, 5}, {3}, {4, 0, 2}}, Case{{2, 2, 3}, {2, 2}, {1, 2, 0, 0}}, Case{{4}, {}, {3}}}) {
    CAPTURE(c.logits);
    Tape tape;
    const auto x = smooth_logits(static_cast<size_t>(c.logits.numel()));
    Var y = cross_entropy(tape.leaf(tensor_of<T>(c.logits, x)),
                          tape.constant(Tensor::from<int32_t>(c.targets, std::span<const int32_t>(c.t))));
    REQUIRE(y.shape() == Shape{});
    CHECK(y.dtype() == dtype_of<T>());
    const double want = naive_cross_entropy(x, c.t, static_cast<size_t>(c.logits.back()));
    CHECK(y.value().item() == doctest::Approx(want).epsilon(tolerance<T>()));
  }
}

TEST_CASE_TEMPLATE("cross_entropy of uniform logits is log V", T, float, double) {
  for (double level : {0.0, 3.7, -250.0}) {
    for (int64_t classes : {2, 7, 65}) {
      CAPTURE(level);
      CAPTURE(classes);
      Tape tape;
      std::vector<double> x(static_cast<size_t>(4 * classes), level);
      Var y = cross_entropy(tape.leaf(tensor_of<T>({4, classes}, x)),
                            tape.constant(Tensor::from<int32_t>({4}, {0, 1, 1, 0})));
      CHECK(y.value().item() == doctest::Approx(std::log(static_cast<double>(classes))).epsilon(tolerance<T>()));
    }
  }
}

TEST_CASE_TEMPLATE("logits of ±1e4 give a finite loss and the analytic gradient", T, float, double) {
  // row 0: p = (1, 0, 0, 0), target 1:  ℓ = 2e4
  // row 1: p = (½, ½, 0, 0), target 0:  ℓ = log 2
  // row 2: p = (¼, ¼, ¼, ¼), target 3:  ℓ = log 4
  const std::vector<double> x{1e4, -1e4, 0, -1e4, 1e4, 1e4, -1e4, 0, -1e4, -1e4, -1e4, -1e4};
  Tape tape;
  Var logits = tape.leaf(tensor_of<T>({3, 4}, x));
  Var y = cross_entropy(logits, tape.constant(Tensor::from<int32_t>({3}, {1, 0, 3})));
  const double loss = y.value().item();
  REQUIRE(std::isfinite(loss));
  CHECK(loss == doctest::Approx((2e4 + std::log(2.0) + std::log(4.0)) / 3).epsilon(tolerance<T>()));

  tape.backward(y);
  const std::vector<double> g = logits.grad().to_vector();
  const std::vector<double> want{1.0 / 3,  -1.0 / 3, 0, 0,  // (p − onehot)/N, N = 3
                                 -0.5 / 3, 0.5 / 3,  0, 0, 0.25 / 3, 0.25 / 3, 0.25 / 3, -0.75 / 3};
  REQUIRE(g.size() == want.size());
  for (size_t i = 0; i < g.size(); ++i) {
    CAPTURE(i);
    CHECK(std::isfinite(g[i]));
    CHECK(g[i] == doctest::Approx(want[i]).epsilon(tolerance<T>()).scale(1.0));
  }
}

TEST_CASE_TEMPLATE("backward gives ḡ·(p − onehot)/N; forward mode (1/N)·Σ_r (⟨p_r, ẋ_r⟩ − ẋ_r[t_r])", T, float,
                   double) {
  const size_t rows = 4, classes = 6;
  const std::vector<int32_t> t{5, 0, 3, 3};
  const auto x = smooth_logits(rows * classes);
  std::vector<double> tx(rows * classes);
  for (size_t i = 0; i < tx.size(); ++i) tx[i] = std::cos(0.9 * static_cast<double>(i));
  const double g = 2.5;

  Tape tape;
  Var logits = tape.leaf(tensor_of<T>({4, 6}, x));
  Var y = cross_entropy(logits, tape.constant(Tensor::from<int32_t>({4}, std::span<const int32_t>(t))));
  tape.set_tangent(logits, tensor_of<T>({4, 6}, tx));
  tape.propagate_tangents();
  tape.backward(y, tensor_of<T>({}, {g}));

  const std::vector<double> grad = logits.grad().to_vector();
  double want_tangent = 0;
  for (size_t r = 0; r < rows; ++r) {
    const auto p = naive_softmax_row(x, r, classes);
    for (size_t j = 0; j < classes; ++j) {
      const double onehot = j == static_cast<size_t>(t[r]) ? 1 : 0;
      CAPTURE(r);
      CAPTURE(j);
      CHECK(grad[r * classes + j] == doctest::Approx(g * (p[j] - onehot) / rows).epsilon(tolerance<T>()).scale(1.0));
      want_tangent += (p[j] - onehot) * tx[r * classes + j] / rows;
    }
  }
  CHECK(tape.tangent(y).item() == doctest::Approx(want_tangent).epsilon(tolerance<T>()).scale(1.0));
}

TEST_CASE("cross_entropy errors name the op and what is wrong") {
  Tape tape;
  Var logits = tape.leaf(Tensor::zeros(DType::f32, {2, 3, 5}));
  auto targets = [&](Shape s, std::vector<int32_t> v) {
    return tape.constant(Tensor::from<int32_t>(s, std::span<const int32_t>(v)));
  };

  SUBCASE("targets not int32") {
    std::string msg = error_of([&] { cross_entropy(logits, tape.leaf(Tensor::zeros(DType::f32, {2, 3}))); });
    CHECK(msg.find("cross_entropy") != std::string::npos);
    CHECK(msg.find("int32") != std::string::npos);
  }
  SUBCASE("logits not float") {
    std::string msg = error_of([&] { cross_entropy(targets({2, 3}, {0, 0, 0, 0, 0, 0}), targets({2}, {0, 0})); });
    CHECK(msg.find("cross_entropy") != std::string::npos);
  }
  SUBCASE("targets do not have the logits' leading shape") {
    for (Shape s : {Shape{2}, Shape{3, 2}, Shape{2, 3, 5}, Shape{6}}) {
      std::string msg =
          error_of([&] { cross_entropy(logits, targets(s, std::vector<int32_t>(static_cast<size_t>(s.numel()), 0))); });
      CHECK(msg.find("cross_entropy") != std::string::npos);
      CHECK(msg.find(s.str()) != std::string::npos);
      CHECK(msg.find("(2, 3)") != std::string::npos);  // the expected shape
    }
  }
  SUBCASE("target equal to V") {
    std::string msg = error_of([&] { cross_entropy(logits, targets({2, 3}, {0, 1, 2, 3, 4, 5})); });
    CHECK(msg.find("cross_entropy") != std::string::npos);
    CHECK(msg.find("target 5") != std::string::npos);
    CHECK(msg.find("[1, 2]") != std::string::npos);
    CHECK(msg.find("V = 5") != std::string::npos);
  }
  SUBCASE("negative target") {
    std::string msg = error_of([&] { cross_entropy(logits, targets({2, 3}, {0, -3, 2, 3, 4, 0})); });
    CHECK(msg.find("target -3") != std::string::npos);
    CHECK(msg.find("[0, 1]") != std::string::npos);
    CHECK(msg.find("V = 5") != std::string::npos);
  }
  SUBCASE("scalar logits, no classes, no rows") {
    for (Shape s : {Shape{}, Shape{3, 0}, Shape{0, 4}}) {
      Shape lead(s.dims().first(s.rank() > 0 ? static_cast<size_t>(s.rank() - 1) : 0));
      std::string msg = error_of([&] {
        cross_entropy(tape.leaf(Tensor::zeros(DType::f64, s)), tape.constant(Tensor::zeros(DType::i32, lead)));
      });
      CAPTURE(s);
      CHECK(msg.find("cross_entropy") != std::string::npos);
    }
  }
}

TEST_CASE("cross_entropy refuses targets that only match the logits' rows by broadcasting") {
  Tape tape;
  Var logits = tape.leaf(Tensor::zeros(DType::f32, {4, 3}));
  for (Shape s : {Shape{4, 1}, Shape{1, 4}, Shape{1}, Shape{}}) {
    CAPTURE(s);
    Var targets = tape.constant(Tensor::zeros(DType::i32, s));
    check_message(error_of([&] { cross_entropy(logits, targets); }), "cross_entropy",
                  {s.str().c_str(), "(4, 3)", "expected targets of shape (4)"});
  }
}
