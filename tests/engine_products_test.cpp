// The product backends (ops/products/products.hpp): the rule that picks one, oneDNN's float32 products against
// OpenBLAS', bf16 products against float64 within bf16's bound, and the refusal where a CPU has no bf16 units.
#include <doctest/doctest.h>

#include <cblas.h>

#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "ops/products/blas.hpp"
#include "ops/products/blas_info.hpp"
#include "ops/products/onednn_gemm.hpp"
#include "ops/products/products.hpp"
#include "ops/products/small_products.hpp"
#include "engine/rng.hpp"
#include "test_util.hpp"

using namespace tapegrad;

namespace {

CpuFeatures with_avx512(bool bf16) {
  CpuFeatures c;
  c.x86_64 = true;
  c.avx = c.avx2 = c.fma = true;
  c.avx512f = c.avx512bw = c.avx512dq = c.avx512vl = true;
  c.avx512bf16 = bf16;
  return c;
}

CpuFeatures avx2_only() {
  CpuFeatures c = with_avx512(false);
  c.avx512f = c.avx512bw = c.avx512dq = c.avx512vl = false;
  return c;
}

std::vector<float> normal_floats(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.normal());
  return v;
}

// One product's operands, stored with a leading dimension wider than the matrix (3 spare columns), as is or
// transposed, and a C with values for β to scale.
struct Product {
  int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
  int64_t lda, ldb, ldc;
  std::vector<float> a, b, c;
  Product(int64_t m_, int64_t n_, int64_t k_, bool ta_, bool tb_, float alpha_, float beta_, uint64_t seed)
      : m(m_), n(n_), k(k_), ta(ta_), tb(tb_), alpha(alpha_), beta(beta_) {
    lda = (ta ? m : k) + 3;
    ldb = (tb ? k : n) + 3;
    ldc = n + 3;
    a = normal_floats(static_cast<size_t>((ta ? k : m) * lda), seed);
    b = normal_floats(static_cast<size_t>((tb ? n : k) * ldb), seed + 1);
    c = normal_floats(static_cast<size_t>(m * ldc), seed + 2);
  }
  float at_a(int64_t i, int64_t p) const { return ta ? a[p * lda + i] : a[i * lda + p]; }
  float at_b(int64_t p, int64_t j) const { return tb ? b[j * ldb + p] : b[p * ldb + j]; }
  // α·Σ a·b + β·c in float64, and Σ |a|·|b| (what the rounding errors scale with).
  double exact(int64_t i, int64_t j, double* magnitude) const {
    double s = 0, mag = 0;
    for (int64_t p = 0; p < k; ++p) {
      s += double{at_a(i, p)} * double{at_b(p, j)};
      mag += std::fabs(double{at_a(i, p)} * double{at_b(p, j)});
    }
    *magnitude = std::fabs(double{alpha}) * mag;
    return double{alpha} * s + double{beta} * double{c[i * ldc + j]};
  }
};

struct Worst {
  double error_over_bound = 0;  // max |C − exact| / bound: ≤ 1 everywhere
  double relative = 0;          // max |C − exact| / Σ|a||b|: how far from float32 the product is
};

// C from the product against the float64 value, element by element, with a bound of the form
// per_product·α·Σ|a||b| + 2⁻²²·|β·c| (float32's rounding of the scaled sum), and untouched padding.
Worst compare(const Product& p, const std::vector<float>& c, double per_product) {
  Worst w;
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      double mag = 0;
      const double exact = p.exact(i, j, &mag);
      const double err = std::fabs(double{c[i * p.ldc + j]} - exact);
      const double bound = per_product * mag + std::ldexp(std::fabs(double{p.beta} * p.c[i * p.ldc + j]), -22) + 1e-30;
      w.error_over_bound = std::max(w.error_over_bound, err / bound);
      if (mag > 0) w.relative = std::max(w.relative, err / mag);
    }
    for (int64_t j = p.n; j < p.ldc; ++j) REQUIRE(c[i * p.ldc + j] == p.c[i * p.ldc + j]);  // padding untouched
  }
  return w;
}

// float32 accumulation of k products: each partial sum rounds with relative error ≤ 2⁻²⁴ (γ_k ≈ k·2⁻²⁴), plus
// the rounding of α's scaling.
double float32_bound(int64_t k) { return static_cast<double>(k + 2) * std::ldexp(1.0, -24); }

