// softmax and log_softmax: values against a naive reference, stability at logits of ±1e4, masked (−∞) entries
// and fully masked rows, float32 against float64, the raw row kernels, lane_max's lanes, and the errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ops/fast_math.hpp"
#include "ops/ops.hpp"
#include "ops/row_maps.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Var softmax_of(Tape&, std::span<const Var> x) { return softmax(x[0]); }
Var log_softmax_of(Tape&, std::span<const Var> x) { return log_softmax(x[0]); }

Tensor run_row_op(Var (*f)(Tape&, std::span<const Var>), const Tensor& x) {
  std::vector<Tensor> xs{x};
  return evaluate(f, xs);
}

// σ(x)_j = exp(x_j) / Σ_k exp(x_k), unshifted, in long double: a reference for moderate logits.
std::vector<double> naive_softmax(const std::vector<double>& x, int64_t cols) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); i += static_cast<size_t>(cols)) {
    long double s = 0;
    for (int64_t j = 0; j < cols; ++j) s += std::exp(static_cast<long double>(x[i + static_cast<size_t>(j)]));
    for (int64_t j = 0; j < cols; ++j)
      y[i + static_cast<size_t>(j)] =
          static_cast<double>(std::exp(static_cast<long double>(x[i + static_cast<size_t>(j)])) / s);
  }
  return y;
}

}  // namespace

TEST_CASE("softmax and log_softmax match a naive reference in float32 and float64") {
  const Shape shape{3, 7};
  Tensor x64 = random_tensor(shape, DType::f64, 11, 3.0);
  std::vector<double> x = x64.to_vector();
  std::vector<double> ref = naive_softmax(x, 7);
  for (DType dtype : {DType::f64, DType::f32}) {
    CAPTURE(dtype_name(dtype));
    const double tol = dtype == DType::f64 ? 1e-14 : 2e-6;
    Tensor y = run_row_op(softmax_of, x64.to(dtype));
    Tensor z = run_row_op(log_softmax_of, x64.to(dtype));
    CHECK(y.dtype() == dtype);
    CHECK(y.shape() == shape);
    for (size_t i = 0; i < ref.size(); ++i) {
      const auto k = static_cast<int64_t>(i);
      CHECK(std::abs(y.item(k) - ref[i]) <= tol * std::max(1.0, ref[i]));
      CHECK(std::abs(z.item(k) - std::log(ref[i])) <= tol * std::max(1.0, std::abs(std::log(ref[i]))));
    }
  }
}

TEST_CASE("every softmax row sums to 1, and so does exp(log_softmax)") {
  for (DType dtype : {DType::f64, DType::f32}) {
    for (int64_t cols : {1, 2, 5, 64, 1000}) {
      CAPTURE(cols);
      Tensor x = random_tensor({4, cols}, dtype, 7 + static_cast<uint64_t>(cols), 4.0);
      Tensor y = run_row_op(softmax_of, x), z = run_row_op(log_softmax_of, x);
      const double tol = dtype == DType::f64 ? 1e-13 : 1e-5;
      for (int64_t i = 0; i < 4; ++i) {
        double s = 0, s_log = 0;
        for (int64_t j = 0; j < cols; ++j) {
          CHECK(y.item(i * cols + j) >= 0);
          s += y.item(i * cols + j);
          s_log += std::exp(z.item(i * cols + j));
        }
        CHECK(s == doctest::Approx(1.0).epsilon(tol));
        CHECK(s_log == doctest::Approx(1.0).epsilon(tol));
      }
    }
  }
}

TEST_CASE("logits of ±1e4 give finite results equal to the shifted ones") {
  // Multiples of 1/4 below 64: x ± 1e4 is exact in float32, so the shifted rows are the same numbers exactly.
  std::vector<double> base(24);
  for (size_t i = 0; i < base.size(); ++i) base[i] = 0.25 * static_cast<double>((i * 37) % 29) - 3.0;
  for (DType dtype : {DType::f64, DType::f32}) {
    CAPTURE(dtype_name(dtype));
    const Tensor y0 = run_row_op(softmax_of, tensor_of({4, 6}, base, dtype));
    const Tensor z0 = run_row_op(log_softmax_of, tensor_of({4, 6}, base, dtype));
    for (double shift : {1e4, -1e4}) {
      CAPTURE(shift);
      std::vector<double> shifted = base;
      for (double& v : shifted) v += shift;
      Tensor y = run_row_op(softmax_of, tensor_of({4, 6}, shifted, dtype));
      Tensor z = run_row_op(log_softmax_of, tensor_of({4, 6}, shifted, dtype));
      CHECK(all_finite(y));
      CHECK(all_finite(z));
      CHECK(max_abs_diff(y, y0) == 0);
      CHECK(max_abs_diff(z, z0) == 0);
    }
    // One row spanning 2e4: the large entry takes all the mass, the others underflow to 0 in σ but not in log σ.
    Tensor y = run_row_op(softmax_of, tensor_of({3}, {1e4, -1e4, 0}, dtype));
    Tensor z = run_row_op(log_softmax_of, tensor_of({3}, {1e4, -1e4, 0}, dtype));
    CHECK(y.to_vector() == std::vector<double>{1, 0, 0});
    CHECK(z.to_vector() == std::vector<double>{0, -2e4, -1e4});
    // Gradients at such logits are finite.
    std::vector<Tensor> xs{tensor_of({2, 3}, {1e4, -1e4, 0, -1e4, -1e4 + 0.5, -1e4 + 1}, dtype)};
    Tensor seed = tensor_of({2, 3}, {0.3, -1, 2, 1, 0.5, -0.25}, dtype);
    CHECK(all_finite(vjp(softmax_of, xs, seed)[0]));
    CHECK(all_finite(vjp(log_softmax_of, xs, seed)[0]));
  }
}

