// reshape, permute/transpose, slice, concat: values against index arithmetic, the moves of their derivatives,
// int32 forward copies, and every error path.
#include <doctest/doctest.h>

#include <array>
#include <string>
#include <vector>

#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

// x[l] = l − 5 over the flat index l (exact in float32 and int32).
template <class T>
Tensor ramp(Shape shape) {
  std::vector<T> v(static_cast<size_t>(shape.numel()));
  for (size_t l = 0; l < v.size(); ++l) v[l] = static_cast<T>(static_cast<int64_t>(l) - 5);
  return Tensor::from<T>(shape, std::span<const T>(v));
}

// Row-major flat index of a multi-index.
int64_t flat(const Shape& s, std::span<const int64_t> idx) {
  int64_t l = 0;
  for (int d = 0; d < s.rank(); ++d) l = l * s[d] + idx[static_cast<size_t>(d)];
  return l;
}

// The multi-index of flat index l.
std::array<int64_t, Shape::kMaxRank> unflat(const Shape& s, int64_t l) {
  std::array<int64_t, Shape::kMaxRank> idx{};
  for (int d = s.rank() - 1; d >= 0; --d) {
    idx[static_cast<size_t>(d)] = l % s[d];
    l /= s[d];
  }
  return idx;
}

// y[i] = x[j] with j[perm[d]] = i[d], by index arithmetic.
std::vector<double> reference_permute(const Tensor& x, std::span<const int> perm, Shape& out) {
  out = Shape{};
  for (int p : perm) out.push_back(x.shape()[p]);
  std::vector<double> y(static_cast<size_t>(out.numel()));
  for (int64_t l = 0; l < out.numel(); ++l) {
    auto i = unflat(out, l);
    std::array<int64_t, Shape::kMaxRank> j{};
    for (size_t d = 0; d < perm.size(); ++d) j[static_cast<size_t>(perm[d])] = i[d];
    y[static_cast<size_t>(l)] = x.item(flat(x.shape(), std::span<const int64_t>(j.data(), perm.size())));
  }
  return y;
}

}  // namespace

TEST_CASE_TEMPLATE("reshape keeps the row-major order and shares the input's memory", T, float, double) {
  Tape tape;
  Var x = tape.leaf(ramp<T>({2, 3, 4}));
  Var y = reshape(x, {6, 4});
  CHECK(y.shape() == Shape{6, 4});
  CHECK(y.value().raw() == x.value().raw());
  CHECK(y.value().to_vector() == x.value().to_vector());
  Var s = reshape(tape.leaf(ramp<T>({1, 1})), {});
  CHECK(s.shape() == Shape{});
  CHECK(s.value().item() == -5);
}

TEST_CASE("reshape passes gradients and tangents through unchanged") {
  Tape tape;
  Var x = tape.leaf(ramp<float>({2, 3}));
  Var w = tape.constant(ramp<float>({3, 2}));
  tape.backward(sum(reshape(x, {3, 2}) * w));
  CHECK(x.grad().to_vector() == w.value().to_vector());  // x̄[l] = w[l]
  std::vector<Tensor> in{ramp<double>({4, 2})}, t{ramp<double>({4, 2})};
  auto [y, ty] = jvp([](Tape&, std::span<const Var> v) { return reshape(v[0], {2, 2, 2}); }, in, t);
  CHECK(ty.shape() == Shape{2, 2, 2});
  CHECK(ty.to_vector() == t[0].to_vector());
}

TEST_CASE_TEMPLATE("permute matches index arithmetic", T, float, double) {
  const Tensor xv = ramp<T>({2, 3, 2, 4});
  for (std::vector<int> perm : {std::vector<int>{0, 2, 1, 3}, {0, 1, 3, 2}, {3, 2, 1, 0}, {1, 3, 0, 2}, {0, 1, 2, 3}}) {
    CAPTURE(perm[0] * 1000 + perm[1] * 100 + perm[2] * 10 + perm[3]);
    Tape tape;
    Var y = permute(tape.leaf(xv), perm);
    Shape out;
    const std::vector<double> ref = reference_permute(xv, perm, out);
    CHECK(y.shape() == out);
    CHECK(y.value().to_vector() == ref);
  }
}

