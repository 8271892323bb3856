// The attention nodes on the engine's threads: one thread and two give the same outputs, gradients (dB of every
// bias layout included, summed from per-thread copies where slices share it) and tangents, to rounding.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "engine/parallel.hpp"
#include "engine/registry.hpp"
#include "ops/attention.hpp"

using namespace tapegrad;

namespace {

struct Case {
  std::string name;
  std::vector<InputSpec> inputs;
  Function f;
};

// Every node, with shapes big enough that the slices split across two threads (B·h = 6 slices of 40 × 40).
std::vector<Case> cases() {
  const int64_t B = 2, H = 3, T = 40, d = 8;
  auto qkv = [&](int64_t tk) {
    return std::vector<InputSpec>{{"q", {B, H, T, d}}, {"k", {B, H, tk, d}}, {"v", {B, H, tk, d}}};
  };
  AttentionOptions causal;
  causal.causal = true;
  std::vector<Case> cs;
  cs.push_back({"attention causal", qkv(T), [=](Tape&, std::span<const Var> x) { return attention(x[0], x[1], x[2], causal); }});
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
    cs.push_back({"tiled_attention bias " + bias.str(), inputs, [=](Tape&, std::span<const Var> x) {
                    return tiled_attention(x[0], x[1], x[2], causal, x[3], 16);
                  }});
  }
  return cs;
}

double max_relative_difference(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  REQUIRE(x.size() == y.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(x[i] - y[i]) / (1 + std::fabs(y[i])));
  return worst;
}

struct Results {
  Tensor out, tangent;
  std::vector<Tensor> grads;
};

Results evaluate_all(const Case& c, int threads) {
  set_num_threads(threads);
  auto inputs = make_inputs(c.inputs, DType::f64, 7);
  Results r;
  r.out = evaluate(c.f, inputs);
  Tensor cotangent = make_inputs(std::vector<InputSpec>{{"g", r.out.shape()}}, DType::f64, 8)[0];
  r.grads = vjp(c.f, inputs, cotangent);
  auto tangents = make_inputs(c.inputs, DType::f64, 9);
  r.tangent = jvp(c.f, inputs, tangents).second;
  return r;
}

}  // namespace

TEST_CASE("attention nodes: two threads agree with one") {
  const int saved = num_threads();
  for (const Case& c : cases()) {
    CAPTURE(c.name);
    const Results one = evaluate_all(c, 1), two = evaluate_all(c, 2);
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
  for (const Case& c : cases()) {
    CAPTURE(c.name);
    const Results first = evaluate_all(c, 2), again = evaluate_all(c, 2);
    CHECK(first.out.to_vector() == again.out.to_vector());
    for (size_t i = 0; i < first.grads.size(); ++i) CHECK(first.grads[i].to_vector() == again.grads[i].to_vector());
  }
  set_num_threads(saved);
}
