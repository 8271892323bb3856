// layer_norm: values against a naive reference, normalized statistics, constant rows, float32 against float64
// for the value and all three gradients and tangents, the same bits for a row in a block of rows as alone (and the
// row sums under them), and the errors (dtype, weight and bias shapes, eps).
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/fast_math.hpp"
#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

Var layer_norm_of(Tape&, std::span<const Var> x) { return layer_norm(x[0], x[1], x[2]); }

// y = w ⊙ (x − μ)/√(v + ε) + b per row of C, in long double.
std::vector<double> naive_layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  const int64_t C = x.shape().back(), rows = x.numel() / C;
  std::vector<double> y(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < rows; ++i) {
    long double mu = 0, var = 0;
    for (int64_t j = 0; j < C; ++j) mu += x.item(i * C + j);
    mu /= static_cast<long double>(C);
    for (int64_t j = 0; j < C; ++j) var += (x.item(i * C + j) - mu) * (x.item(i * C + j) - mu);
    var /= static_cast<long double>(C);
    for (int64_t j = 0; j < C; ++j)
      y[static_cast<size_t>(i * C + j)] =
          static_cast<double>(w.item(j) * (x.item(i * C + j) - mu) / std::sqrt(var + eps) + b.item(j));
  }
  return y;
}

bool mentions(const std::string& msg, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    if (msg.find(p) == std::string::npos) return false;
  return true;
}

}  // namespace

TEST_CASE("layer_norm matches a naive reference in float32 and float64") {
  // Rows with a large common offset: the two-pass variance must not cancel.
  Tensor x = random_tensor({2, 3, 6}, DType::f64, 51, 2.0, 100.0);
  Tensor w = random_tensor({6}, DType::f64, 52), b = random_tensor({6}, DType::f64, 53);
  const std::vector<double> ref = naive_layer_norm(x, w, b, 1e-5);
  for (DType dtype : {DType::f64, DType::f32}) {
    CAPTURE(dtype_name(dtype));
    std::vector<Tensor> xs{x.to(dtype), w.to(dtype), b.to(dtype)};
    Tensor y = evaluate(layer_norm_of, xs);
    CHECK(y.dtype() == dtype);
    CHECK(y.shape() == x.shape());
    const double tol = dtype == DType::f64 ? 1e-12 : 1e-4;
    for (size_t i = 0; i < ref.size(); ++i) CHECK(std::abs(y.item(static_cast<int64_t>(i)) - ref[i]) <= tol);
  }
}

TEST_CASE("with w = 1 and b = 0 every row has mean 0 and variance v/(v + ε)") {
  Tensor x = random_tensor({5, 32}, DType::f64, 61, 3.0, -2.0);
  const double eps = 1e-2;
  std::vector<Tensor> xs{x, tensor_of({32}, std::vector<double>(32, 1.0), DType::f64), Tensor::zeros(DType::f64, {32})};
  Tensor y = evaluate([eps](Tape&, std::span<const Var> v) { return layer_norm(v[0], v[1], v[2], eps); }, xs);
  for (int64_t i = 0; i < 5; ++i) {
    double mu = 0, var = 0, y_mean = 0, y_sq = 0;
    for (int64_t j = 0; j < 32; ++j) mu += x.item(i * 32 + j) / 32;
    for (int64_t j = 0; j < 32; ++j) {
      var += (x.item(i * 32 + j) - mu) * (x.item(i * 32 + j) - mu) / 32;
      y_mean += y.item(i * 32 + j) / 32;
      y_sq += y.item(i * 32 + j) * y.item(i * 32 + j) / 32;
    }
    CHECK(std::abs(y_mean) < 1e-14);
    CHECK(y_sq == doctest::Approx(var / (var + eps)).epsilon(1e-12));
  }
}

