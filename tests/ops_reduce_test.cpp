// sum and mean: forward values against nested loops over (outer, n, inner), shapes with and without keepdim,
// the derivatives of the linear map by hand, float32 accuracy of long sums, and the errors.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "ops/ops.hpp"

using namespace tapegrad;

namespace {

// x[l] = 0.5·l − 3 over the flat index l: distinct, signed, exact in float32.
template <class T>
Tensor ramp(Shape shape) {
  std::vector<T> v(static_cast<size_t>(shape.numel()));
  for (size_t l = 0; l < v.size(); ++l) v[l] = static_cast<T>(0.5 * static_cast<double>(l) - 3.0);
  return Tensor::from<T>(shape, std::span<const T>(v));
}

// The reduction of x along `axis` by nested loops, in double: Σ_j x[o, j, i] (divided by n for the mean).
std::vector<double> reference_reduce(const Tensor& x, int axis, bool mean) {
  const Shape& s = x.shape();
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= s[d];
  for (int d = axis + 1; d < s.rank(); ++d) inner *= s[d];
  const int64_t n = s[axis];
  std::vector<double> y(static_cast<size_t>(outer * inner), 0.0);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < inner; ++i) y[static_cast<size_t>(o * inner + i)] += x.item((o * n + j) * inner + i);
  if (mean)
    for (double& v : y) v /= static_cast<double>(n);
  return y;
}

}  // namespace

TEST_CASE_TEMPLATE("sum and mean of all elements give a scalar of shape ()", T, float, double) {
  Tape tape;
  Var x = tape.leaf(ramp<T>({2, 3}));  // −3, −2.5, …, −0.5
  Var s = sum(x), m = mean(x);
  CHECK(s.shape() == Shape{});
  CHECK(m.shape() == Shape{});
  CHECK(s.dtype() == dtype_of<T>());
  CHECK(s.value().item() == doctest::Approx(-10.5));
  CHECK(m.value().item() == doctest::Approx(-1.75));
}

TEST_CASE_TEMPLATE("sum and mean along every axis match nested loops, with and without keepdim", T, float, double) {
  const Tensor xv = ramp<T>({2, 3, 4});
  for (bool is_mean : {false, true})
    for (int axis : {0, 1, 2, -1, -2, -3})
      for (bool keepdim : {false, true}) {
        CAPTURE(is_mean);
        CAPTURE(axis);
        CAPTURE(keepdim);
        Tape tape;
        Var x = tape.leaf(xv);
        Var y = is_mean ? mean(x, axis, keepdim) : sum(x, axis, keepdim);
        const int a = axis < 0 ? axis + 3 : axis;
        Shape expected;
        for (int d = 0; d < 3; ++d)
          if (d != a) expected.push_back(xv.shape()[d]);
          else if (keepdim) expected.push_back(1);
        CHECK(y.shape() == expected);
        const std::vector<double> ref = reference_reduce(xv, a, is_mean);
        REQUIRE(y.value().numel() == static_cast<int64_t>(ref.size()));
        for (size_t l = 0; l < ref.size(); ++l)
          CHECK(y.value().item(static_cast<int64_t>(l)) == doctest::Approx(ref[l]));
      }
}

TEST_CASE("sum along the middle axis by hand") {
  Tape tape;
  // x (2, 2, 2) = [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]:  Σ over axis 1 = [[4, 6], [12, 14]]
  Var x = tape.leaf(Tensor::from<double>({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8}));
  Var y = sum(x, 1);
  REQUIRE(y.shape() == Shape{2, 2});
  CHECK(y.value().to_vector() == std::vector<double>{4, 6, 12, 14});
  Var m = mean(x, 1, true);
  REQUIRE(m.shape() == Shape{2, 1, 2});
  CHECK(m.value().to_vector() == std::vector<double>{2, 3, 6, 7});
}

