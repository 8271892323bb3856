// matmul: values against a naive triple loop (hand-computed for 2-D), batch broadcasting, float32 accuracy at
// (4, 64, 128) @ (128, 96), gradients summed over broadcast batches, empty products, and the errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "ops/registry.hpp"
#include "ops/ops.hpp"

using namespace tapegrad;

namespace {

// N(0, 1) values of the given dtype, from a fixed seed.
Tensor normal(Shape shape, DType dtype, uint64_t seed) {
  const std::vector<InputSpec> spec{{"x", shape}};
  return make_inputs(spec, dtype, seed)[0];
}

// The matrices of a and b (counted in matrices) that output batch q reads: q's batch multi-index in `out`,
// with index 0 on the axes where a or b has size 1 or no axis.
std::pair<int64_t, int64_t> source_matrices(const Shape& out, const Shape& sa, const Shape& sb, int64_t q) {
  const int r = out.rank() - 2, ra = sa.rank() - 2, rb = sb.rank() - 2;
  int64_t ia = 0, ib = 0, stride_a = 1, stride_b = 1;
  for (int d = r - 1; d >= 0; --d) {
    const int64_t i = q % out[d];
    q /= out[d];
    const int da = d - (r - ra), db = d - (r - rb);
    if (da >= 0) {
      ia += (sa[da] == 1 ? 0 : i) * stride_a;
      stride_a *= sa[da];
    }
    if (db >= 0) {
      ib += (sb[db] == 1 ? 0 : i) * stride_b;
      stride_b *= sb[db];
    }
  }
  return {ia, ib};
}

// y = a @ b by a naive triple loop in double over the broadcast batch (a, b of rank ≥ 2).
std::vector<double> naive_matmul(const Tensor& a, const Tensor& b, Shape& out) {
  const Shape &sa = a.shape(), &sb = b.shape();
  const int64_t m = sa[sa.rank() - 2], k = sa[sa.rank() - 1], n = sb[sb.rank() - 1];
  const int ra = sa.rank() - 2, rb = sb.rank() - 2, r = std::max(ra, rb);
  out = Shape{};
  for (int d = 0; d < r; ++d) {
    const int64_t na = d - (r - ra) >= 0 ? sa[d - (r - ra)] : 1, nb = d - (r - rb) >= 0 ? sb[d - (r - rb)] : 1;
    out.push_back(std::max(na, nb));
  }
  int64_t batches = 1;
  for (int d = 0; d < r; ++d) batches *= out[d];
  out.push_back(m);
  out.push_back(n);
  std::vector<double> y(static_cast<size_t>(batches * m * n), 0.0);
  for (int64_t q = 0; q < batches; ++q) {
    const auto [ia, ib] = source_matrices(out, sa, sb, q);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p) acc += a.item((ia * m + i) * k + p) * b.item((ib * k + p) * n + j);
        y[static_cast<size_t>((q * m + i) * n + j)] = acc;
      }
  }
  return y;
}

// max |y − ref| / max |ref|
double max_rel_error(const Tensor& y, const std::vector<double>& ref) {
  double err = 0, scale = 0;
  for (size_t l = 0; l < ref.size(); ++l) {
    err = std::max(err, std::abs(y.item(static_cast<int64_t>(l)) - ref[l]));
    scale = std::max(scale, std::abs(ref[l]));
  }
  return err / scale;
}

}  // namespace

TEST_CASE_TEMPLATE("2-D product by hand", T, float, double) {
  Tape tape;
  Var a = tape.leaf(Tensor::from<T>({2, 2}, {T(1), T(2), T(3), T(4)}));
  Var b = tape.leaf(Tensor::from<T>({2, 3}, {T(5), T(6), T(7), T(8), T(9), T(10)}));
  Var y = matmul(a, b);
  REQUIRE(y.shape() == Shape{2, 3});
  CHECK(y.dtype() == dtype_of<T>());
  // [[1·5 + 2·8, 1·6 + 2·9, 1·7 + 2·10], [3·5 + 4·8, 3·6 + 4·9, 3·7 + 4·10]]
  CHECK(y.value().to_vector() == std::vector<double>{21, 24, 27, 47, 54, 61});
}