TEST_CASE("(B, T, h, d) → (B, h, T, d) puts head h's rows together") {
  Tape tape;
  // x[b, t, h, c] = 1000b + 100t + 10h + c
  std::vector<double> v;
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 3; ++t)
      for (int h = 0; h < 2; ++h)
        for (int c = 0; c < 4; ++c) v.push_back(1000 * b + 100 * t + 10 * h + c);
  Var x = tape.leaf(Tensor::from<double>({2, 3, 2, 4}, std::span<const double>(v)));
  const std::array<int, 4> perm{0, 2, 1, 3};
  Var y = permute(x, perm);
  REQUIRE(y.shape() == Shape{2, 2, 3, 4});
  const Tensor& yv = y.value();
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h)
      for (int t = 0; t < 3; ++t)
        for (int c = 0; c < 4; ++c) CHECK(yv.item(((b * 2 + h) * 3 + t) * 4 + c) == 1000 * b + 100 * t + 10 * h + c);
}

TEST_CASE("transpose swaps two axes and records a permute") {
  Tape tape;
  Var x = tape.leaf(Tensor::from<double>({2, 3}, {1, 2, 3, 4, 5, 6}));
  Var y = transpose(x);
  REQUIRE(y.shape() == Shape{3, 2});
  CHECK(y.value().to_vector() == std::vector<double>{1, 4, 2, 5, 3, 6});
  CHECK(std::string(tape.node(tape.num_nodes() - 1).op) == "permute");
  Var z = transpose(tape.leaf(ramp<double>({2, 3, 4})), 0, -1);
  Shape out;
  const std::array<int, 3> perm{2, 1, 0};
  CHECK(z.shape() == Shape{4, 3, 2});
  CHECK(z.value().to_vector() == reference_permute(ramp<double>({2, 3, 4}), perm, out));
  const std::array<int, 2> negative{-1, -2};  // negative entries count from the end
  CHECK(permute(x, negative).value().to_vector() == y.value().to_vector());
}

TEST_CASE_TEMPLATE("the gradient of a permute is the inverse permute of ȳ", T, float, double) {
  Tape tape;
  const Tensor xv = ramp<T>({2, 3, 4});
  Var x = tape.leaf(xv);
  const std::array<int, 3> perm{2, 0, 1};
  Var y = permute(x, perm);                // (4, 2, 3)
  const Tensor seed = ramp<T>({4, 2, 3});  // ȳ[l] = l − 5
  tape.backward(y, seed);
  // x̄[j] = ȳ[i] where y[i] reads x[j]: then x̄ permuted forward equals ȳ
  Tape check;
  Var back = permute(check.constant(x.grad()), perm);
  CHECK(back.value().to_vector() == seed.to_vector());
}

TEST_CASE("shape ops copy int32 values") {
  Tape tape;
  Var ids = tape.constant(Tensor::from<int32_t>({2, 3}, {1, 2, 3, 4, 5, 6}));
  CHECK(transpose(ids).value().to_vector() == std::vector<double>{1, 4, 2, 5, 3, 6});
  CHECK(reshape(ids, {6}).value().to_vector() == std::vector<double>{1, 2, 3, 4, 5, 6});
  CHECK(slice(ids, 1, 1, 3).value().to_vector() == std::vector<double>{2, 3, 5, 6});
  const std::array<Var, 2> parts{ids, ids};
  Var joined = concat(parts, 0);
  CHECK(joined.dtype() == DType::i32);
  CHECK(joined.value().to_vector() == std::vector<double>{1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6});
}

