// linear_attention against the same map built from primitive ops, in float64: the output, every gradient and
// the tangent; the degenerate causal T = 1; float32 against float64; the O(T) state its node keeps.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

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
};

std::vector<Tensor> draw_inputs(const Setup& s, DType dtype, uint64_t seed) {
  std::vector<InputSpec> specs{{"q", {s.B, s.h, s.T, s.d}, Fill::away_from_zero},
                               {"k", {s.B, s.h, s.Tk, s.d}, Fill::away_from_zero},
                               {"v", {s.B, s.h, s.Tk, s.dv}}};
  return make_inputs(specs, dtype, seed);
}

// φ(X) = elu(X) + 1
Var feature_map(Tape& tape, Var x) {
  Tensor one = Tensor::from<double>(Shape{}, {1.0}).to(x.dtype());
  return add(elu(x), tape.constant(one));
}

// O = (M ⊙ φ(Q)φ(K)ᵀ)V ⊘ rowsum(M ⊙ φ(Q)φ(K)ᵀ), with M the 0/1 causal mask (all ones when not causal): the
// quadratic form of linear attention, from elu, add, matmul, transpose, mul, sum and div.
Function primitive_map(bool causal) {
  return [causal](Tape& tape, std::span<const Var> x) {
    Var scores = matmul(feature_map(tape, x[0]), transpose(feature_map(tape, x[1])));
    if (causal) {
      const int64_t T = x[0].shape()[2];
      Tensor mask = Tensor::zeros(DType::f64, {T, T});
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j <= i; ++j) mask.data<double>()[i * T + j] = 1;
      scores = mul(scores, tape.constant(mask.to(x[0].dtype())));
    }
    return div(matmul(scores, x[2]), sum(scores, -1, true));
  };
}

Function node(bool causal) {
  return [causal](Tape&, std::span<const Var> x) { return linear_attention(x[0], x[1], x[2], causal); };
}

// Output, gradients of Q, K, V and the tangent agree to 1e-10 (relative to the larger of 1 and the largest entry).
void check_matches_primitives(const Setup& s) {
  CAPTURE(s.T);
  CAPTURE(s.Tk);
  CAPTURE(s.causal);
  const char* names[] = {"dQ", "dK", "dV"};
  const auto xs = draw_inputs(s, DType::f64, 31 + static_cast<uint64_t>(s.T));
  auto tol = [](const Tensor& ref) { return 1e-10 * std::max(1.0, max_abs(ref)); };
  const Tensor o_ref = evaluate(primitive_map(s.causal), xs), o = evaluate(node(s.causal), xs);
  CHECK(max_abs_diff(o, o_ref) <= tol(o_ref));

  const Tensor u = draw_like(o_ref.shape(), DType::f64, 41);
  const auto g_ref = vjp(primitive_map(s.causal), xs, u), g = vjp(node(s.causal), xs, u);
  for (size_t i = 0; i < 3; ++i) {
    CAPTURE(names[i]);
    CHECK(max_abs_diff(g[i], g_ref[i]) <= tol(g_ref[i]));
  }

  std::vector<Tensor> ts;
  for (size_t i = 0; i < 3; ++i) ts.push_back(draw_like(xs[i].shape(), DType::f64, 50 + i));
  const auto [y_ref, t_ref] = jvp(primitive_map(s.causal), xs, ts);
  const auto [y, t] = jvp(node(s.causal), xs, ts);
  CHECK(max_abs_diff(t, t_ref) <= tol(t_ref));
  // One tangent at a time: the JVP's terms for an absent tangent are skipped, not zero-filled.
  for (size_t i = 0; i < 3; ++i) {
    std::vector<Tensor> one(3);
    one[i] = ts[i];
    CHECK(max_abs_diff(jvp(node(s.causal), xs, one).second, jvp(primitive_map(s.causal), xs, one).second) <=
          tol(t_ref));
  }
}

size_t recorded_bytes(int64_t T, int64_t d) {
  Tape tape(size_t{64} << 20);
  auto xs = draw_inputs({1, 1, T, T, d, d, true}, DType::f64, 3);
  Var q = tape.leaf(xs[0]), k = tape.leaf(xs[1]), v = tape.leaf(xs[2]);
  const size_t before = tape.arena().bytes_in_use();
  Var o = linear_attention(q, k, v, true);
  REQUIRE(o.shape() == Shape{1, 1, T, d});
  return tape.arena().bytes_in_use() - before;
}

}  // namespace

