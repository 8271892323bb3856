// Fresh gradient buffers (engine/tape.hpp, Tape::vjp_writes_fresh): the nodes that write a gradient the first time
// one reaches it (linear, mlp, attention_qkv) give the same gradients as when every contribution is added, the
// later contributions add, an input a node takes twice is not written over, and a buffer's old contents (the arena
// reused after clear()) never show through.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/tape.hpp"
#include "ops/attention/attention.hpp"
#include "ops/gelu.hpp"
#include "ops/ops.hpp"

using namespace tapegrad;

namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

double max_diff(const Tensor& a, const Tensor& b) {
  double worst = 0;
  for (int64_t k = 0; k < a.numel(); ++k) worst = std::max(worst, std::fabs(a.item(k) - b.item(k)));
  return worst;
}

}  // namespace

TEST_CASE("fresh gradients: the first node to reach a gradient writes it, a later one adds") {
  // x feeds two linears: the later one's VJP runs first and writes x̄, the earlier one adds. With ȳ = 1,
  // x̄[i, :] = Σ_j W₁[j, :] + Σ_j W₂[j, :].
  const Tensor x0 = Tensor::randn(DType::f64, {6, 4}, 1), w1 = Tensor::randn(DType::f64, {3, 4}, 2),
               w2 = Tensor::randn(DType::f64, {5, 4}, 3);
  Tape tape;
  for (int round = 0; round < 2; ++round) {  // round 1 reuses the arena that round 0 wrote
    Var x = tape.leaf(x0);
    Var y = add(sum(linear(x, tape.constant(w1))), sum(linear(x, tape.constant(w2))));
    tape.backward(y);
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t c = 0; c < 4; ++c) {
        double expected = 0;
        for (int64_t j = 0; j < 3; ++j) expected += w1.item(j * 4 + c);
        for (int64_t j = 0; j < 5; ++j) expected += w2.item(j * 4 + c);
        CHECK(x.grad().item(i * 4 + c) == doctest::Approx(expected).epsilon(1e-12));
      }
    tape.clear();
  }
}

TEST_CASE("fresh gradients: an input a node takes twice gets both contributions") {
  // mlp(x, …, residual = x): x̄ = the MLP's x̄ + ȳ, against two leaves holding the same values.
  const Tensor x0 = Tensor::randn(DType::f64, {5, 4}, 4), w1 = Tensor::randn(DType::f64, {6, 4}, 5),
               w2 = Tensor::randn(DType::f64, {4, 6}, 6), seed = Tensor::randn(DType::f64, {5, 4}, 7);
  Tape tape;
  Var x = tape.leaf(x0);
  tape.backward(mlp(x, tape.constant(w1), {}, tape.constant(w2), {}, GeluForm::exact, x), seed);
  const Tensor twice = x.grad().clone();
  tape.clear();
  Var a = tape.leaf(x0), r = tape.leaf(x0);
  tape.backward(mlp(a, tape.constant(w1), {}, tape.constant(w2), {}, GeluForm::exact, r), seed);
  Tensor both = a.grad().clone();
  both.accumulate(r.grad());
  CHECK(max_diff(twice, both) < 1e-12);
  CHECK(same_bits(r.grad(), seed));  // the residual's fresh gradient is ȳ, copied
}

TEST_CASE("fresh gradients: old contents of a reused buffer never reach a gradient") {
  // The same forward and backward twice on one tape, the first time with other inputs: the second round's
  // buffers come from the arena the first one filled, and its gradients are those of a new tape, bit for bit.
  const Tensor x_other = Tensor::randn(DType::f32, {2, 8, 3 * 16}, 8, 0, 30),
               x0 = Tensor::randn(DType::f32, {2, 8, 48}, 9);
  const Tensor w = Tensor::randn(DType::f32, {16, 16}, 10), seed = Tensor::randn(DType::f32, {2, 8, 16}, 11);
  auto run = [&](Tape& tape, const Tensor& xv) {
    Var x = tape.leaf(xv);
    Var wv = tape.leaf(w);
    Var o = attention_qkv(x, 4, AttentionOptions{.causal = true});
    tape.backward(linear(o, wv, {}, o), seed);
    return std::vector<Tensor>{x.grad().clone(), wv.grad().clone()};
  };
  Tape fresh_tape;
  const std::vector<Tensor> expected = run(fresh_tape, x0);
  Tape reused;
  (void)run(reused, x_other);
  reused.clear();
  const std::vector<Tensor> got = run(reused, x0);
  CHECK(same_bits(got[0], expected[0]));
  CHECK(same_bits(got[1], expected[1]));
}

TEST_CASE("fresh gradients: the flag is read only inside backward's VJPs, and set only on the last node") {
  Tape tape;
  Var x = tape.leaf(Tensor::randn(DType::f64, {3, 4}, 12));
  Var w = tape.leaf(Tensor::randn(DType::f64, {2, 4}, 13));
  Var y = linear(x, w);
  CHECK_FALSE(tape.fresh_gradient(0));
  tape.vjp_writes_fresh(x);  // a leaf: nothing to mark
  Var z = sum(y);
  try {
    tape.vjp_writes_fresh(y);  // not the last node any more
    FAIL("no error thrown");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("right after record()") != std::string::npos);
  }
  // hvp zeroes every buffer (two lanes): its gradient is backward's.
  const Tensor d = Tensor::randn(DType::f64, {3, 4}, 14), dw = Tensor::randn(DType::f64, {2, 4}, 15);
  const std::vector<Var> wrt{x, w};
  const std::vector<Tensor> directions{d, dw};
  const Tape::HessianVectorProduct h = tape.hvp(z, Tensor::full(DType::f64, {}, 1.0), wrt, directions);
  tape.backward(z);
  CHECK(max_diff(h.gradient[0], x.grad()) == 0);
  CHECK(max_diff(h.gradient[1], w.grad()) == 0);
}