TEST_CASE_TEMPLATE("slice cuts heads along the last axis", T, float, double) {
  Tape tape;
  const Tensor xv = ramp<T>({2, 3, 8});  // (B, T, C) with C = h·d = 2·4
  Var x = tape.leaf(xv);
  for (int64_t h = 0; h < 2; ++h) {
    Var head = slice(x, -1, 4 * h, 4 * h + 4);
    REQUIRE(head.shape() == Shape{2, 3, 4});
    for (int64_t r = 0; r < 6; ++r)
      for (int64_t c = 0; c < 4; ++c) CHECK(head.value().item(r * 4 + c) == xv.item(r * 8 + 4 * h + c));
  }
  Var mid = slice(x, 1, 1, 2);  // (2, 1, 8)
  REQUIRE(mid.shape() == Shape{2, 1, 8});
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t c = 0; c < 8; ++c) CHECK(mid.value().item(b * 8 + c) == xv.item(b * 24 + 8 + c));
  CHECK(slice(x, 0, 1, 1).shape() == Shape{0, 3, 8});  // an empty slice is allowed
}

TEST_CASE_TEMPLATE("the gradient of a slice is ȳ in place and zero outside", T, float, double) {
  Tape tape;
  Var x = tape.leaf(ramp<T>({2, 5}));
  tape.backward(slice(x, 1, 1, 3), Tensor::from<T>({2, 2}, {T(1), T(2), T(3), T(4)}));
  CHECK(x.grad().to_vector() == std::vector<double>{0, 1, 2, 0, 0, 0, 3, 4, 0, 0});
  std::vector<Tensor> in{ramp<double>({2, 5})}, t{ramp<double>({2, 5})};
  auto [y, ty] = jvp([](Tape&, std::span<const Var> v) { return slice(v[0], 1, 1, 3); }, in, t);
  CHECK(ty.to_vector() == y.to_vector());  // the tangent equals the value here (same ramp)
}

TEST_CASE_TEMPLATE("concat of 3 inputs along the last and the first axis", T, float, double) {
  Tape tape;
  Var a = tape.leaf(Tensor::from<T>({2, 1}, {T(1), T(2)}));
  Var b = tape.leaf(Tensor::from<T>({2, 2}, {T(3), T(4), T(5), T(6)}));
  Var c = tape.leaf(Tensor::from<T>({2, 3}, {T(7), T(8), T(9), T(10), T(11), T(12)}));
  const std::array<Var, 3> abc{a, b, c};
  Var y = concat(abc, -1);
  REQUIRE(y.shape() == Shape{2, 6});
  CHECK(y.value().to_vector() == std::vector<double>{1, 3, 4, 7, 8, 9, 2, 5, 6, 10, 11, 12});
  const std::array<Var, 3> rows{tape.leaf(ramp<T>({1, 3})), tape.leaf(ramp<T>({2, 3})), tape.leaf(ramp<T>({1, 3}))};
  Var z = concat(rows, 0);
  REQUIRE(z.shape() == Shape{4, 3});
  CHECK(z.value().to_vector() == std::vector<double>{-5, -4, -3, -5, -4, -3, -2, -1, 0, -5, -4, -3});
  const std::array<Var, 1> single{b};
  CHECK(concat(single, 1).value().to_vector() == b.value().to_vector());
}

TEST_CASE_TEMPLATE("the gradient of a concat splits ȳ back to the inputs", T, float, double) {
  Tape tape;
  Var a = tape.leaf(ramp<T>({2, 1}));
  Var b = tape.constant(ramp<T>({2, 2}));  // needs no gradient
  Var c = tape.leaf(ramp<T>({2, 1}));
  const std::array<Var, 4> parts{a, b, c, a};  // a twice: its gradient is the sum of both blocks
  Var y = concat(parts, 1);                    // (2, 5)
  tape.backward(y, Tensor::from<T>({2, 5}, {T(1), T(2), T(3), T(4), T(5), T(6), T(7), T(8), T(9), T(10)}));
  CHECK(a.grad().to_vector() == std::vector<double>{1 + 5, 6 + 10});
  CHECK(c.grad().to_vector() == std::vector<double>{4, 9});
  CHECK_FALSE(b.requires_grad());
}