TEST_CASE("masked entries (−∞) get probability 0 and gradient 0; a fully masked row is 0, not NaN") {
  for (DType dtype : {DType::f64, DType::f32}) {
    CAPTURE(dtype_name(dtype));
    // Row 0 masks two of four entries; row 1 is fully masked.
    Tensor x = tensor_of({2, 4}, {0.5, -kInf, 1.5, -kInf, -kInf, -kInf, -kInf, -kInf}, dtype);
    Tensor y = run_row_op(softmax_of, x);
    Tensor z = run_row_op(log_softmax_of, x);
    const double e = std::exp(1.0);
    CHECK(y.item(0) == doctest::Approx(1 / (1 + e)));
    CHECK(y.item(1) == 0);
    CHECK(y.item(2) == doctest::Approx(e / (1 + e)));
    CHECK(y.item(3) == 0);
    for (int64_t j = 4; j < 8; ++j) {
      CHECK(y.item(j) == 0);      // σ(row of −∞) = 0 by definition
      CHECK(z.item(j) == -kInf);  // log σ = log 0
    }
    CHECK(z.item(1) == -kInf);
    CHECK(z.item(2) == doctest::Approx(std::log(e / (1 + e))));

    std::vector<Tensor> xs{x};
    Tensor seed = tensor_of({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8}, dtype);
    Tensor gx = vjp(softmax_of, xs, seed)[0];
    CHECK(all_finite(gx));
    for (int64_t j : {1, 3, 4, 5, 6, 7}) CHECK(gx.item(j) == 0);
    CHECK(gx.item(0) == doctest::Approx(-2 * e / ((1 + e) * (1 + e))));  // y0·(1 − ⟨y, ȳ⟩) with ȳ = (1, ·, 3, ·)
    // log_softmax: x̄ = z̄ − exp(z)·Σz̄, which is z̄ itself where exp(z) = 0 (masked entries and the masked row).
    Tensor gz = vjp(log_softmax_of, xs, seed)[0];
    CHECK(all_finite(gz));
    for (int64_t j : {1, 3, 4, 5, 6, 7}) CHECK(gz.item(j) == seed.item(j));
    // Tangents: the softmax JVP is 0 on masked entries and on the fully masked row.
    std::vector<Tensor> ts{tensor_of({2, 4}, {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8}, dtype)};
    Tensor ty = jvp(softmax_of, xs, ts).second;
    CHECK(all_finite(ty));
    for (int64_t j : {1, 3, 4, 5, 6, 7}) CHECK(ty.item(j) == 0);
  }
}

TEST_CASE("float32 agrees with float64: values, VJP and JVP") {
  Tensor x = random_tensor({2, 3, 9}, DType::f64, 5, 2.0);
  Tensor u = random_tensor({2, 3, 9}, DType::f64, 6);
  Tensor t = random_tensor({2, 3, 9}, DType::f64, 7);
  for (auto f : {softmax_of, log_softmax_of}) {
    std::vector<Tensor> x64{x}, x32{x.to(DType::f32)};
    std::vector<Tensor> t64{t}, t32{t.to(DType::f32)};
    CHECK(max_abs_diff(evaluate(f, x64), evaluate(f, x32)) < 1e-6);
    CHECK(max_abs_diff(vjp(f, x64, u)[0], vjp(f, x32, u.to(DType::f32))[0]) < 1e-5);
    CHECK(max_abs_diff(jvp(f, x64, t64).second, jvp(f, x32, t32).second) < 1e-5);
  }
}