struct Dims {
  int64_t m, n, k;
};
// Small ones (run whole), and ones above the split threshold (split by rows across the pool), odd sizes among them.
const std::vector<Dims> kShapes{{7, 5, 3}, {64, 32, 64}, {33, 48, 17}, {64, 128, 64}, {200, 160, 96}, {197, 130, 301}};

// f(product) for every shape of kShapes, with A and B as is and transposed, and each (α, β); the product's case is
// in the report of any check that fails.
template <class F>
void for_each_product(uint64_t seed, std::initializer_list<std::pair<float, float>> scalings, F&& f) {
  for (Dims s : kShapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (const auto& scaling : scalings) {
          const Product p(s.m, s.n, s.k, ta, tb, scaling.first, scaling.second, seed++);
          INFO(fmt::format("(m, n, k) = ({}, {}, {}), {}·{}, α = {}, β = {}", s.m, s.n, s.k, ta ? "Aᵀ" : "A",
                           tb ? "Bᵀ" : "B", scaling.first, scaling.second));
          f(p);
        }
}

}  // namespace

TEST_CASE(
    "the rule on AVX-512 CPUs: the engine's kernel below 2^19 multiply-adds and above for A as is with k <= "
    "1024, oneDNN for the other large ones, where the width is a multiple of 16; OpenBLAS otherwise") {
  struct Row {
    CpuFeatures cpu;
    bool onednn;
    int64_t m, n, k;
    bool a_transposed;
    ProductBackend expected;
  };
  const auto one = ProductBackend::onednn, blas = ProductBackend::openblas, engine = ProductBackend::engine;
  for (const Row& r : {
           Row{with_avx512(true), true, 768, 384, 128, false, engine},   // the default model's c_attn, x·Wᵀ
           Row{with_avx512(true), true, 768, 128, 512, false, engine},   // ū·W₁, the MLP's x̄
           Row{with_avx512(false), true, 768, 128, 512, false, engine},  // an AVX-512 CPU without bf16: the same
           Row{with_avx512(true), true, 512, 128, 768, true, one},       // W̄₁ = ūᵀ·x: A transposed
           Row{with_avx512(true), true, 4096, 384, 1536, false, one},    // k = 1536: deeper than the kernel's 1024
           Row{with_avx512(true), true, 4096, 384, 1024, false, engine},
           Row{with_avx512(true), true, 128, 64, 64, false, engine},  // exactly 2^19 multiply-adds
           Row{with_avx512(true), true, 128, 64, 64, true, one},
           Row{with_avx512(true), true, 64, 64, 64, true, engine},       // 2^18: below, either way
           Row{with_avx512(true), true, 64, 64, 32, false, engine},      // an attention head's product at T = 64
           Row{with_avx512(true), true, 32, 65, 32, false, engine},      // any width
           Row{with_avx512(true), false, 64, 64, 32, false, engine},     // the engine's kernel needs no oneDNN
           Row{avx2_only(), true, 64, 64, 32, false, blas},              // nor on AVX2 CPUs
           Row{with_avx512(true), true, 768, 65, 128, false, blas},      // the head: 65 columns
           Row{with_avx512(true), false, 768, 384, 128, false, engine},  // built without oneDNN
           Row{with_avx512(true), false, 384, 128, 768, true, blas},
           Row{avx2_only(), true, 768, 384, 128, false, blas},       // AVX2 CPUs keep OpenBLAS
           Row{CpuFeatures{}, true, 2048, 2048, 2048, false, blas},  // another architecture
       }) {
    CAPTURE(r.m);
    CAPTURE(r.n);
    CAPTURE(r.k);
    CAPTURE(r.a_transposed);
    CAPTURE(r.onednn);
    CHECK(backend_by_rule(r.cpu, r.onednn, r.m, r.n, r.k, r.a_transposed) == r.expected);
  }
}

