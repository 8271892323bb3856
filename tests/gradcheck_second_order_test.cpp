// Second order: Tape::hvp against central differences of the gradient and the symmetry of the Hessian, for every
// registered case whose ops have a second-order rule; ops without one are refused by name; a planted slip in a
// second-order term fails.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "engine/gradcheck/registry.hpp"
#include "engine/gradcheck/second_order.hpp"
#include "ops/ops.hpp"
#include "ops/pointwise.hpp"

using namespace tapegrad;

TEST_CASE("Hessian-vector products agree with differences of the gradient on every registered case") {
  // Every registered op has a second-order rule: each case runs the check and passes it.
  int checked = 0, refused = 0;
  for (const OpInfo& op : builtin_registry().ops()) {
    for (const GradcheckCase& c : op.cases) {
      CAPTURE(op.name);
      CAPTURE(c.name);
      const GradcheckReport r = gradcheck_second_order(c, {}, op.name);
      if (c.at_kink) continue;
      const bool skipped = !r.checks.empty() && r.checks[0].skipped;
      if (skipped) {
        ++refused;
        CHECK(r.checks[0].worst.find("has no second-order rule") != std::string::npos);
      } else {
        ++checked;
        CHECK_MESSAGE(r.passed(), r.str());
      }
    }
  }
  MESSAGE(checked, " cases checked to second order, ", refused, " refused (an op without a second-order rule)");
  CHECK(refused == 0);
  CHECK(checked > 140);
}

TEST_CASE("hvp of a small function by hand: s = Σ a²·b, H·(ȧ, ḃ) = (2b·ȧ + 2a·ḃ, 2a·ȧ)") {
  Tape tape;
  const Tensor av = Tensor::from<double>({3}, {1.0, -2.0, 0.5}), bv = Tensor::from<double>({3}, {3.0, 1.0, -1.0});
  Var a = tape.leaf(av), b = tape.leaf(bv);
  Var s = sum(mul(mul(a, a), b));
  const Tensor da = Tensor::from<double>({3}, {1.0, 0.0, 2.0}), db = Tensor::from<double>({3}, {0.5, 1.0, -1.0});
  const Tensor dirs[] = {da, db};
  const Var wrt[] = {a, b};
  const auto r = tape.hvp(s, Tensor::from<double>({}, {1.0}), wrt, dirs);
  for (int64_t k = 0; k < 3; ++k) {
    CHECK(r.gradient[0].item(k) == doctest::Approx(2 * av.item(k) * bv.item(k)));
    CHECK(r.gradient[1].item(k) == doctest::Approx(av.item(k) * av.item(k)));
    CHECK(r.hvp[0].item(k) == doctest::Approx(2 * bv.item(k) * da.item(k) + 2 * av.item(k) * db.item(k)));
    CHECK(r.hvp[1].item(k) == doctest::Approx(2 * av.item(k) * da.item(k)));
  }
}

TEST_CASE("hvp refuses an op without a second-order rule, by name") {
  // pointwise() from f and f′ alone records no second-order rule (with f″ as well, it does).
  Tape tape;
  Var x = tape.leaf(Tensor::randn(DType::f64, {2, 3}, 1));
  Var s = sum(pointwise("softsign", x, [](auto v) { return v / (1 + std::abs(v)); },
                        [](auto v) { return 1 / ((1 + std::abs(v)) * (1 + std::abs(v))); }));
  const Tensor dirs[] = {Tensor::randn(DType::f64, {2, 3}, 2)};
  const Var wrt[] = {x};
  CHECK_THROWS_WITH_AS(tape.hvp(s, Tensor::from<double>({}, {1.0}), wrt, dirs),
                       doctest::Contains("op 'softsign' has no second-order rule"), Error);
}

TEST_CASE("a slip in a second-order term fails the hvp check") {
  // y = x², recorded with the right VJP and JVP and a second-order term that forgets its factor 2.
  Function slipped = [](Tape& tape, std::span<const Var> in) {
    const Var x = in[0];
    const Tensor xv = x.value();
    Tensor y = tape.empty(DType::f64, x.shape());
    for (int64_t k = 0; k < y.numel(); ++k) y.data<double>()[k] = xv.item(k) * xv.item(k);
    return tape.record(
        "square_slipped", {x}, y,
        [xv](const Tensor& g, std::span<const Tensor> gin) {
          for (int64_t k = 0; k < g.numel(); ++k) gin[0].data<double>()[k] += 2 * xv.item(k) * g.item(k);
        },
        [xv](std::span<const Tensor> tin, const Tensor& ty) {
          for (int64_t k = 0; k < ty.numel(); ++k) ty.data<double>()[k] += 2 * xv.item(k) * tin[0].item(k);
        },
        [](const Tensor& g, std::span<const Tensor> tin, std::span<const Tensor> gin_dot) {
          for (int64_t k = 0; k < g.numel(); ++k) gin_dot[0].data<double>()[k] += tin[0].item(k) * g.item(k);
        });
  };
  const Tensor x = Tensor::randn(DType::f64, {3, 4}, 5);
  const std::string names[] = {"x"};
  const GradcheckReport r = gradcheck_second_order(slipped, std::span<const Tensor>(&x, 1), names);
  CHECK_FALSE(r.passed());
  REQUIRE(r.checks.size() == 2);
  CHECK(r.checks[0].check == "hvp");
  CHECK_FALSE(r.checks[0].passed);
  CHECK(r.checks[0].analytic == doctest::Approx(r.checks[0].numeric / 2));
}