TEST_CASE("a constant row gives y = b, with finite gradients (ε keeps 1/σ finite)") {
  for (DType dtype : {DType::f64, DType::f32}) {
    std::vector<Tensor> xs{tensor_of({1, 4}, {2.5, 2.5, 2.5, 2.5}, dtype), tensor_of({4}, {1, 2, 3, 4}, dtype),
                           tensor_of({4}, {0.5, -0.5, 1, 0}, dtype)};
    Tensor y = evaluate(layer_norm_of, xs);
    CHECK(max_abs_diff(y, xs[2].view({1, 4})) == 0);
    auto grads = vjp(layer_norm_of, xs, tensor_of({1, 4}, {1, -1, 2, 0.5}, dtype));
    for (const Tensor& g : grads)
      for (int64_t i = 0; i < g.numel(); ++i) CHECK(std::isfinite(g.item(i)));
  }
}

TEST_CASE("float32 agrees with float64: value, the three gradients and the tangent") {
  std::vector<Tensor> x64{random_tensor({4, 8}, DType::f64, 71), random_tensor({8}, DType::f64, 72, 1.0, 1.0),
                          random_tensor({8}, DType::f64, 73)};
  std::vector<Tensor> x32;
  for (const Tensor& t : x64) x32.push_back(t.to(DType::f32));
  Tensor u = random_tensor({4, 8}, DType::f64, 74);
  std::vector<Tensor> t64{random_tensor({4, 8}, DType::f64, 75), random_tensor({8}, DType::f64, 76),
                          random_tensor({8}, DType::f64, 77)};
  std::vector<Tensor> t32;
  for (const Tensor& t : t64) t32.push_back(t.to(DType::f32));

  CHECK(max_abs_diff(evaluate(layer_norm_of, x64), evaluate(layer_norm_of, x32)) < 1e-5);
  auto g64 = vjp(layer_norm_of, x64, u), g32 = vjp(layer_norm_of, x32, u.to(DType::f32));
  for (size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(max_abs_diff(g64[i], g32[i]) < 1e-5);
  }
  CHECK(max_abs_diff(jvp(layer_norm_of, x64, t64).second, jvp(layer_norm_of, x32, t32).second) < 1e-5);
}

TEST_CASE("each tangent contributes on its own: ẏ = w⊙J_x̂ẋ + ẇ⊙x̂ + ḃ") {
  std::vector<Tensor> xs{random_tensor({3, 5}, DType::f64, 81), random_tensor({5}, DType::f64, 82),
                         random_tensor({5}, DType::f64, 83)};
  std::vector<Tensor> only_bias{Tensor{}, Tensor{}, random_tensor({5}, DType::f64, 84)};
  Tensor ty = jvp(layer_norm_of, xs, only_bias).second;
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j) CHECK(ty.item(i * 5 + j) == only_bias[2].item(j));
  // ẇ = w gives ẏ = y − b (y is linear in w).
  std::vector<Tensor> only_weight{Tensor{}, xs[1], Tensor{}};
  Tensor tw = jvp(layer_norm_of, xs, only_weight).second;
  Tensor y = evaluate(layer_norm_of, xs);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j) CHECK(tw.item(i * 5 + j) == doctest::Approx(y.item(i * 5 + j) - xs[2].item(j)));
}

TEST_CASE("lane_sum, lane_dot and their rows at once follow the eight lanes' rule, bit for bit") {
  // The rule of ops/fast_math.hpp, written out one float at a time: element j < 8⌊n/8⌋ added to lane j mod 8 in
  // order, the tail to lane 0, the lanes added in pairs.
  auto by_lanes = [](const float* a, const float* b, int64_t n) {
    float s[8] = {};
    const int64_t whole = n / 8 * 8;
    for (int64_t j = 0; j < whole; ++j) s[j % 8] += b ? a[j] * b[j] : a[j];
    for (int64_t j = whole; j < n; ++j) s[0] += b ? a[j] * b[j] : a[j];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  };
  // Widths around the eight lanes (tails of 0 to 7) and the default model's 128; random values, whose sums round
  // differently when added in another order.
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{13}, int64_t{31}, int64_t{128}}) {
    CAPTURE(n);
    const Tensor a = random_tensor({4, n}, DType::f32, 91, 1e3), b = random_tensor({4, n}, DType::f32, 92);
    const float *pa = a.data<float>(), *pb = b.data<float>();
    float sums[4], dots[4];
    lane_sum_rows<4>(pa, n, n, sums);
    lane_dot_rows<4>(pa, n, pb, n, n, dots);
    for (int r = 0; r < 4; ++r) {
      const float sum = by_lanes(pa + r * n, nullptr, n), dot = by_lanes(pa + r * n, pb + r * n, n);
      CHECK(sums[r] == sum);
      CHECK(dots[r] == dot);
      CHECK(lane_sum(pa + r * n, n) == sum);
      CHECK(lane_dot(pa + r * n, pb + r * n, n) == dot);
    }
  }
}