TEST_CASE("this process follows the rule for its CPU, or TAPEGRAD_GEMM") {
  const char* forced = std::getenv("TAPEGRAD_GEMM");
  const std::string env = forced ? forced : "";
  for (Dims s : kShapes) {
    const ProductBackend expected = env == "openblas" ? ProductBackend::openblas
                                    : env == "onednn" ? ProductBackend::onednn
                                                      : backend_by_rule(cpu_features(), onednn_built(), s.m, s.n, s.k);
    CHECK(product_backend(s.m, s.n, s.k) == expected);
    const ProductBackend expected_at = env == "openblas" ? ProductBackend::openblas
                                       : env == "onednn"
                                           ? ProductBackend::onednn
                                           : backend_by_rule(cpu_features(), onednn_built(), s.m, s.n, s.k, true);
    CHECK(product_backend(s.m, s.n, s.k, true) == expected_at);
  }
  const nlohmann::json j = products_json();
  CHECK(j["precision"].get<std::string>() == "f32");
  CHECK(j["summary"].get<std::string>().find("precision f32") != std::string::npos);
}

TEST_CASE("round_to_bf16 keeps 8 significant bits, rounds to nearest even, keeps NaN and infinities") {
  using onednn_detail::round_to_bf16;
  CHECK(round_to_bf16(1.0f) == 1.0f);
  CHECK(round_to_bf16(-3.5f) == -3.5f);
  CHECK(round_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 1.0f);                             // a tie: to even (down)
  CHECK(round_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 1.0f + std::ldexp(1.0f, -6));  // a tie: to even (up)
  CHECK(round_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)) == 1.0f + std::ldexp(1.0f, -7));
  CHECK(round_to_bf16(std::ldexp(1.0f, -130)) == 0.0f);  // a subnormal: zero of its sign, as vcvtneps2bf16
  CHECK(std::signbit(round_to_bf16(-std::ldexp(1.0f, -130))));
  CHECK(std::isnan(round_to_bf16(std::nanf(""))));
  CHECK(std::isnan(round_to_bf16(std::bit_cast<float>(0x7fffffffu))));  // would carry into the exponent unguarded
  CHECK(round_to_bf16(INFINITY) == INFINITY);
  CHECK(round_to_bf16(-INFINITY) == -INFINITY);
  Rng rng(5);
  for (int i = 0; i < 10000; ++i) {
    const auto x = static_cast<float>(rng.normal() * std::exp(rng.normal() * 5));
    CHECK(std::fabs(double{round_to_bf16(x)} - double{x}) <= std::ldexp(std::fabs(double{x}), -8));
  }
}

TEST_CASE("rounding rows to bf16 (the CPU's instruction where it has one) gives round_to_bf16's bits") {
  std::vector<float> x = normal_floats(1000, 9);
  for (float& v : x) v *= std::exp(static_cast<float>(v * 20));
  for (float special :
       {0.0f, -0.0f, INFINITY, -INFINITY, std::nanf(""), std::ldexp(1.0f, -130), -std::ldexp(1.0f, -140),
        1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8), std::bit_cast<float>(0x7fffffffu),
        std::numeric_limits<float>::max(), std::numeric_limits<float>::min()})
    x.push_back(special);
  const int64_t rows = 7, cols = 101, ld = 143;  // 143 ≥ cols: the rows sit apart, as in a padded matrix
  x.resize(static_cast<size_t>(rows * ld), 0.5f);
  std::vector<uint16_t> out(static_cast<size_t>(rows * cols), 0xdead);
  onednn_detail::round_to_bf16_rows(out.data(), x.data(), rows, cols, ld);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      const float expected = onednn_detail::round_to_bf16(x[r * ld + j]);
      const float got = std::bit_cast<float>(uint32_t{out[r * cols + j]} << 16);
      CAPTURE(x[r * ld + j]);
      if (std::isnan(expected)) CHECK(std::isnan(got));
      else CHECK(std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(expected));
    }
}