TEST_CASE("the row maps: y may alias x in the forward; Into::add adds, Into::replace may work in place") {
  std::vector<double> x{0.3, -1.2, 2.0, 0.0, 0.7, -0.4};
  std::vector<double> y(6), z(6), in_place = x;
  for (int i = 0; i < 2; ++i) {
    softmax_row(y.data() + 3 * i, x.data() + 3 * i, 3, 3);
    softmax_row(in_place.data() + 3 * i, in_place.data() + 3 * i, 3, 3);
  }
  CHECK(in_place == y);
  in_place = x;
  for (int i = 0; i < 2; ++i) {
    log_softmax_row(z.data() + 3 * i, x.data() + 3 * i, 3);
    log_softmax_row(in_place.data() + 3 * i, in_place.data() + 3 * i, 3);
  }
  CHECK(in_place == z);

  const std::vector<double> g{1, -2, 0.5, 0.25, 3, -1};
  std::vector<double> once(6, 0.0), twice(6, 0.0), replaced = g;
  for (int i = 0; i < 2; ++i) {
    const double* yi = y.data() + 3 * i;
    const double* gi = g.data() + 3 * i;
    const double term = softmax_row_term(yi, gi, 3);
    softmax_row_derivative<Into::add>(once.data() + 3 * i, yi, gi, term, 3);
    softmax_row_derivative<Into::add>(twice.data() + 3 * i, yi, gi, term, 3);
    softmax_row_derivative<Into::add>(twice.data() + 3 * i, yi, gi, term, 3);
    softmax_row_derivative<Into::replace>(replaced.data() + 3 * i, yi, replaced.data() + 3 * i, term, 3);
  }
  for (size_t i = 0; i < 6; ++i) CHECK(twice[i] == doctest::Approx(2 * once[i]));
  CHECK(replaced == once);
  // Each row of the softmax VJP sums to 0 (σ is invariant to adding a constant to a row).
  CHECK(once[0] + once[1] + once[2] == doctest::Approx(0).epsilon(1e-15));
}

TEST_CASE("softmax_row of a visible prefix: the map of the prefix, zeros after it, 0 for a fully masked row") {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> x{0.5, -1.0, 7.0, 8.0}, y(4), prefix(2);
  softmax_row(y.data(), x.data(), 2, 4);
  softmax_row(prefix.data(), x.data(), 2, 2);
  CHECK(y[0] == prefix[0]);
  CHECK(y[1] == prefix[1]);
  CHECK(y[2] == 0.0);
  CHECK(y[3] == 0.0);
  std::vector<double> masked{-inf, -inf, -inf};
  softmax_row(masked.data(), masked.data(), 3, 3);
  CHECK(masked == std::vector<double>{0, 0, 0});
}

TEST_CASE("lane_max: the eight lanes' rule, NaN entries skipped, the same as one float at a time") {
  // The rule of ops/fast_math.hpp, written out: lane j mod 8 for the whole groups of eight, the tail in lane 0, the
  // lanes kept in pairs; keep(x, m) = x > m ? x : m skips a NaN x.
  auto keep = [](float x, float m) { return x > m ? x : m; };
  auto by_lanes = [&](const std::vector<float>& a, float init) {
    float s[8];
    for (float& lane : s) lane = init;
    const size_t whole = a.size() / 8 * 8;
    for (size_t j = 0; j < whole; ++j) s[j % 8] = keep(a[j], s[j % 8]);
    for (size_t j = whole; j < a.size(); ++j) s[0] = keep(a[j], s[0]);
    return keep(keep(keep(s[1], s[0]), keep(s[3], s[2])), keep(keep(s[5], s[4]), keep(s[7], s[6])));
  };
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const size_t n : {size_t{0}, size_t{3}, size_t{8}, size_t{13}, size_t{64}}) {
    CAPTURE(n);
    const Tensor r = random_tensor({static_cast<int64_t>(n) + 1}, DType::f32, 31, 5.0);
    std::vector<float> a(r.data<float>(), r.data<float>() + n);
    if (n > 2) a[1] = nan, a[n - 1] = nan;  // in a lane and in the tail (or the last lane)
    for (const float init : {-inf, 0.0f, 2.0f}) {
      const float got = lane_max(a.data(), static_cast<int64_t>(n), init), want = by_lanes(a, init);
      CHECK(std::memcmp(&got, &want, sizeof got) == 0);
    }
  }
}

TEST_CASE("softmax and log_softmax errors name the op and the shapes") {
  Tape tape;
  Var ids = tape.constant(Tensor::zeros(DType::i32, {2, 3}));
  std::string msg = error_of([&] { softmax(ids); });
  CHECK(msg.find("softmax") != std::string::npos);
  CHECK(msg.find("int32") != std::string::npos);
  CHECK(msg.find("(2, 3)") != std::string::npos);
  msg = error_of([&] { log_softmax(ids); });
  CHECK(msg.find("log_softmax") != std::string::npos);
  CHECK(msg.find("(2, 3)") != std::string::npos);

  Var scalar = tape.leaf(Tensor::zeros(DType::f64, {}));
  msg = error_of([&] { softmax(scalar); });
  CHECK(msg.find("softmax") != std::string::npos);
  CHECK(msg.find("rank") != std::string::npos);
  CHECK(msg.find("()") != std::string::npos);
}