TEST_CASE_TEMPLATE("batched and broadcast products match the naive triple loop", T, float, double) {
  struct Pair {
    Shape a, b, out;
  };
  const double tol = std::is_same_v<T, float> ? 1e-6 : 1e-14;
  for (const Pair& p : {Pair{{3, 5}, {5, 7}, {3, 7}},                       // odd sizes
                        Pair{{2, 3, 4}, {2, 4, 5}, {2, 3, 5}},              // batched
                        Pair{{2, 1, 3, 4}, {5, 4, 6}, {2, 5, 3, 6}},        // broadcast batch
                        Pair{{2, 5, 8}, {8, 3}, {2, 5, 3}},                 // (B, T, C) @ (C, N)
                        Pair{{2, 3, 4}, {1, 1, 4, 5}, {1, 2, 3, 5}},        // b one matrix with batch axes
                        Pair{{3, 4}, {2, 4, 5}, {2, 3, 5}},                 // a 2-D, b batched
                        Pair{{1, 3, 3, 2}, {2, 1, 2, 4}, {2, 3, 3, 4}}}) {  // both broadcast
    CAPTURE(p.a.str());
    CAPTURE(p.b.str());
    const Tensor av = normal(p.a, dtype_of<T>(), 11), bv = normal(p.b, dtype_of<T>(), 12);
    Tape tape;
    Var y = matmul(tape.leaf(av), tape.leaf(bv));
    Shape out;
    const std::vector<double> ref = naive_matmul(av, bv, out);
    CHECK(out == p.out);
    REQUIRE(y.shape() == p.out);
    CHECK(max_rel_error(y.value(), ref) <= tol);
  }
}

TEST_CASE("float32 (4, 64, 128) @ (128, 96) agrees with a naive triple loop to 1e-5 relative") {
  const Tensor av = normal({4, 64, 128}, DType::f32, 21), bv = normal({128, 96}, DType::f32, 22);
  Tape tape;
  Var y = matmul(tape.leaf(av), tape.leaf(bv));
  REQUIRE(y.shape() == Shape{4, 64, 96});
  Shape out;
  const std::vector<double> ref = naive_matmul(av, bv, out);
  const double rel = max_rel_error(y.value(), ref);
  MESSAGE("max |y − ref| / max |ref| = " << rel);
  CHECK(rel <= 1e-5);
  // element by element, relative to the size of the terms summed: |y − ref| ≤ 1e-5 · Σ_p |a_ip|·|b_pj|
  const float *pa = av.data<float>(), *pb = bv.data<float>();
  int bad = 0;
  for (int64_t i = 0; i < 4 * 64; ++i)
    for (int64_t j = 0; j < 96; ++j) {
      double scale = 0;
      for (int64_t p = 0; p < 128; ++p) scale += std::abs(static_cast<double>(pa[i * 128 + p]) * pb[p * 96 + j]);
      if (std::abs(y.value().item(i * 96 + j) - ref[static_cast<size_t>(i * 96 + j)]) > 1e-5 * scale) ++bad;
    }
  CHECK(bad == 0);
}

TEST_CASE_TEMPLATE("gradients: ā = ȳ·bᵀ and b̄ = aᵀ·ȳ, summed over broadcast batches", T, float, double) {
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  for (auto [sa, sb] : {std::pair<Shape, Shape>{{2, 3, 4}, {4, 5}},  // fast path: b̄ sums over the batch of a
                        std::pair<Shape, Shape>{{2, 1, 3, 4}, {5, 4, 6}}, std::pair<Shape, Shape>{{3, 4}, {2, 4, 5}}}) {
    CAPTURE(sa.str());
    CAPTURE(sb.str());
    const Tensor av = normal(sa, dtype_of<T>(), 31), bv = normal(sb, dtype_of<T>(), 32);
    Tape tape;
    Var a = tape.leaf(av), b = tape.leaf(bv);
    Var y = matmul(a, b);
    const Tensor gy = normal(y.shape(), dtype_of<T>(), 33);
    tape.backward(y, gy);
    // The references as products of the same helper: ā_α = Σ ȳ·bᵀ and b̄_γ = Σ aᵀ·ȳ, with the batch sums done
    // by the naive loop over the output batch and accumulated per input matrix.
    const Shape ys = y.shape();
    const int64_t m = sa[sa.rank() - 2], k = sa[sa.rank() - 1], n = sb[sb.rank() - 1];
    std::vector<double> ga(static_cast<size_t>(av.numel()), 0.0), gb(static_cast<size_t>(bv.numel()), 0.0);
    const int r = ys.rank() - 2;
    int64_t batches = 1;
    for (int d = 0; d < r; ++d) batches *= ys[d];
    for (int64_t q = 0; q < batches; ++q) {
      const auto [ia, ib] = source_matrices(ys, sa, sb, q);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          const double g = gy.item((q * m + i) * n + j);
          for (int64_t p = 0; p < k; ++p) {
            ga[static_cast<size_t>((ia * m + i) * k + p)] += g * bv.item((ib * k + p) * n + j);
            gb[static_cast<size_t>((ib * k + p) * n + j)] += g * av.item((ia * m + i) * k + p);
          }
        }
    }
    CHECK(max_rel_error(a.grad(), ga) <= tol);
    CHECK(max_rel_error(b.grad(), gb) <= tol);
  }
}