TEST_CASE("oneDNN's float32 products equal the float64 product to float32's accumulation bound, as OpenBLAS'") {
  if (!onednn_built()) {
    CHECK_ERROR_HAS(onednn_detail::sgemm(false, false, 1, 1, 1, 1, nullptr, 1, nullptr, 1, 0, nullptr, 1), "oneDNN");
    return;
  }
  for_each_product(100, {{1.0f, 0.0f}, {0.125f, 1.0f}, {-2.0f, 0.5f}}, [](const Product& p) {
    std::vector<float> dnnl = p.c, blas = p.c;
    const bool ran = onednn_detail::sgemm(p.ta, p.tb, p.m, p.n, p.k, p.alpha, p.a.data(), p.lda, p.b.data(), p.ldb,
                                          p.beta, dnnl.data(), p.ldc);
    REQUIRE(ran);  // no shape here falls back to oneDNN's reference implementation on x86-64
    cblas_sgemm(CblasRowMajor, p.ta ? CblasTrans : CblasNoTrans, p.tb ? CblasTrans : CblasNoTrans,
                static_cast<int>(p.m), static_cast<int>(p.n), static_cast<int>(p.k), p.alpha, p.a.data(),
                static_cast<int>(p.lda), p.b.data(), static_cast<int>(p.ldb), p.beta, blas.data(),
                static_cast<int>(p.ldc));
    CHECK(compare(p, dnnl, float32_bound(p.k)).error_over_bound <= 1.0);
    CHECK(compare(p, blas, float32_bound(p.k)).error_over_bound <= 1.0);
  });
}

// The small kernel: each element one FMA chain over p = 0 … k−1, so float32's accumulation bound holds; shapes with
// tails of rows (not a multiple of 6) and of columns (not of 16), k = 1, and wide products (several column blocks).
TEST_CASE("the engine's small-product kernel equals the float64 product to float32's accumulation bound" *
          doctest::skip(!small_kernel_available())) {
  uint64_t seed = 300;
  for (Dims s : {Dims{1, 1, 1}, Dims{7, 5, 3}, Dims{6, 16, 1}, Dims{13, 17, 9}, Dims{32, 32, 64}, Dims{64, 32, 32},
                 Dims{33, 48, 17}, Dims{5, 130, 7}, Dims{32, 65, 40}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.125f, 1.0f}, std::pair{-2.0f, 0.5f}}) {
          const Product p(s.m, s.n, s.k, ta, tb, alpha, beta, seed++);
          INFO(fmt::format("(m, n, k) = ({}, {}, {}), ta = {}, tb = {}, α = {}, β = {}", s.m, s.n, s.k, ta, tb, alpha,
                           beta));
          std::vector<float> c = p.c;
          small_sgemm(p.ta, p.tb, p.m, p.n, p.k, p.alpha, p.a.data(), p.lda, p.b.data(), p.ldb, p.beta, c.data(),
                      p.ldc);
          CHECK(compare(p, c, float32_bound(p.k)).error_over_bound <= 1.0);
        }
}

TEST_CASE("β = 0 never reads C: NaN there does not reach the small kernel's result" *
          doctest::skip(!small_kernel_available())) {
  const Product p(9, 20, 5, false, true, 1.0f, 0.0f, 7);
  std::vector<float> c = p.c;
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) c[i * p.ldc + j] = std::nanf("");
  small_sgemm(p.ta, p.tb, p.m, p.n, p.k, p.alpha, p.a.data(), p.lda, p.b.data(), p.ldb, 0.0f, c.data(), p.ldc);
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) REQUIRE(std::isfinite(c[i * p.ldc + j]));
}

namespace {

// Products of four row blocks of 16 by one op(B) = Bᵀ (B stored (64, 32)), the i-th on its first 16(i + 1) columns,
// through a SharedOperand (with bf16 pair storage where `pairs` is given) into `shared` and through gemm() with B as
// given into `plain`; returns how many operands were packed.
uint64_t shared_operand_products(uint64_t seed, std::vector<uint32_t>* pairs, std::vector<float>& shared,
                                 std::vector<float>& plain) {
  const int64_t k = 32, columns = 64;
  const std::vector<float> a = normal_floats(static_cast<size_t>(64 * k), seed);
  const std::vector<float> b = normal_floats(static_cast<size_t>(columns * k), seed + 1);
  std::vector<float> storage;
  shared.assign(64 * columns, 0.0f);
  plain.assign(64 * columns, 0.0f);
  SharedOperand<float> bt(transposed(b.data(), k), k, columns, storage, pairs);
  const uint64_t before = small_kernel_packings();
  for (int64_t i0 = 0; i0 < 64; i0 += 16) {
    const int64_t n = i0 + 16;
    gemm(16, n, 1.0f, as_is(a.data() + i0 * k, k), bt, 0.0f, shared.data() + i0 * columns, columns);
    gemm<float>(16, n, k, 1.0f, as_is(a.data() + i0 * k, k), transposed(b.data(), k), 0.0f, plain.data() + i0 * columns,
                columns);
  }
  return small_kernel_packings() - before;
}

}  // namespace

