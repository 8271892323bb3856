// The attention nodes on the engine's threads: one thread and two give the same outputs, gradients (dB of every
// bias layout included, summed from per-thread copies where slices share it) and tangents, to rounding.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "engine/parallel.hpp"
#include "engine/tape.hpp"
#include "ops/products/products.hpp"
#include "ops/products/small_products.hpp"
#include "ops/registry.hpp"
#include "ops/attention/attention.hpp"
#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

// Every node, with shapes big enough that the slices split across two threads (B·h = 6 slices of 40 × 40).
std::vector<FunctionCase> cases() {
  const int64_t B = 2, H = 3, T = 40, d = 8;
  auto qkv = [&](int64_t tk) {
    return std::vector<InputSpec>{{"q", {B, H, T, d}}, {"k", {B, H, tk, d}}, {"v", {B, H, tk, d}}};
  };
  AttentionOptions causal;
  causal.causal = true;
  std::vector<FunctionCase> cs;
  cs.push_back(
      {"attention causal", qkv(T), [=](Tape&, std::span<const Var> x) { return attention(x[0], x[1], x[2], causal); }});
  cs.push_back({"beta_attention causal", qkv(T),
                [=](Tape&, std::span<const Var> x) { return beta_attention(x[0], x[1], x[2], causal); }});
  cs.push_back({"linear_attention causal", qkv(T),
                [](Tape&, std::span<const Var> x) { return linear_attention(x[0], x[1], x[2], true); }});
  cs.push_back({"linear_attention Tk=50", qkv(50),
                [](Tape&, std::span<const Var> x) { return linear_attention(x[0], x[1], x[2], false); }});
  cs.push_back({"tiled_attention causal", qkv(T),
                [=](Tape&, std::span<const Var> x) { return tiled_attention(x[0], x[1], x[2], causal, {}, 16); }});
  for (Shape bias : {Shape{B, H, T, T}, Shape{H, T, T}, Shape{T, T}, Shape{B, 1, T, T}, Shape{B, 1, 1, T}}) {
    auto inputs = qkv(T);
    inputs.push_back({"bias", bias});
    cs.push_back({"attention bias " + bias.str(), inputs,
                  [=](Tape&, std::span<const Var> x) { return attention(x[0], x[1], x[2], causal, x[3]); }});
    cs.push_back({"tiled_attention bias " + bias.str(), inputs,
                  [=](Tape&, std::span<const Var> x) { return tiled_attention(x[0], x[1], x[2], causal, x[3], 16); }});
  }
  return cs;
}

}  // namespace

TEST_CASE("attention nodes: two threads agree with one") {
  const int saved = num_threads();
  for (const FunctionCase& c : cases()) {
    CAPTURE(c.name);
    const Derivatives one = derivatives_on_threads(c, 1, 7), two = derivatives_on_threads(c, 2, 7);
    CHECK(max_relative_difference(two.out, one.out) < 1e-13);
    CHECK(max_relative_difference(two.tangent, one.tangent) < 1e-13);
    for (size_t i = 0; i < one.grads.size(); ++i) {
      CAPTURE(c.inputs[i].name);
      CHECK(max_relative_difference(two.grads[i], one.grads[i]) < 1e-13);
    }
  }
  set_num_threads(saved);
}

TEST_CASE("attention nodes on two threads give the same bits in every run") {
  const int saved = num_threads();
  for (const FunctionCase& c : cases()) {
    CAPTURE(c.name);
    const Derivatives first = derivatives_on_threads(c, 2, 7), again = derivatives_on_threads(c, 2, 7);
    CHECK(first.out.to_vector() == again.out.to_vector());
    for (size_t i = 0; i < first.grads.size(); ++i) CHECK(first.grads[i].to_vector() == again.grads[i].to_vector());
  }
  set_num_threads(saved);
}

// Kᵀ (forward) and Vᵀ (backward) are each packed once per slice and use, for all the slice's query blocks, however
// many threads run the slices: float32, T = 64 in two causal blocks of 32, d = dv = 32, so that every other operand
// (V, K, Q, G as they lie, 32 columns wide) is read in place. Where the rule sends these products elsewhere (a CPU
// without AVX-512, TAPEGRAD_GEMM set) nothing is packed by the engine.
TEST_CASE("attention packs Kᵀ and Vᵀ once per slice and use, on one thread and on two") {
  const int saved = num_threads();
  const int64_t B = 2, H = 3, T = 64, d = 32;
  const bool on_engine = product_backend(32, 64, 32) == ProductBackend::engine;
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    set_num_threads(threads);
    Tape tape;
    AttentionOptions causal;
    causal.causal = true;
    Var q = tape.leaf(Tensor::randn(DType::f32, {B, H, T, d}, 1));
    Var k = tape.leaf(Tensor::randn(DType::f32, {B, H, T, d}, 2));
    Var v = tape.leaf(Tensor::randn(DType::f32, {B, H, T, d}, 3));
    const uint64_t before = small_kernel_packings();
    Var o = attention(q, k, v, causal);
    const uint64_t forward = small_kernel_packings() - before;
    tape.backward(sum(o));
    const uint64_t backward = small_kernel_packings() - before - forward;
    CHECK(forward == static_cast<uint64_t>(on_engine ? B * H : 0));   // Kᵀ
    CHECK(backward == static_cast<uint64_t>(on_engine ? B * H : 0));  // Vᵀ
  }
  set_num_threads(saved);
}