TEST_CASE("shape errors name the op and the shapes") {
  Tape tape;
  Var x = tape.leaf(Tensor::zeros(DType::f64, {2, 3}));
  CHECK_THROWS_WITH_AS(
      reshape(x, {4, 2}),
      doctest::Contains("reshape: cannot reshape x of shape (2, 3) (6 elements) to (4, 2) (8 elements)"), Error);

  const std::array<int, 1> short_perm{0};
  const std::array<int, 2> repeated{1, 1};
  const std::array<int, 2> out_of_range{0, 2};
  CHECK_THROWS_WITH_AS(permute(x, short_perm),
                       doctest::Contains("permute: (0) is not a permutation of the 2 axes of x of shape (2, 3)"),
                       Error);
  CHECK_THROWS_WITH_AS(permute(x, repeated), doctest::Contains("permute: (1, 1)"), Error);
  CHECK_THROWS_WITH_AS(permute(x, out_of_range), doctest::Contains("permute: (0, 2)"), Error);
  Var v = tape.leaf(Tensor::zeros(DType::f64, {5}));
  CHECK_THROWS_WITH_AS(transpose(v), doctest::Contains("transpose: axis -2 is out of range for x of shape (5)"), Error);
  CHECK_THROWS_WITH_AS(transpose(x, 0, 2), doctest::Contains("transpose: axis 2"), Error);

  CHECK_THROWS_WITH_AS(slice(x, 1, 2, 4),
                       doctest::Contains("slice: [2, 4) is out of bounds for axis 1 of size 3 (x of shape (2, 3))"),
                       Error);
  CHECK_THROWS_WITH_AS(slice(x, 1, 2, 1), doctest::Contains("slice: [2, 1)"), Error);
  CHECK_THROWS_WITH_AS(slice(x, 0, -1, 1), doctest::Contains("slice: [-1, 1)"), Error);
  CHECK_THROWS_WITH_AS(slice(x, 2, 0, 1), doctest::Contains("slice: axis 2 is out of range for x of shape (2, 3)"),
                       Error);

  CHECK_THROWS_WITH_AS(concat(std::span<const Var>{}, 0), doctest::Contains("concat: needs at least one input"), Error);
  Var y = tape.leaf(Tensor::zeros(DType::f64, {2, 4}));
  Var z = tape.leaf(Tensor::zeros(DType::f64, {3, 3}));
  Var w = tape.leaf(Tensor::zeros(DType::f64, {2, 3, 1}));
  Var f = tape.leaf(Tensor::zeros(DType::f32, {2, 3}));
  const std::array<Var, 3> rows_differ{x, y, z};
  CHECK_THROWS_WITH_AS(
      concat(rows_differ, 1),
      doctest::Contains(
          "concat: input 2 has shape (3, 3), which does not match input 0 of shape (2, 3) outside axis 1"),
      Error);
  const std::array<Var, 2> ranks_differ{x, w};
  CHECK_THROWS_WITH_AS(concat(ranks_differ, 0), doctest::Contains("concat: input 1 has shape (2, 3, 1)"), Error);
  const std::array<Var, 2> dtypes_differ{x, f};
  CHECK_THROWS_WITH_AS(concat(dtypes_differ, 0),
                       doctest::Contains("concat: dtypes differ: input 0 is float64 (2, 3), input 1 is float32 (2, 3)"),
                       Error);
  const std::array<Var, 2> ok{x, y};
  CHECK_THROWS_WITH_AS(concat(ok, 2), doctest::Contains("concat: axis 2 is out of range for x of shape (2, 3)"), Error);
  Tape other;
  const std::array<Var, 2> tapes_differ{x, other.leaf(Tensor::zeros(DType::f64, {2, 3}))};
  const std::string tapes_error = error_of([&] { concat(tapes_differ, 0); });
  CHECK(tapes_error.rfind("concat: ", 0) == 0);
  CHECK(tapes_error.find("tape") != std::string::npos);
}