// A SharedOperand: packed once, and the same bits as the same products through gemm() with the operand as given,
// which packs its transposed B at every call where the products run on the engine's kernel.
TEST_CASE("a shared operand is packed once for all the products that read it, with gemm()'s bits") {
  std::vector<float> shared, plain;
  const uint64_t packed = shared_operand_products(11, nullptr, shared, plain);
  CHECK(shared == plain);
  if (product_backend(16, 64, 32) == ProductBackend::engine) CHECK(packed == 1 + 4);
  else CHECK(packed == 0);
}

// The engine's bf16 tiles against the float64 product of the operands rounded as round_to_bf16 rounds them: within
// float32's accumulation bound, so every operand element is rounded once, to the right bfloat16, and each pair of k
// lands in its lane (odd k and odd widths end in a zero half; padding past n is never written).
TEST_CASE("the engine's bf16 tiles: the float64 product of the rounded operands to float32's bound, every transpose" *
          doctest::skip(!small_bf16_kernel_available())) {
  for (const int64_t m : {1, 5, 33})
    for (const int64_t n : {1, 17, 32, 65})
      for (const int64_t k : {1, 2, 7, 32, 33, 64})
        for (bool ta : {false, true})
          for (bool tb : {false, true})
            for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.125f, 1.0f}}) {
              Product p(m, n, k, ta, tb, alpha, beta, static_cast<uint64_t>(m * 1000 + n * 10 + k));
              CAPTURE(m);
              CAPTURE(n);
              CAPTURE(k);
              CAPTURE(ta);
              CAPTURE(tb);
              Product rounded = p;
              for (float& x : rounded.a) x = onednn_detail::round_to_bf16(x);
              for (float& x : rounded.b) x = onednn_detail::round_to_bf16(x);
              std::vector<float> c = p.c;
              small_bf16_sgemm(ta, tb, m, n, k, alpha, p.a.data(), p.lda, p.b.data(), p.ldb, beta, c.data(), p.ldc);
              CHECK(compare(rounded, c, float32_bound(k)).error_over_bound <= 1.0);
            }
}

// In bf16 mode a shared operand is rounded and packed once for the products of all its blocks, with the bits of the
// same products through gemm() rounding and packing it at every call (on the engine's tiles, the rule's backend
// for these products; none is packed where TAPEGRAD_GEMM forces a library).
TEST_CASE("in bf16 mode a shared operand's bf16 pairs are packed once, with gemm()'s bits" *
          doctest::skip(!bf16_unavailable_reason().empty() || !small_bf16_kernel_available())) {
  PrecisionScope bf16(ProductPrecision::bf16);
  std::vector<float> shared, plain;
  std::vector<uint32_t> pairs;
  const uint64_t packed = shared_operand_products(13, &pairs, shared, plain);
  CHECK(shared == plain);
  if (product_backend(16, 64, 32) == ProductBackend::engine) CHECK(packed == 1 + 4);
  else CHECK(packed == 0);
}