TEST_CASE("a row gets the same bits in a block of rows as alone: y and x̄") {
  // Seven rows: a block of four, then three one at a time; C = 13 leaves a tail past the lanes.
  for (const int64_t C : {int64_t{13}, int64_t{128}}) {
    CAPTURE(C);
    const Tensor x = random_tensor({7, C}, DType::f32, 101, 2.0, 0.5), w = random_tensor({C}, DType::f32, 102),
                 b = random_tensor({C}, DType::f32, 103), g = random_tensor({7, C}, DType::f32, 104);
    const std::vector<Tensor> xs{x, w, b};
    const Tensor y = evaluate(layer_norm_of, xs);
    const std::vector<Tensor> all = vjp(layer_norm_of, xs, g);
    for (int64_t i = 0; i < 7; ++i) {
      CAPTURE(i);
      auto row = [&](const Tensor& t) {  // row i as a (1, C) tensor: float32 → double → float32 is exact
        std::vector<double> v;
        for (int64_t j = 0; j < C; ++j) v.push_back(t.item(i * C + j));
        return tensor_of({1, C}, v, DType::f32);
      };
      const Tensor xi = row(x), gi = row(g);
      const std::vector<Tensor> xis{xi, w, b};
      const Tensor yi = evaluate(layer_norm_of, xis);
      const Tensor dxi = vjp(layer_norm_of, xis, gi)[0];
      for (int64_t j = 0; j < C; ++j) {
        CHECK(yi.item(j) == y.item(i * C + j));
        CHECK(dxi.item(j) == all[0].item(i * C + j));
      }
    }
  }
}

TEST_CASE("layer_norm errors name the op and the shapes") {
  Tape tape;
  Var x = tape.leaf(Tensor::zeros(DType::f32, {4, 8}));
  Var w = tape.leaf(Tensor::zeros(DType::f32, {8}));
  Var b = tape.leaf(Tensor::zeros(DType::f32, {8}));

  std::string msg = error_of([&] { layer_norm(x, tape.leaf(Tensor::zeros(DType::f32, {7})), b); });
  CHECK_MESSAGE(mentions(msg, {"layer_norm", "weight", "(7)", "(4, 8)", "(8)"}), msg);
  msg = error_of([&] { layer_norm(x, w, tape.leaf(Tensor::zeros(DType::f32, {1, 8}))); });
  CHECK_MESSAGE(mentions(msg, {"layer_norm", "bias", "(1, 8)", "(4, 8)"}), msg);
  msg = error_of([&] { layer_norm(tape.constant(Tensor::zeros(DType::i32, {4, 8})), w, b); });
  CHECK_MESSAGE(mentions(msg, {"layer_norm", "int32", "(4, 8)"}), msg);
  msg = error_of([&] { layer_norm(x, tape.leaf(Tensor::zeros(DType::f64, {8})), b); });
  CHECK_MESSAGE(mentions(msg, {"layer_norm", "float32", "float64", "(4, 8)", "(8)"}), msg);
  msg = error_of([&] { layer_norm(tape.leaf(Tensor::zeros(DType::f32, {})), w, b); });
  CHECK_MESSAGE(mentions(msg, {"layer_norm", "rank", "()"}), msg);
  msg = error_of([&] { layer_norm(x, w, b, 0.0); });
  CHECK_MESSAGE(mentions(msg, {"layer_norm", "eps"}), msg);
}