TEST_CASE("the tangent is ȧ·b + a·ḃ") {
  const Tensor av = normal({2, 3, 4}, DType::f64, 41), bv = normal({4, 2}, DType::f64, 42);
  const Tensor ta = normal({2, 3, 4}, DType::f64, 43), tb = normal({4, 2}, DType::f64, 44);
  std::vector<Tensor> in{av, bv}, t{ta, tb};
  auto [y, ty] = jvp([](Tape&, std::span<const Var> x) { return matmul(x[0], x[1]); }, in, t);
  Shape out;
  const std::vector<double> r1 = naive_matmul(ta, bv, out), r2 = naive_matmul(av, tb, out);
  std::vector<double> ref(r1.size());
  for (size_t l = 0; l < ref.size(); ++l) ref[l] = r1[l] + r2[l];
  CHECK(max_rel_error(ty, ref) <= 1e-14);
  std::vector<Tensor> only_b{Tensor{}, tb};  // no tangent on a: ẏ = a·ḃ
  auto [y2, ty2] = jvp([](Tape&, std::span<const Var> x) { return matmul(x[0], x[1]); }, in, only_b);
  CHECK(max_rel_error(ty2, r2) <= 1e-14);
}

TEST_CASE("empty products") {
  Tape tape;
  Var y = matmul(tape.leaf(Tensor::zeros(DType::f64, {2, 0})), tape.leaf(Tensor::zeros(DType::f64, {0, 3})));
  REQUIRE(y.shape() == Shape{2, 3});
  CHECK(y.value().to_vector() == std::vector<double>(6, 0.0));  // k = 0: the zero matrix
  Var z = matmul(tape.leaf(Tensor::zeros(DType::f32, {0, 2, 4})), tape.leaf(Tensor::zeros(DType::f32, {4, 5})));
  CHECK(z.shape() == Shape{0, 2, 5});
}

TEST_CASE("matmul errors name the op and the shapes") {
  Tape tape;
  auto leaf = [&](Shape s, DType d = DType::f64) { return tape.leaf(Tensor::zeros(d, s)); };
  CHECK_THROWS_WITH_AS(matmul(leaf({2, 3}), leaf({4, 5})),
                       doctest::Contains("matmul: inner dimensions differ: a (2, 3) has k = 3 but b (4, 5) has k = 4"),
                       Error);
  CHECK_THROWS_WITH_AS(
      matmul(leaf({3}), leaf({3, 2})),
      doctest::Contains("matmul: both inputs need rank ≥ 2 (…, m, k) @ (…, k, n), got a (3) and b (3, 2)"), Error);
  CHECK_THROWS_WITH_AS(matmul(leaf({2, 3}), leaf({3})), doctest::Contains("got a (2, 3) and b (3)"), Error);
  CHECK_THROWS_WITH_AS(matmul(leaf({2, 3, 4}), leaf({3, 4, 5})),
                       doctest::Contains("matmul: batch dimensions of a (2, 3, 4) and b (3, 4, 5) do not broadcast"),
                       Error);
  CHECK_THROWS_WITH_AS(matmul(leaf({2, 3}), leaf({3, 2}, DType::f32)),
                       doctest::Contains("matmul: dtypes differ: float64 (2, 3) and float32 (3, 2)"), Error);
  Var ids = tape.constant(Tensor::from<int32_t>({2, 2}, {1, 2, 3, 4}));
  CHECK_THROWS_WITH_AS(matmul(ids, leaf({2, 2})), doctest::Contains("matmul: expected a float32 or float64 tensor"),
                       Error);
  Tape other;
  CHECK_THROWS_WITH_AS(matmul(leaf({2, 2}), other.leaf(Tensor::zeros(DType::f64, {2, 2}))),
                       doctest::Contains("matmul: its inputs come from different tapes"), Error);
}