TEST_CASE(
    "bf16 products: float64 within bf16's bound, from 2^19 multiply-adds on oneDNN and below on the engine's bf16 "
    "tiles where the CPU has them (else float32's bound), through gemm()") {
  const std::string missing = bf16_unavailable_reason();
  if (!missing.empty()) {  // this CPU (or build) cannot: the setting is refused and changes nothing
    CHECK_ERROR_HAS(set_product_precision(ProductPrecision::bf16), "bf16 products");
    CHECK(product_precision() == ProductPrecision::f32);
    return;
  }
  // Each operand rounds to bf16 with relative error ≤ u = 2⁻⁸, so each term a·b with ≤ 2u + u²; the sum
  // accumulates in float32.
  const double u = std::ldexp(1.0, -8);
  PrecisionScope bf16(ProductPrecision::bf16);
  REQUIRE(product_precision() == ProductPrecision::bf16);
  double largest_relative = 0;
  for_each_product(300, {{1.0f, 0.0f}, {0.125f, 1.0f}}, [&](const Product& p) {
    std::vector<float> c = p.c;
    gemm(p.m, p.n, p.k, p.alpha, MatrixOperand<float>{p.a.data(), p.lda, p.ta},
         MatrixOperand<float>{p.b.data(), p.ldb, p.tb}, p.beta, c.data(), p.ldc);
    const bool large = runs_in_bf16(p.m, p.n, p.k);
    CHECK(large == (p.m * p.n * p.k >= (int64_t{1} << 19)));
    const bool in_bf16 =
        large || (small_bf16_kernel_available() && product_backend(p.m, p.n, p.k, p.ta) == ProductBackend::engine);
    const Worst w = compare(p, c, in_bf16 ? 2 * u + u * u + float32_bound(p.k) : float32_bound(p.k));
    CHECK(w.error_over_bound <= 1.0);
    if (in_bf16) largest_relative = std::max(largest_relative, w.relative);
  });
  // The operands really were rounded: somewhere the error is far above float32's (~2⁻²⁰ here).
  CHECK(largest_relative > std::ldexp(1.0, -12));
  // float64 products never are.
  std::vector<double> a{1.0 + std::ldexp(1.0, -20)}, b{1.0}, c{0.0};
  gemm(1, 1, 1, 1.0, as_is(a.data(), 1), as_is(b.data(), 1), 0.0, c.data(), 1);
  CHECK(c[0] == a[0]);
}

TEST_CASE("bf16 is refused in one line where the CPU has no bf16 units") {
  setenv("TAPEGRAD_FAKE_NO_BF16", "1", 1);
  const std::string why = bf16_unavailable_reason();
  CHECK_ERROR_HAS(set_product_precision(ProductPrecision::bf16), "bf16 products",
                  onednn_built() ? "AVX512_BF16" : "oneDNN");
  unsetenv("TAPEGRAD_FAKE_NO_BF16");
  CHECK(why.find('\n') == std::string::npos);
  CHECK(product_precision() == ProductPrecision::f32);
  CHECK_ERROR_HAS(parse_precision("fp16"), "fp16", "f32 or bf16");
  CHECK(parse_precision("bf16") == ProductPrecision::bf16);
}

TEST_CASE("a ProductLog sees each float32 product once, with its shape, its transposes and whether it was split") {
  struct Log : ProductLog {
    std::vector<ProductRun> runs;
    void record(const ProductRun& r) override { runs.push_back(r); }  // called from this thread here
  } log;
  Rng rng(5);
  auto values = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = static_cast<float>(rng.normal());
    return v;
  };
  const std::vector<float> a = values(256 * 128), b = values(128 * 96);
  std::vector<float> c(256 * 96);
  std::vector<double> c64(256 * 96), a64(a.begin(), a.end()), b64(b.begin(), b.end());
  set_product_log(&log);
  gemm(256, 96, 128, 1.0f, as_is(a.data(), 128), as_is(b.data(), 96), 0.0f, c.data(), 96);      // 2^21.6: split
  gemm(96, 32, 128, 1.0f, transposed(b.data(), 96), as_is(a.data(), 128), 0.0f, c.data(), 32);  // small: whole
  gemm(256, 96, 128, 1.0, as_is(a64.data(), 128), as_is(b64.data(), 96), 0.0, c64.data(), 96);  // float64: not seen
  set_product_log(nullptr);
  gemm(96, 32, 128, 1.0f, transposed(b.data(), 96), as_is(a.data(), 128), 0.0f, c.data(), 32);  // removed: not seen
  REQUIRE(log.runs.size() == 2);
  const ProductRun& big = log.runs[0];
  CHECK((big.m == 256 && big.n == 96 && big.k == 128 && !big.trans_a && !big.trans_b));
  CHECK(big.split == (in_parallel_region() ? false : true));
  CHECK(big.bf16 == (product_precision() == ProductPrecision::bf16));
  CHECK(big.seconds > 0);
  const ProductRun& small = log.runs[1];
  CHECK((small.m == 96 && small.n == 32 && small.k == 128 && small.trans_a && !small.trans_b && !small.split));
}

