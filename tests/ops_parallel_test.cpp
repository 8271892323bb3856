// The ops that split their work across the engine's threads: one thread and two agree to rounding (values,
// gradients, tangents), and two threads give the same bits in every run.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/parallel.hpp"
#include "ops/ops.hpp"

using namespace tapegrad;

namespace {

struct Case {
  std::string name;
  std::vector<InputSpec> inputs;
  Function f;
};

// Sizes above each op's grain, so that two threads each take a range.
std::vector<Case> cases() {
  std::vector<Case> cs;
  cs.push_back({"layer_norm (300, 128)", {{"x", {300, 128}}, {"w", {128}}, {"b", {128}}},
                [](Tape&, std::span<const Var> x) { return layer_norm(x[0], x[1], x[2]); }});
  cs.push_back({"cross_entropy (600, 65)", {{"logits", {600, 65}}, {"targets", {600}, Fill::indices, 65}},
                [](Tape&, std::span<const Var> x) { return cross_entropy(x[0], x[1]); }});
  cs.push_back({"embedding 800 ids, (50, 64)", {{"ids", {800}, Fill::indices, 50}, {"table", {50, 64}}},
                [](Tape&, std::span<const Var> x) { return embedding(x[0], x[1]); }});
  cs.push_back({"add (200, 200)", {{"a", {200, 200}}, {"b", {200, 200}}},
                [](Tape&, std::span<const Var> x) { return add(x[0], x[1]); }});
  cs.push_back({"gelu (200, 200)", {{"x", {200, 200}}}, [](Tape&, std::span<const Var> x) { return gelu(x[0]); }});
  cs.push_back({"linear (300, 128) by (256, 128)", {{"x", {300, 128}}, {"w", {256, 128}}, {"b", {256}}},
                [](Tape&, std::span<const Var> x) { return linear(x[0], x[1], x[2]); }});
  cs.push_back({"mlp (768, 128), H = 512", {{"x", {768, 128}}, {"w1", {512, 128}}, {"w2", {128, 512}}},
                [](Tape&, std::span<const Var> x) { return mlp(x[0], x[1], {}, x[2], {}); }});
  cs.push_back({"split_heads (12, 64, 384)", {{"x", {12, 64, 384}}},
                [](Tape&, std::span<const Var> x) { return split_heads(x[0], 4, 128, 128); }});
  cs.push_back({"merge_heads (12, 4, 64, 32)", {{"y", {12, 4, 64, 32}}},
                [](Tape&, std::span<const Var> x) { return merge_heads(x[0]); }});
  return cs;
}

struct Results {
  Tensor out, tangent;
  std::vector<Tensor> grads;
};

Results evaluate_all(const Case& c, int threads) {
  set_num_threads(threads);
  auto inputs = make_inputs(c.inputs, DType::f64, 3);
  Results r;
  r.out = evaluate(c.f, inputs);
  Tensor cotangent = make_inputs(std::vector<InputSpec>{{"g", r.out.shape()}}, DType::f64, 4)[0];
  r.grads = vjp(c.f, inputs, cotangent);
  auto tangents = make_inputs(c.inputs, DType::f64, 5);
  for (size_t i = 0; i < tangents.size(); ++i)
    if (!c.inputs[i].differentiable()) tangents[i] = Tensor{};
  r.tangent = jvp(c.f, inputs, tangents).second;
  return r;
}

double max_relative_difference(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined() ? 0 : 1;
  const auto x = a.to_vector(), y = b.to_vector();
  REQUIRE(x.size() == y.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(x[i] - y[i]) / (1 + std::fabs(y[i])));
  return worst;
}

}  // namespace

TEST_CASE("ops on two threads agree with one, and repeat bit for bit") {
  const int saved = num_threads();
  for (const Case& c : cases()) {
    CAPTURE(c.name);
    const Results one = evaluate_all(c, 1), two = evaluate_all(c, 2), again = evaluate_all(c, 2);
    CHECK(max_relative_difference(two.out, one.out) < 1e-13);
    CHECK(max_relative_difference(two.tangent, one.tangent) < 1e-13);
    CHECK(two.out.to_vector() == again.out.to_vector());
    for (size_t i = 0; i < one.grads.size(); ++i) {
      CAPTURE(c.inputs[i].name);
      CHECK(max_relative_difference(two.grads[i], one.grads[i]) < 1e-13);
      if (two.grads[i].defined()) CHECK(two.grads[i].to_vector() == again.grads[i].to_vector());
    }
  }
  set_num_threads(saved);
}
