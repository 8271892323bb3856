// gelu in float32 against float64, over the whole range and on the pool's threads: the tanh form with its
// branch-free tanh, the exact form with its fitted erfc (ops/gelu.hpp); its AVX-512 kernels against its portable
// ones, bit for bit.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/parallel.hpp"
#include "ops/gelu.hpp"
#include "ops/ops.hpp"

using namespace tapegrad;

namespace {

// x spread over [−lo, lo] plus the edges of the tanh formula (|u| = 0.625 at x ≈ 0.76, |u| = 9 at x ≈ 4.3).
std::vector<float> gelu_inputs(int64_t n, float lo) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[static_cast<size_t>(i)] = -lo + 2 * lo * static_cast<float>(i) / static_cast<float>(n - 1);
  for (float e : {0.0f, 1e-30f, -1e-7f, 0.76f, -0.76f, 4.3f, -4.3f, 40.0f, -40.0f, 1e15f, -1e15f}) x.push_back(e);
  return x;
}

// gelu(x) and x̄ = gelu′(x)·ȳ for ȳ = 1, in the given dtype, as doubles.
std::pair<std::vector<double>, std::vector<double>> gelu_and_gradient(const std::vector<float>& x, DType dtype,
                                                                      Var (*op)(Var) = gelu) {
  Tensor xt = Tensor::from<float>({static_cast<int64_t>(x.size())}, x).to(dtype);
  Tape tape;
  Var xv = tape.leaf(xt);
  Var y = op(xv);
  Tensor seed = Tensor::zeros(DType::f64, y.shape());
  for (int64_t i = 0; i < seed.numel(); ++i) seed.data<double>()[i] = 1;
  tape.backward(y, seed.to(dtype));
  return {y.value().to_vector(), xv.grad().to_vector()};
}

}  // namespace

TEST_CASE("gelu float32 agrees with float64 to a few ulp, on one thread and on two") {
  const int saved = num_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    const auto x = gelu_inputs(200001, 12.0f);  // above the parallel grain: split across the pool
    auto [y32, g32] = gelu_and_gradient(x, DType::f32);
    auto [y64, g64] = gelu_and_gradient(x, DType::f64);
    double worst_y = 0, worst_g = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      // y = ½x(1 + t) loses the relative accuracy of 1 + t where t → −1 (in any float32 gelu), so errors are
      // measured against |y| + |x|; f′ likewise against 1 + |x|.
      const double scale = std::fabs(x[i]);
      worst_y = std::max(worst_y, std::fabs(y32[i] - y64[i]) / (std::fabs(y64[i]) + scale + 1e-30));
      worst_g = std::max(worst_g, std::fabs(g32[i] - g64[i]) / (1 + scale));
    }
    CAPTURE(threads);
    MESSAGE("gelu float32 vs float64: ", worst_y, " (y), ", worst_g, " (gradient)");
    CHECK(worst_y < 3e-7);
    CHECK(worst_g < 1e-6);
  }
  set_num_threads(saved);
}

TEST_CASE("gelu and gelu_erf in float32 at the ends of the range and NaN") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  using Op = Var (*)(Var);
  for (auto [name, op] : {std::pair<const char*, Op>{"gelu", gelu}, std::pair<const char*, Op>{"gelu_erf", gelu_erf}}) {
    CAPTURE(name);
    auto [y, g] = gelu_and_gradient({inf, -inf, 0.0f, nan, 10.0f, -10.0f, -40.0f}, DType::f32, op);
    CHECK(y[0] == inf);
    CHECK(std::isnan(y[1]));  // −∞·0 in either form (½·(−∞)·(1 − 1), −∞·Φ(−∞)), as in float64
    CHECK(y[2] == 0.0);
    CHECK(g[2] == doctest::Approx(0.5));
    CHECK(std::isnan(y[3]));
    CHECK(std::isnan(g[3]));
    CHECK(y[4] == doctest::Approx(10.0));
    CHECK(g[4] == doctest::Approx(1.0));
    CHECK(std::fabs(y[5]) < 1e-20);
    CHECK(std::fabs(g[5]) < 1e-20);
    CHECK(std::fabs(y[6]) < 1e-30);
    CHECK(std::fabs(g[6]) < 1e-30);
  }
}

