// tiled_attention against attention(): the same map, so the same output, gradients (dQ, dK, dV, dB) and
// tangents in float64; its numerics at extreme logits and in float32; and the O(T) state it keeps for backward.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/registry.hpp"
#include "ops/attention/attention.hpp"
#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

struct Setup {
  int64_t B, h, T, Tk, d, dv;
  bool causal = false;
  Shape bias{};  // rank 0: no bias
  double scale = 0;
  bool has_bias() const { return bias.rank() > 0; }
  AttentionOptions options() const { return {scale, causal}; }
};

std::vector<Tensor> draw_inputs(const Setup& s, DType dtype, uint64_t seed) {
  std::vector<InputSpec> specs{
      {"q", {s.B, s.h, s.T, s.d}}, {"k", {s.B, s.h, s.Tk, s.d}}, {"v", {s.B, s.h, s.Tk, s.dv}}};
  if (s.has_bias()) specs.push_back({"bias", s.bias});
  return make_inputs(specs, dtype, seed);
}

Function reference(const Setup& s) {
  return [s](Tape&, std::span<const Var> x) {
    return attention(x[0], x[1], x[2], s.options(), s.has_bias() ? x[3] : Var{});
  };
}

Function tiled(const Setup& s, int64_t block) {
  return [s, block](Tape&, std::span<const Var> x) {
    return tiled_attention(x[0], x[1], x[2], s.options(), s.has_bias() ? x[3] : Var{}, block);
  };
}

// Output, every input's gradient and the output's tangent agree with attention() to `tol` in float64.
void check_matches_attention(const Setup& s, int64_t block, double tol = 1e-10) {
  const char* names[] = {"dQ", "dK", "dV", "dB"};
  CAPTURE(block);
  const auto xs = draw_inputs(s, DType::f64, 7 + static_cast<uint64_t>(block));
  const Tensor o_ref = evaluate(reference(s), xs), o = evaluate(tiled(s, block), xs);
  CHECK(max_abs_diff(o, o_ref) <= tol);

  const Tensor u = draw_like(o_ref.shape(), DType::f64, 99);
  const auto g_ref = vjp(reference(s), xs, u), g = vjp(tiled(s, block), xs, u);
  for (size_t i = 0; i < xs.size(); ++i) {
    CAPTURE(names[i]);
    CHECK(max_abs_diff(g[i], g_ref[i]) <= tol);
  }

  std::vector<Tensor> ts;
  for (size_t i = 0; i < xs.size(); ++i) ts.push_back(draw_like(xs[i].shape(), DType::f64, 200 + i));
  const auto [y_ref, t_ref] = jvp(reference(s), xs, ts);
  const auto [y, t] = jvp(tiled(s, block), xs, ts);
  CHECK(max_abs_diff(t, t_ref) <= tol);
}

// Bytes the node takes from the tape's arena between its inputs and its recorded output: everything it allocates
// and keeps for backward (its output included). The arena is one block, so this is exact.
size_t recorded_bytes(bool use_tiled, int64_t T, int64_t d) {
  Tape tape(size_t{64} << 20);
  const Setup s{1, 1, T, T, d, d, true};
  auto xs = draw_inputs(s, DType::f64, 3);
  Var q = tape.leaf(xs[0]), k = tape.leaf(xs[1]), v = tape.leaf(xs[2]);
  const size_t before = tape.arena().bytes_in_use();
  Var o = use_tiled ? tiled_attention(q, k, v, s.options(), {}, 64) : attention(q, k, v, s.options());
  REQUIRE(o.shape() == Shape{1, 1, T, d});
  return tape.arena().bytes_in_use() - before;
}

}  // namespace