TEST_CASE("linear_attention matches its primitive-op form: output, dQ, dK, dV and the tangent") {
  check_matches_primitives({2, 2, 7, 7, 5, 3, false});
  check_matches_primitives({2, 2, 7, 7, 5, 3, true});
  check_matches_primitives({1, 2, 6, 11, 4, 3, false});    // Tk ≠ T
  check_matches_primitives({2, 1, 1, 5, 3, 2, false});     // T = 1
  check_matches_primitives({1, 2, 150, 150, 6, 4, true});  // three chunks, the last one partial
  check_matches_primitives({1, 1, 70, 140, 6, 4, false});
}

TEST_CASE("linear_attention: the linear-attention post's φ(Q)(φ(K)ᵀV) is the numerator only, not the output") {
  const Setup s{1, 2, 6, 6, 4, 3, false};
  const auto xs = draw_inputs(s, DType::f64, 5);
  const Tensor o = evaluate(node(false), xs);
  const Tensor numerator = evaluate(
      [](Tape& tape, std::span<const Var> x) {
        return matmul(feature_map(tape, x[0]), matmul(transpose(feature_map(tape, x[1])), x[2]));
      },
      xs);
  CHECK(max_abs_diff(o, numerator) > 0.5);
}

TEST_CASE("linear_attention, causal, T = 1: O = V, and dQ = dK = 0") {
  const Setup s{2, 2, 1, 1, 3, 4, true};
  const auto xs = draw_inputs(s, DType::f64, 9);
  CHECK(max_abs_diff(evaluate(node(true), xs), xs[2]) <= 1e-15);
  const auto g = vjp(node(true), xs, draw_like({2, 2, 1, 4}, DType::f64, 10));
  CHECK(max_abs(g[0]) <= 1e-14);
  CHECK(max_abs(g[1]) <= 1e-14);
}

// float32 against float64 at T = 300 (five chunks), causal and not: the stated tolerance is 1e-5 relative to the
// largest entry of each result (observed: 1.1e-6, in the non-causal dQ, whose two terms nearly cancel).
TEST_CASE("linear_attention in float32 is within 1e-5 (relative to the largest entry) of float64") {
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    const Setup s{2, 2, 300, 300, 16, 16, causal};
    const auto xs = draw_inputs(s, DType::f64, 21);
    std::vector<Tensor> xs32;
    for (const Tensor& x : xs) xs32.push_back(x.to(DType::f32));
    const Tensor o64 = evaluate(node(causal), xs), o32 = evaluate(node(causal), xs32);
    CHECK(max_abs_diff(o32.to(DType::f64), o64) <= 1e-5 * max_abs(o64));
    const Tensor u = draw_like(o64.shape(), DType::f64, 23);
    const auto g64 = vjp(node(causal), xs, u), g32 = vjp(node(causal), xs32, u.to(DType::f32));
    for (size_t i = 0; i < 3; ++i) {
      CAPTURE(i);
      CHECK(max_abs_diff(g32[i].to(DType::f64), g64[i]) <= 1e-5 * max_abs(g64[i]));
    }
  }
}

TEST_CASE("linear_attention keeps O(T·d) state: φ(Q), φ(K), O and den, never a T×T matrix") {
  const int64_t d = 16;
  const size_t at_256 = recorded_bytes(256, d), at_1024 = recorded_bytes(1024, d);
  MESSAGE("bytes kept, T = 256 → 1024: " << at_256 << " → " << at_1024);
  CHECK(static_cast<double>(at_1024) <= 4.05 * static_cast<double>(at_256));
  CHECK(at_1024 <= size_t(1024 * (3 * d + 1) * 8 + 4096));
}

TEST_CASE("linear_attention: shape errors name the op and the shapes") {
  Tape tape;
  auto make = [&](Shape s) { return tape.leaf(Tensor::zeros(DType::f64, s)); };
  CHECK_THROWS_WITH_AS(linear_attention(make({2, 7, 5}), make({2, 7, 5}), make({2, 7, 3})),
                       doctest::Contains("linear_attention"), Error);
  CHECK_THROWS_WITH_AS(linear_attention(make({1, 2, 7, 5}), make({1, 2, 7, 4}), make({1, 2, 7, 3})),
                       doctest::Contains("(1, 2, 7, 4)"), Error);
  CHECK_THROWS_WITH_AS(linear_attention(make({1, 2, 7, 5}), make({1, 2, 7, 5}), make({1, 2, 6, 3})),
                       doctest::Contains("linear_attention"), Error);
  CHECK_THROWS_WITH_AS(linear_attention(make({1, 2, 6, 5}), make({1, 2, 7, 5}), make({1, 2, 7, 3}), true),
                       doctest::Contains("causal"), Error);
  Var q32 = tape.leaf(Tensor::zeros(DType::f32, {1, 1, 2, 2}));
  CHECK_THROWS_WITH_AS(linear_attention(q32, make({1, 1, 2, 2}), make({1, 1, 2, 2})),
                       doctest::Contains("linear_attention"), Error);
}