TEST_CASE("oneDNN on a team of threads (the bench's ceilings) gives the float32 product to its bound") {
  if (!onednn_built()) return;
  for_each_product(101, {{1.0f, 0.0f}}, [](const Product& p) {
    std::vector<float> team = p.c;
    if (!onednn_detail::team_sgemm(2, p.ta, p.tb, p.m, p.n, p.k, p.a.data(), p.lda, p.b.data(), p.ldb, team.data(),
                                   p.ldc))
      return;
    CHECK(compare(p, team, float32_bound(p.k)).error_over_bound <= 1.0);
  });
}

TEST_CASE("Bf16Reach::every_product sends products of any size to bf16 for its scope, and no further") {
  CHECK(bf16_reach() == Bf16Reach::large_products);
  if (!bf16_unavailable_reason().empty()) {  // the scope refuses bf16 as set_product_precision does
    CHECK_ERROR_HAS(PrecisionScope(ProductPrecision::bf16, Bf16Reach::every_product), "bf16 products");
    CHECK(bf16_reach() == Bf16Reach::large_products);
    return;
  }
  {
    PrecisionScope large(ProductPrecision::bf16);
    CHECK_FALSE(runs_in_bf16(2, 3, 4));
    CHECK(runs_in_bf16(128, 64, 64));
    PrecisionScope every(ProductPrecision::bf16, Bf16Reach::every_product);
    CHECK(runs_in_bf16(2, 3, 4));
    CHECK(products_summary().find("bf16 for every product") != std::string::npos);
    // A small product now reads its operands rounded to bf16: 1 + 2⁻¹⁰ is 1 there.
    std::vector<float> a{1.0f + std::ldexp(1.0f, -10)}, b{1.0f}, c{0.0f};
    gemm(1, 1, 1, 1.0f, as_is(a.data(), 1), as_is(b.data(), 1), 0.0f, c.data(), 1);
    CHECK(c[0] == 1.0f);
  }
  CHECK(bf16_reach() == Bf16Reach::large_products);
  CHECK(product_precision() == ProductPrecision::f32);
  CHECK_FALSE(runs_in_bf16(128, 64, 64));
}

TEST_CASE("an emulated rounding moves a float64 product's operands and result by exactly u, each way by its hash") {
  Rng rng(17);
  const int64_t m = 5, n = 7, k = 9;
  std::vector<double> a(static_cast<size_t>(k * m)), b(static_cast<size_t>(k * n));
  for (double& v : a) v = rng.normal();
  for (double& v : b) v = rng.normal();
  auto product = [&](std::vector<double> aa, std::vector<double> bb) {  // op(A) = Aᵀ: A stored (k, m)
    std::vector<double> c(static_cast<size_t>(m * n));
    gemm(m, n, k, 1.0, transposed(aa.data(), m), as_is(bb.data(), n), 0.0, c.data(), n);
    return c;
  };
  const std::vector<double> exact = product(a, b);
  const EmulatedRounding r{std::ldexp(1.0, -8), std::ldexp(1.0, -24), 42};
  std::vector<double> moved;
  {
    EmulatedRoundingScope scope(r);
    CHECK(emulated_rounding().seed == 42);
    moved = product(a, b);
  }
  CHECK_FALSE(emulated_rounding().any());
  CHECK(product(a, b) == exact);  // gone with its scope
  // The same product of the moved operands, its result moved: what the scope computed.
  std::vector<double> am = a, bm = b;
  for (double& v : am) v = emulate_rounding(v, r.operand_roundoff, r.seed);
  for (double& v : bm) v = emulate_rounding(v, r.operand_roundoff, r.seed);
  std::vector<double> want = product(am, bm);
  for (double& v : want) v = emulate_rounding(v, r.result_roundoff, ~r.seed);
  int up = 0;
  for (size_t i = 0; i < want.size(); ++i) CHECK(moved[i] == doctest::Approx(want[i]).epsilon(1e-14));
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(std::abs(am[i] - a[i]) == doctest::Approx(std::abs(a[i]) * r.operand_roundoff).epsilon(1e-12));
    up += std::abs(am[i]) > std::abs(a[i]);
  }
  CHECK(up > 10);  // both ways
  CHECK(up < 35);
  CHECK_ERROR_HAS(set_emulated_rounding({1.5, 0, 0}), "emulated rounding", "1.5");
}