TEST_CASE("tiled_attention matches attention without bias, causal and not, for several block sizes") {
  for (bool causal : {false, true})
    for (int64_t block : {1, 3, 4, 7, 64}) {
      CAPTURE(causal);
      check_matches_attention({2, 3, 7, 7, 5, 3, causal}, block);
    }
  {  // Tk ≠ T, non-causal, a set scale
    for (int64_t block : {2, 3, 16}) check_matches_attention({2, 2, 5, 11, 4, 3, false, {}, 0.3}, block);
  }
  {  // more than one tile in each direction at the default block
    check_matches_attention({1, 2, 150, 150, 8, 4, true}, 64);
    check_matches_attention({1, 1, 70, 130, 8, 4, false}, 64);
  }
}

TEST_CASE("tiled_attention matches attention with every bias layout, dB included") {
  const int64_t B = 2, h = 3, T = 7;
  for (bool causal : {false, true}) {
    const int64_t Tk = causal ? T : 9;
    for (const Shape& bias :
         {Shape{B, h, T, Tk}, Shape{h, T, Tk}, Shape{T, Tk}, Shape{B, 1, T, Tk}, Shape{B, 1, 1, Tk}})
      for (int64_t block : {2, 3, 5, 64}) {
        CAPTURE(causal);
        CAPTURE(bias);
        check_matches_attention({B, h, T, Tk, 4, 3, causal, bias}, block);
      }
  }
}

TEST_CASE("tiled_attention: logits of ±1e4 stay finite and match attention") {
  Setup s{1, 2, 9, 9, 4, 3, true, Shape{9, 9}};
  auto xs = draw_inputs(s, DType::f64, 11);
  double* b = xs[3].data<double>();
  for (int64_t i = 0; i < xs[3].numel(); ++i) b[i] = b[i] > 0 ? 1e4 : -1e4;
  for (double *x = xs[0].data<double>(), *e = x + xs[0].numel(); x != e; ++x) *x *= 300;  // s·qk ~ 1e4 too
  for (int64_t block : {2, 4}) {
    const Tensor o = evaluate(tiled(s, block), xs), o_ref = evaluate(reference(s), xs);
    CHECK(all_finite(o));
    CHECK(max_abs_diff(o, o_ref) <= 1e-10);
    const Tensor u = draw_like(o.shape(), DType::f64, 5);
    const auto g = vjp(tiled(s, block), xs, u), g_ref = vjp(reference(s), xs, u);
    for (size_t i = 0; i < g.size(); ++i) {
      CHECK(all_finite(g[i]));
      CHECK(max_abs_diff(g[i], g_ref[i]) <= 1e-10 * (1 + max_abs(g_ref[i])));
    }
  }
  {  // the same in float32
    std::vector<Tensor> xs32;
    for (const Tensor& x : xs) xs32.push_back(x.to(DType::f32));
    const Tensor o = evaluate(tiled(s, 4), xs32);
    CHECK(all_finite(o));
    const auto g = vjp(tiled(s, 4), xs32, draw_like(o.shape(), DType::f32, 5));
    for (const Tensor& gi : g) CHECK(all_finite(gi));
  }
}

TEST_CASE("tiled_attention: a row whose keys are all masked by a −∞ bias gives 0, as attention does") {
  Setup s{1, 1, 4, 4, 3, 2, false, Shape{4, 4}};
  auto xs = draw_inputs(s, DType::f64, 13);
  for (int64_t j = 0; j < 4; ++j) xs[3].data<double>()[2 * 4 + j] = -std::numeric_limits<double>::infinity();
  const Tensor o = evaluate(tiled(s, 3), xs), o_ref = evaluate(reference(s), xs);
  for (int64_t e = 0; e < 2; ++e) CHECK(o.item(2 * 2 + e) == 0.0);
  CHECK(max_abs_diff(o, o_ref) <= 1e-12);
  const auto g = vjp(tiled(s, 3), xs, draw_like(o.shape(), DType::f64, 2));
  for (size_t i = 0; i < 3; ++i) CHECK(all_finite(g[i]));
}