TEST_CASE_TEMPLATE("the gradient repeats ȳ along the reduced axis, divided by n for the mean", T, float, double) {
  Tape tape;
  Var x = tape.leaf(ramp<T>({2, 3}));
  // L = Σ_o w_o·Σ_j x[o, j] + mean(x)
  Var w = tape.constant(Tensor::from<T>({2}, {T(2), T(-1)}));
  tape.backward(sum(sum(x, 1) * w) + mean(x));
  // x̄[o, j] = w_o + 1/6
  const std::vector<double> expected{2 + 1.0 / 6, 2 + 1.0 / 6, 2 + 1.0 / 6, -1 + 1.0 / 6, -1 + 1.0 / 6, -1 + 1.0 / 6};
  const std::vector<double> got = x.grad().to_vector();
  for (size_t l = 0; l < got.size(); ++l) CHECK(got[l] == doctest::Approx(expected[l]));
}

TEST_CASE_TEMPLATE("the tangent of a reduction is the reduction of the tangent", T, float, double) {
  const Tensor xv = ramp<T>({3, 4}), tv = ramp<T>({3, 4});
  std::vector<Tensor> inputs{xv}, tangents{tv};
  auto [y, ty] = jvp([](Tape&, std::span<const Var> x) { return mean(x[0], 0); }, inputs, tangents);
  const std::vector<double> ref = reference_reduce(tv, 0, true);
  REQUIRE(ty.numel() == 4);
  for (int64_t i = 0; i < 4; ++i) CHECK(ty.item(i) == doctest::Approx(ref[static_cast<size_t>(i)]));
}

TEST_CASE("a float32 sum of 10⁶ terms keeps float32 precision") {
  const int64_t n = 1000000;
  std::vector<float> v(static_cast<size_t>(n), 0.1f);
  Tape tape;
  Var x = tape.leaf(Tensor::from<float>({1000, 1000}, std::span<const float>(v)));
  const double exact = static_cast<double>(n) * static_cast<double>(0.1f);
  CHECK(std::abs(sum(x).value().item() - exact) <= 1e-6 * exact);
  CHECK(std::abs(mean(x).value().item() - exact / static_cast<double>(n)) <= 1e-6 * 0.1);
  // along the leading axis the rows are added in float32: 1000 terms
  const Tensor col = sum(x, 0).value();
  CHECK(std::abs(col.item(7) - 1000 * static_cast<double>(0.1f)) <= 1e-4 * 100);
}

TEST_CASE("reduction errors name the op and the shape") {
  Tape tape;
  Var x = tape.leaf(Tensor::zeros(DType::f64, {2, 3}));
  CHECK_THROWS_WITH_AS(sum(x, 2), doctest::Contains("sum: axis 2 is out of range for x of shape (2, 3)"), Error);
  CHECK_THROWS_WITH_AS(sum(x, -3), doctest::Contains("sum: axis -3"), Error);
  CHECK_THROWS_WITH_AS(mean(x, 5, true), doctest::Contains("mean: axis 5 is out of range for x of shape (2, 3)"),
                       Error);
  Var scalar = tape.leaf(Tensor::zeros(DType::f64, {}));
  CHECK_THROWS_WITH_AS(sum(scalar, 0), doctest::Contains("sum: axis 0 is out of range for x of shape ()"), Error);
  Var empty = tape.leaf(Tensor::zeros(DType::f64, {2, 0}));
  CHECK_THROWS_WITH_AS(mean(empty, 1), doctest::Contains("mean: the mean over zero elements"), Error);
  CHECK_THROWS_WITH_AS(mean(empty), doctest::Contains("(2, 0)"), Error);
  CHECK(sum(empty, 1).value().to_vector() == std::vector<double>{0, 0});  // an empty sum is 0
  Var ids = tape.constant(Tensor::from<int32_t>({3}, {1, 2, 3}));
  CHECK_THROWS_WITH_AS(sum(ids), doctest::Contains("sum: expected a float32 or float64 tensor, got int32 (3)"), Error);
  CHECK_THROWS_WITH_AS(mean(ids, 0), doctest::Contains("mean"), Error);
}
