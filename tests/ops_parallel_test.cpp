// The ops that split their work across the engine's threads: one thread and two agree to rounding (values,
// gradients, tangents), and two threads give the same bits in every run.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/parallel.hpp"
#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

// Sizes above each op's grain, so that two threads each take a range.
std::vector<FunctionCase> cases() {
  std::vector<FunctionCase> cs;
  cs.push_back({"layer_norm (300, 128)",
                {{"x", {300, 128}}, {"w", {128}}, {"b", {128}}},
                [](Tape&, std::span<const Var> x) { return layer_norm(x[0], x[1], x[2]); }});
  cs.push_back({"cross_entropy (600, 65)",
                {{"logits", {600, 65}}, {"targets", {600}, Fill::indices, 65}},
                [](Tape&, std::span<const Var> x) { return cross_entropy(x[0], x[1]); }});
  cs.push_back({"embedding 800 ids, (50, 64)",
                {{"ids", {800}, Fill::indices, 50}, {"table", {50, 64}}},
                [](Tape&, std::span<const Var> x) { return embedding(x[0], x[1]); }});
  cs.push_back({"add (200, 200)", {{"a", {200, 200}}, {"b", {200, 200}}}, [](Tape&, std::span<const Var> x) {
                  return add(x[0], x[1]);
                }});
  cs.push_back({"gelu (200, 200)", {{"x", {200, 200}}}, [](Tape&, std::span<const Var> x) { return gelu(x[0]); }});
  cs.push_back(
      {"gelu_erf (200, 200)", {{"x", {200, 200}}}, [](Tape&, std::span<const Var> x) { return gelu_erf(x[0]); }});
  cs.push_back({"linear (300, 128) by (256, 128)",
                {{"x", {300, 128}}, {"w", {256, 128}}, {"b", {256}}},
                [](Tape&, std::span<const Var> x) { return linear(x[0], x[1], x[2]); }});
  cs.push_back({"mlp (768, 128), H = 512",
                {{"x", {768, 128}}, {"w1", {512, 128}}, {"w2", {128, 512}}},
                [](Tape&, std::span<const Var> x) { return mlp(x[0], x[1], {}, x[2], {}, GeluForm::exact); }});
  cs.push_back({"split_heads (12, 64, 384)", {{"x", {12, 64, 384}}}, [](Tape&, std::span<const Var> x) {
                  return split_heads(x[0], 4, 128, 128);
                }});
  cs.push_back({"merge_heads (12, 4, 64, 32)", {{"y", {12, 4, 64, 32}}}, [](Tape&, std::span<const Var> x) {
                  return merge_heads(x[0]);
                }});
  return cs;
}

}  // namespace

TEST_CASE("ops on two threads agree with one, and repeat bit for bit") {
  const int saved = num_threads();
  for (const FunctionCase& c : cases()) {
    CAPTURE(c.name);
    const Derivatives one = derivatives_on_threads(c, 1, 3), two = derivatives_on_threads(c, 2, 3),
                      again = derivatives_on_threads(c, 2, 3);
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