// float32 against float64 at T = 200 (several tiles, causal, with a bias): the stated tolerance is
// 2e-6 relative to the largest entry of each result (observed: 2.5e-7).
TEST_CASE("tiled_attention in float32 is within 2e-6 (relative to the largest entry) of float64") {
  const Setup s{2, 2, 200, 200, 16, 16, true, Shape{2, 1, 200, 200}};
  const auto xs = draw_inputs(s, DType::f64, 17);
  std::vector<Tensor> xs32;
  for (const Tensor& x : xs) xs32.push_back(x.to(DType::f32));
  const Tensor o64 = evaluate(tiled(s, 64), xs), o32 = evaluate(tiled(s, 64), xs32);
  CHECK(max_abs_diff(o32.to(DType::f64), o64) <= 2e-6 * max_abs(o64));
  const Tensor u = draw_like(o64.shape(), DType::f64, 23);
  const auto g64 = vjp(tiled(s, 64), xs, u), g32 = vjp(tiled(s, 64), xs32, u.to(DType::f32));
  for (size_t i = 0; i < g64.size(); ++i) {
    CAPTURE(i);
    CHECK(max_abs_diff(g32[i].to(DType::f64), g64[i]) <= 2e-6 * max_abs(g64[i]));
  }
}

TEST_CASE("tiled_attention keeps O(T) state for backward; attention keeps the T×Tk matrix A") {
  const int64_t d = 16;
  const size_t tiled_256 = recorded_bytes(true, 256, d), tiled_1024 = recorded_bytes(true, 1024, d);
  const size_t full_256 = recorded_bytes(false, 256, d), full_1024 = recorded_bytes(false, 1024, d);
  MESSAGE("bytes kept, T = 256 → 1024: tiled " << tiled_256 << " → " << tiled_1024 << ", attention " << full_256
                                               << " → " << full_1024);
  // Tiled: O (T·dv) and L (T) in float64, plus the node record: ×4 when T grows ×4.
  CHECK(static_cast<double>(tiled_1024) <= 4.05 * static_cast<double>(tiled_256));
  CHECK(tiled_1024 <= size_t(1024 * (d + 1) * 8 + 4096));
  // Attention: A alone is T² doubles, ×16.
  CHECK(full_1024 >= size_t(1024 * 1024 * 8));
  CHECK(static_cast<double>(full_1024) >= 15.0 * static_cast<double>(full_256));
}

TEST_CASE("tiled_attention: shape errors name the op and the shapes") {
  Tape tape;
  auto make = [&](Shape s) { return tape.leaf(Tensor::zeros(DType::f64, s)); };
  Var q = make({2, 3, 4, 5}), k = make({2, 3, 4, 5}), v = make({2, 3, 4, 2});
  CHECK_THROWS_WITH_AS(tiled_attention(make({3, 4, 5}), k, v), doctest::Contains("tiled_attention"), Error);
  CHECK_THROWS_WITH_AS(tiled_attention(q, make({2, 3, 4, 6}), v), doctest::Contains("(2, 3, 4, 6)"), Error);
  CHECK_THROWS_WITH_AS(tiled_attention(q, make({2, 3, 6, 5}), make({2, 3, 6, 2}), {0, true}),
                       doctest::Contains("causal"), Error);
  CHECK_THROWS_WITH_AS(tiled_attention(q, k, v, {}, make({3, 4, 3})), doctest::Contains("(3, 4, 3)"), Error);
  CHECK_THROWS_WITH_AS(tiled_attention(q, k, v, {}, make({2, 2, 4, 4})), doctest::Contains("bias"), Error);
  CHECK_THROWS_WITH_AS(tiled_attention(q, k, v, {}, {}, 0), doctest::Contains("block"), Error);
  Var bias32 = tape.leaf(Tensor::zeros(DType::f32, {4, 4}));
  CHECK_THROWS_WITH_AS(tiled_attention(q, k, v, {}, bias32), doctest::Contains("tiled_attention"), Error);
}
