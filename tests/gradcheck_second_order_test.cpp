// Second order: Tape::hvp against central differences of the gradient and the symmetry of the Hessian, for every
// registered case whose ops have a second-order rule; ops without one are refused by name; a planted slip in a
// second-order term fails.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "ops/registry.hpp"
#include "checker/second_order.hpp"
#include "ops/ops.hpp"
#include "ops/pointwise.hpp"

using namespace tapegrad;

TEST_CASE("Hessian-vector products agree with differences of the gradient on every registered case") {
  // Every registered op has a second-order rule: each case runs the check and passes it.
  int checked = 0, refused = 0;
  for (const OpSheet& op : builtin_registry().ops()) {
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
  Var s = sum(pointwise(
      "softsign", x, [](auto v) { return v / (1 + std::abs(v)); },
      [](auto v) { return 1 / ((1 + std::abs(v)) * (1 + std::abs(v))); }));
  const Tensor dirs[] = {Tensor::randn(DType::f64, {2, 3}, 2)};
  const Var wrt[] = {x};
  CHECK_THROWS_WITH_AS(tape.hvp(s, Tensor::from<double>({}, {1.0}), wrt, dirs),
                       doctest::Contains("op 'softsign' has no second-order rule"), Error);
}

namespace {

// y = x² element by element, with the right VJP and JVP and the second-order term ẋ̄ += c·ẋ·ȳ (right: c = 2);
// assign: the term is assigned into ẋ̄ instead of added; vjp_factor: the VJP's 2x becomes vjp_factor·x.
Function square_with_rule(double c, bool assign = false, double vjp_factor = 2) {
  return [=](Tape& tape, std::span<const Var> in) {
    const Var x = in[0];
    const Tensor xv = x.value();
    Tensor y = tape.empty(DType::f64, x.shape());
    for (int64_t k = 0; k < y.numel(); ++k) y.data<double>()[k] = xv.item(k) * xv.item(k);
    return tape.record(
        "square_slipped", {x}, y,
        [xv, vjp_factor](const Tensor& g, std::span<Tensor> gin) {
          for (int64_t k = 0; k < g.numel(); ++k) gin[0].data<double>()[k] += vjp_factor * xv.item(k) * g.item(k);
        },
        [xv](std::span<const Tensor> tin, Tensor& ty) {
          for (int64_t k = 0; k < ty.numel(); ++k) ty.data<double>()[k] += 2 * xv.item(k) * tin[0].item(k);
        },
        [c, assign](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
          for (int64_t k = 0; k < g.numel(); ++k) {
            double& o = gin_dot[0].data<double>()[k];
            o = (assign ? 0 : o) + c * tin[0].item(k) * g.item(k);
          }
        });
  };
}

// y = a ⊙ b with the cross term of b̄ along ȧ dropped (ā̇ += ȳ·ḃ is kept).
Var mul_without_b_cross_term(Tape& tape, std::span<const Var> in) {
  const Var a = in[0], b = in[1];
  const Tensor av = a.value(), bv = b.value();
  Tensor y = tape.empty(DType::f64, a.shape());
  for (int64_t k = 0; k < y.numel(); ++k) y.data<double>()[k] = av.item(k) * bv.item(k);
  return tape.record(
      "mul_slipped", {a, b}, y,
      [av, bv](const Tensor& g, std::span<Tensor> gin) {
        for (int64_t k = 0; k < g.numel(); ++k) {
          if (gin[0].defined()) gin[0].data<double>()[k] += g.item(k) * bv.item(k);
          if (gin[1].defined()) gin[1].data<double>()[k] += g.item(k) * av.item(k);
        }
      },
      [av, bv](std::span<const Tensor> tin, Tensor& ty) {  // undefined tangents are zero
        for (int64_t k = 0; k < ty.numel(); ++k)
          ty.data<double>()[k] += (tin[0].defined() ? tin[0].item(k) * bv.item(k) : 0) +
                                  (tin[1].defined() ? av.item(k) * tin[1].item(k) : 0);
      },
      [](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
        for (int64_t k = 0; k < g.numel(); ++k) gin_dot[0].data<double>()[k] += g.item(k) * tin[1].item(k);
      });
}

// softmax of each row with its second-order rule missing the term −⟨ẏ, ȳ⟩·y.
Var softmax_without_row_term(Tape& tape, std::span<const Var> in) {
  const Var x = in[0];
  const int64_t n = x.shape().back(), rows = x.shape().numel() / n;
  const Tensor xv = x.value();
  Tensor y = tape.empty(DType::f64, x.shape());
  for (int64_t r = 0; r < rows; ++r) {
    double z = 0;
    for (int64_t j = 0; j < n; ++j) z += std::exp(xv.item(r * n + j));
    for (int64_t j = 0; j < n; ++j) y.data<double>()[r * n + j] = std::exp(xv.item(r * n + j)) / z;
  }
  auto row_dot = [n](const Tensor& p, const Tensor& q, int64_t r) {
    double s = 0;
    for (int64_t j = 0; j < n; ++j) s += p.item(r * n + j) * q.item(r * n + j);
    return s;
  };
  // out += y ⊙ (u − ⟨y, u⟩) per row: the VJP and the JVP (the Jacobian is symmetric)
  auto apply = [=](const Tensor& yv, const Tensor& u, Tensor& out) {
    for (int64_t r = 0; r < rows; ++r) {
      const double s = row_dot(yv, u, r);
      for (int64_t j = 0; j < n; ++j) out.data<double>()[r * n + j] += yv.item(r * n + j) * (u.item(r * n + j) - s);
    }
  };
  return tape.record(
      "softmax_slipped", {x}, y, [=](const Tensor& g, std::span<Tensor> gin) { apply(y, g, gin[0]); },
      [=](std::span<const Tensor> tin, Tensor& ty) { apply(y, tin[0], ty); },
      [=](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
        Tensor ydot = Tensor::zeros(DType::f64, y.shape());
        apply(y, tin[0], ydot);
        for (int64_t r = 0; r < rows; ++r) {
          const double s = row_dot(y, g, r);
          for (int64_t j = 0; j < n; ++j)
            gin_dot[0].data<double>()[r * n + j] += ydot.item(r * n + j) * (g.item(r * n + j) - s);
        }
      });
}

GradcheckReport check_one(const Function& f, std::initializer_list<Tensor> x,
                          std::initializer_list<std::string> names) {
  const std::vector<Tensor> xs(x);
  const std::vector<std::string> ns(names);
  return gradcheck_second_order(f, xs, ns);
}

}  // namespace

TEST_CASE("a slip in a second-order term fails the hvp check") {
  // y = x², recorded with the right VJP and JVP and a second-order term that forgets its factor 2.
  const Tensor x = Tensor::randn(DType::f64, {3, 4}, 5);
  const std::string names[] = {"x"};
  const GradcheckReport r = gradcheck_second_order(square_with_rule(1), std::span<const Tensor>(&x, 1), names);
  CHECK_FALSE(r.passed());
  REQUIRE(r.checks.size() == 3);  // hvp, symmetry, accumulate
  CHECK(r.checks[0].check == "hvp");
  CHECK_FALSE(r.checks[0].passed);
  CHECK(r.checks[0].analytic == doctest::Approx(r.checks[0].numeric / 2));
  // The hvp row compares the rule with central differences; symmetry and accumulate compare two analytic values.
  CHECK(r.checks[0].analytic_is == "analytic");
  CHECK(r.checks[0].numeric_is == "numeric");
  CHECK(r.checks[1].analytic_is == "⟨w, H v⟩");
  CHECK(r.checks[1].numeric_is == "⟨v, H w⟩");
  CHECK(r.checks[2].analytic_is == "(H t) of f + f");
  CHECK(r.checks[2].numeric_is == "2·(H t)");
}

TEST_CASE("second-order slips are named as first-order ones are") {
  const Tensor x = Tensor::randn(DType::f64, {3, 4}, 5);
  SUBCASE("a missing factor: scale") {
    const GradcheckReport r = check_one(square_with_rule(1), {x}, {"x"});
    CHECK_FALSE(r.passed());
    CHECK_MESSAGE(r.has(Finding::scale), r.str());
    CHECK_MESSAGE(r.find(Finding::scale)->message.find("= 1/2") != std::string::npos, r.str());
  }
  SUBCASE("a wrong sign") {
    const GradcheckReport r = check_one(square_with_rule(-2), {x}, {"x"});
    CHECK_MESSAGE(r.has(Finding::sign), r.str());
  }
  SUBCASE("no term at all: an op recorded as if its VJP did not move") {
    const GradcheckReport r = check_one(square_with_rule(0), {x}, {"x"});
    CHECK_MESSAGE(r.has(Finding::zero), r.str());
    CHECK(r.find(Finding::zero)->message.find("second-order term is missing") != std::string::npos);
  }
  SUBCASE("a term assigned instead of added") {
    const GradcheckReport r = check_one(square_with_rule(2, /*assign=*/true), {x}, {"x"});
    CHECK_FALSE(r.passed());
    CHECK(r.checks[0].passed);  // alone, the assignment is invisible
    CHECK_MESSAGE(r.has(Finding::overwrites), r.str());
  }
  SUBCASE("a wrong VJP: the first order is named first") {
    const GradcheckReport r = check_one(square_with_rule(2, false, 3), {x}, {"x"});
    CHECK_MESSAGE(r.has(Finding::first_order), r.str());
    CHECK_FALSE(r.has(Finding::scale));
  }
  SUBCASE("a dropped cross term: the Hessian block, and H no longer symmetric") {
    const Tensor b = Tensor::randn(DType::f64, {3, 4}, 6);
    const GradcheckReport r = check_one(mul_without_b_cross_term, {x, b}, {"a", "b"});
    CHECK_FALSE(r.passed());
    REQUIRE_MESSAGE(r.has(Finding::hessian_block), r.str());
    const std::string& blocks = r.find(Finding::hessian_block)->message;
    CHECK(blocks.find("the errors sit in ∂b\u0304/∂a; ") != std::string::npos);  // b̄ as b + combining macron
    CHECK(blocks.find("only cross terms are wrong") != std::string::npos);
    CHECK(r.has(Finding::asymmetric));
    CHECK_MESSAGE(r.has(Finding::zero, "∂b\u0304/∂a"), r.str());
  }
  SUBCASE("a dropped cross term on inputs too large for whole blocks: the block from sampled columns") {
    const Tensor a = Tensor::randn(DType::f64, {15, 16}, 8), b = Tensor::randn(DType::f64, {15, 16}, 9);
    const GradcheckReport r = check_one(mul_without_b_cross_term, {a, b}, {"a", "b"});  // 480 elements
    CHECK_FALSE(r.passed());
    REQUIRE_MESSAGE(r.has(Finding::hessian_block), r.str());
    const std::string& blocks = r.find(Finding::hessian_block)->message;
    CHECK(blocks.find("the errors sit in ∂b̄/∂a; ") != std::string::npos);
    CHECK(blocks.find("from at most 12 columns of each block: the inputs have 480 elements") != std::string::npos);
    CHECK(r.has(Finding::asymmetric));
    CHECK_FALSE(r.has(Finding::zero));  // no block is diagnosed whole
  }
  SUBCASE("a dropped per-row term") {
    const GradcheckReport r = check_one(softmax_without_row_term, {Tensor::randn(DType::f64, {3, 5}, 7)}, {"x"});
    CHECK_FALSE(r.passed());
    CHECK_MESSAGE(r.has(Finding::per_row_term), r.str());
  }
}