TEST_CASE("gelu_erf float32 agrees with float64 to a few ulp of y and of f′, on one thread and on two") {
  const int saved = num_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    // The edges of the fit: τ = 1/(1 + z/2) at z = |x|/√2 near 0, 1, 9.3 (where erfc underflows in float32).
    auto x = gelu_inputs(200001, 12.0f);
    for (float e : {1.4142f, -1.4142f, 13.1f, -13.1f, -13.3f}) x.push_back(e);
    auto [y32, g32] = gelu_and_gradient(x, DType::f32, gelu_erf);
    auto [y64, g64] = gelu_and_gradient(x, DType::f64, gelu_erf);
    // Relative error in y = x·Φ(x) while Φ(x) is above 1e-30 (x > −11.4); below, |y| < 1e-28 absolutely.
    double worst_y = 0, worst_g = 0, worst_tail = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!std::isfinite(x[i]) || std::fabs(x[i]) > 1e3) continue;
      if (std::fabs(y64[i]) > 1e-30 * std::fabs(x[i]) && std::fabs(x[i]) > 1e-30)
        worst_y = std::max(worst_y, std::fabs(y32[i] - y64[i]) / std::fabs(y64[i]));
      else worst_tail = std::max(worst_tail, std::fabs(y32[i] - y64[i]));
      worst_g = std::max(worst_g, std::fabs(g32[i] - g64[i]) / (1 + std::fabs(x[i])));
    }
    CAPTURE(threads);
    MESSAGE("gelu_erf float32 vs float64: ", worst_y, " (y, relative), ", worst_g, " (gradient), ", worst_tail,
            " (y in the far tail, absolute)");
    CHECK(worst_y < 1e-6);
    CHECK(worst_g < 1e-6);
    CHECK(worst_tail < 1e-28);
  }
  set_num_threads(saved);
}

// The float32 kernels run 16 wide on an AVX-512 CPU and 8 wide elsewhere (ops/gelu.hpp), the exact form's in packs
// of eight vectors: the same operations in the same order, so the same bits. Checked on every 997th float32 bit
// pattern (both signs, zeros, subnormals, huge, ±∞, NaNs) and the edges of the formulas, in both forms and every
// kernel.
TEST_CASE("gelu kernels: the AVX-512 copy gives the portable copy's bits") {
  if (!gelu_runs_avx512()) MESSAGE("this CPU has no AVX-512: both runs take the portable copy");
  std::vector<float> x;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 997) x.push_back(std::bit_cast<float>(static_cast<uint32_t>(b)));
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (float e : {0.0f,   -0.0f, inf,  -inf,   nan,    -nan,    1e-45f, -1e-45f, 1e-38f, 0.625f,
                  -0.76f, 4.3f,  9.0f, 13.99f, -14.0f, -14.01f, 87.3f,  -87.3f,  3e38f,  -3e38f})
    x.push_back(e);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> ones(x.size(), 1.0f), in(x.rbegin(), x.rend());  // `in` is x reversed: any float against any
  auto bits_equal = [](const std::vector<float>& a, const std::vector<float>& b) {
    return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (GeluForm form : {GeluForm::exact, GeluForm::tanh}) {
    CAPTURE(gelu_form_name(form));
    std::vector<float> y[2], s[2], h[2], d[2], v[2], c[2];
    for (int path = 0; path < 2; ++path) {
      const GeluSimd simd = path == 0 ? GeluSimd::portable : GeluSimd::best;
      y[path].resize(x.size()), s[path].resize(x.size()), h[path].resize(x.size());
      gelu_forward(form, y[path].data(), s[path].data(), x.data(), n, simd);
      gelu_from_saved(form, h[path].data(), x.data(), s[0].data(), n, simd);
      d[path] = ones;
      gelu_derivative(form, d[path].data(), x.data(), s[0].data(), in.data(), n, simd);
      v[path] = in;
      gelu_derivative_in_place(form, v[path].data(), x.data(), s[0].data(), n, simd);
      c[path] = ones;
      gelu_curvature(form, c[path].data(), x.data(), s[0].data(), in.data(), ones.data(), n, simd);
      // h and gelu′ ⊙ v in one pass (the fused MLP's backward) are the two kernels' bits
      std::vector<float> h_one(x.size()), v_one = in;
      gelu_value_and_derivative_in_place(form, h_one.data(), v_one.data(), x.data(), s[0].data(), n, simd);
      CHECK(bits_equal(h_one, h[path]));
      CHECK(bits_equal(v_one, v[path]));
    }
    CHECK(bits_equal(y[0], y[1]));
    CHECK(bits_equal(s[0], s[1]));
    // Both copies take the exact form's elements eight vectors at a time (ops/float_pack.hpp): one element at a
    // time, through the same formulas on plain floats, gives the same bits.
    if (form == GeluForm::exact) {
      std::vector<float> y_one(x.size()), s_one(x.size()), v_one(in);
      for (size_t i = 0; i < x.size(); ++i) {
        s_one[i] = gelu_detail::normal_cdf(x[i]);
        y_one[i] = x[i] * s_one[i];
        v_one[i] *= gelu_detail::slope<GeluForm::exact>(x[i], s[0][i]);
      }
      CHECK(bits_equal(y[0], y_one));
      CHECK(bits_equal(s[0], s_one));
      CHECK(bits_equal(v[0], v_one));
    }
    CHECK(bits_equal(h[0], h[1]));
    CHECK(bits_equal(h[0], y[0]));  // y from the saved s is the forward's y
    CHECK(bits_equal(d[0], d[1]));
    CHECK(bits_equal(v[0], v[1]));
    CHECK(bits_equal(c[0], c[1]));
  }
}
