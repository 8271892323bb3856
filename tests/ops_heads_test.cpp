// split_heads and merge_heads against the slice + reshape + permute composition they replace.
#include <doctest/doctest.h>

#include <vector>

#include "ops/registry.hpp"
#include "ops/ops.hpp"

using namespace tapegrad;

namespace {

constexpr int kToHeads[] = {0, 2, 1, 3};

// The composition models/gpt.cpp used: (B, T, W) → slice columns → (B, T, h, d) → (B, h, T, d).
Var composed_split(Var x, int64_t heads, int64_t offset, int64_t width) {
  const Shape s = x.shape();
  return permute(reshape(slice(x, -1, offset, offset + width), {s[0], s[1], heads, width / heads}), kToHeads);
}
Var composed_merge(Var y) {
  const Shape s = y.shape();
  return reshape(permute(y, kToHeads), {s[0], s[2], s[1] * s[3]});
}

void check_same(const Function& fused, const Function& composed, Shape shape, uint64_t seed) {
  std::vector<InputSpec> spec{{"x", shape}};
  auto x = make_inputs(spec, DType::f64, seed);
  Tensor a = evaluate(fused, x), b = evaluate(composed, x);
  REQUIRE(a.shape() == b.shape());
  CHECK(a.to_vector() == b.to_vector());
  Tensor g = make_inputs(std::vector<InputSpec>{{"g", a.shape()}}, DType::f64, seed + 1)[0];
  CHECK(vjp(fused, x, g)[0].to_vector() == vjp(composed, x, g)[0].to_vector());
  auto t = make_inputs(spec, DType::f64, seed + 2);
  CHECK(jvp(fused, x, t).second.to_vector() == jvp(composed, x, t).second.to_vector());
}

}  // namespace

TEST_CASE("split_heads equals slice, reshape and permute; merge_heads equals permute and reshape") {
  for (int64_t offset : {0, 8, 16}) {
    CAPTURE(offset);
    check_same([=](Tape&, std::span<const Var> x) { return split_heads(x[0], 4, offset, 8); },
               [=](Tape&, std::span<const Var> x) { return composed_split(x[0], 4, offset, 8); }, {3, 5, 24}, 1);
  }
  // large enough that the (b, t) pairs run on two threads
  check_same([](Tape&, std::span<const Var> x) { return split_heads(x[0], 4, 128, 128); },
             [](Tape&, std::span<const Var> x) { return composed_split(x[0], 4, 128, 128); }, {12, 64, 384}, 4);
  check_same([](Tape&, std::span<const Var> x) { return merge_heads(x[0]); },
             [](Tape&, std::span<const Var> x) { return composed_merge(x[0]); }, {12, 4, 64, 32}, 7);
  check_same([](Tape&, std::span<const Var> x) { return merge_heads(x[0]); },
             [](Tape&, std::span<const Var> x) { return composed_merge(x[0]); }, {2, 3, 5, 1}, 8);
}

TEST_CASE("split_heads and merge_heads: errors name the op and the shapes") {
  Tape tape;
  Var x = tape.leaf(Tensor::zeros(DType::f32, {2, 3, 12}));
  CHECK_THROWS_WITH(split_heads(x, 5, 0, 12), doctest::Contains("split_heads: 12 columns do not split into 5 heads"));
  CHECK_THROWS_WITH(split_heads(x, 2, 8, 8), doctest::Contains("columns [8, 16) are outside x (2, 3, 12)"));
  CHECK_THROWS_WITH(split_heads(tape.leaf(Tensor::zeros(DType::f32, {3, 12})), 2, 0, 12),
                    doctest::Contains("split_heads: x must be (B, T, W), got shape (3, 12)"));
  CHECK_THROWS_WITH(merge_heads(x), doctest::Contains("merge_heads: y must be (B, h, T, d), got shape (2, 3, 12)"));
  CHECK_THROWS_WITH(split_heads(tape.constant(Tensor::zeros(DType::i32, {2, 3, 12})), 2, 0, 12),
                    doctest::Contains("split_heads"));
}
