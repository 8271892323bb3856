// The checker never says "passed" for a check it did not make: a report passes only when something was compared and
// every error is finite and within tolerance. Options that cannot make a check are refused by name, in the library
// as on the command line.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include "checker/gradcheck.hpp"
#include "checker/second_order.hpp"
#include "engine/no_jvp.hpp"
#include "ops/ops.hpp"
#include "ops/pointwise.hpp"
#include "reliability_util.hpp"
#include "test_util.hpp"
#include "training_test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

Var exp_of(Tape&, std::span<const Var> x) { return exp(x[0]); }

// x ↦ x² with its derivative claimed as factor·x (2 is right), for the VJP and the JVP alike.
Function square_with_vjp(double factor) {
  return [factor](Tape&, std::span<const Var> x) {
    return pointwise(
        "square", x[0], [](auto v) { return v * v; }, [factor](auto v) { return factor * v; });
  };
}

// y = x² (element-wise, or summed to a scalar) with a VJP that uses ȳ as `use` says, and no forward-mode rule (as a
// torch Function without jvp: the adjoint identity cannot catch it then).
enum class UseOfCotangent { times, ignored, squared };
Function square_using(UseOfCotangent use, bool scalar) {
  return [use, scalar](Tape& tape, std::span<const Var> x) {
    const Tensor xv = x[0].value();
    Tensor y = tape.empty(DType::f64, scalar ? Shape{} : x[0].shape());
    for (int64_t k = 0; k < y.numel(); ++k) y.data<double>()[k] = 0;
    for (int64_t k = 0; k < xv.numel(); ++k) y.data<double>()[scalar ? 0 : k] += xv.item(k) * xv.item(k);
    return tape.record(
        "square", {x[0]}, y,
        [=](const Tensor& g, std::span<Tensor> gin) {
          for (int64_t k = 0; k < xv.numel(); ++k) {
            const double gk = g.item(scalar ? 0 : k);
            const double factor = use == UseOfCotangent::times ? gk : use == UseOfCotangent::ignored ? 1 : gk * gk;
            gin[0].data<double>()[k] += 2 * xv.item(k) * factor;
          }
        },
        no_jvp("square"));
  };
}

}  // namespace

TEST_CASE("a backward that ignores ȳ or squares it fails and is named, on a scalar output too") {
  for (bool scalar : {true, false}) {
    CAPTURE(scalar);
    const Tensor x = Tensor::randn(DType::f64, {3, 4}, 7);
    CHECK(gradcheck(square_using(UseOfCotangent::times, scalar), {x}, {"x"}).passed);
    const GradcheckReport ignored = gradcheck(square_using(UseOfCotangent::ignored, scalar), {x}, {"x"});
    CHECK_FALSE(ignored.passed);
    CHECK_MESSAGE(ignored.has(Finding::ignores_cotangent, "x"), ignored.str());
    // A scalar's one unit ȳ = 1 passes: the random ȳ is what fails it.
    if (scalar) {
      CHECK(ignored.str().find("random ȳ, x[") != std::string::npos);
      const Diagnosis* d = ignored.find(Finding::ignores_cotangent, "x");
      REQUIRE(d);
      CHECK_MESSAGE(quoted_in_doc("gradchecking.md", d->str()), d->str());
    }
    if (!scalar) {  // with one output element, ȳ² is a scalar's square: a nonlinear VJP all the same
      const GradcheckReport squared = gradcheck(square_using(UseOfCotangent::squared, scalar), {x}, {"x"});
      CHECK_FALSE(squared.passed);
      CHECK_MESSAGE(squared.has(Finding::nonlinear, "x"), squared.str());
    }
  }
}

TEST_CASE("an infinite finite difference fails the check instead of passing it (eps = 1e300)") {
  GradcheckOptions opt;
  opt.eps = 1e300;  // exp(x + 1e300) = ∞: every difference quotient is ∞, and ∞ ≤ atol + rtol·∞ held before
  const GradcheckReport r = gradcheck(exp_of, {Tensor::randn(DType::f64, {2, 3}, 1)}, {"x"}, opt);
  CHECK_FALSE(r.passed);
  CHECK(r.str().find("passed") == std::string::npos);
  for (const auto& c : r.checks)
    if (c.check == "vjp" || c.check == "jvp") CHECK_FALSE(c.passed);
}

TEST_CASE("a non-finite analytic derivative fails, whatever the differences say") {
  Function inf_vjp = [](Tape&, std::span<const Var> x) {
    return pointwise(
        "infinite", x[0], [](auto v) { return v; }, [](auto) { return std::numeric_limits<double>::infinity(); });
  };
  const GradcheckReport r = gradcheck(inf_vjp, {Tensor::randn(DType::f64, {3}, 2)}, {"x"});
  CHECK_FALSE(r.passed);
}

TEST_CASE("an input with no elements compares nothing, and the report says so instead of passing") {
  for (Shape shape : {Shape{0, 4}, Shape{3, 0}}) {
    CAPTURE(shape[0]);
    const GradcheckReport r = gradcheck(square_with_vjp(5), {Tensor::zeros(DType::f64, shape)}, {"x"});
    CHECK_FALSE(r.passed);
    bool named = false;
    for (const auto& c : r.checks) named = named || c.worst.find("nothing compared: x has no elements") == 0;
    CHECK_MESSAGE(named, r.str());
    CHECK(r.str().find(": passed") == std::string::npos);
  }
}

TEST_CASE("a report whose every check was skipped is not checked, never passed") {
  // pointwise() from f and f′ alone has no second-order rule: the hvp check of every input is skipped.
  Function softsign = [](Tape&, std::span<const Var> x) {
    return pointwise(
        "softsign", x[0], [](auto v) { return v / (1 + std::abs(v)); },
        [](auto v) { return 1 / ((1 + std::abs(v)) * (1 + std::abs(v))); });
  };
  const Tensor x = Tensor::randn(DType::f64, {2, 3}, 3);
  const std::string name = "x";
  const GradcheckReport r =
      gradcheck_second_order(softsign, std::span<const Tensor>(&x, 1), std::span<const std::string>(&name, 1));
  REQUIRE_FALSE(r.checks.empty());
  for (const auto& c : r.checks) CHECK(c.skipped);
  CHECK_FALSE(r.passed);
  CHECK(r.passed.not_checked.find("every check was skipped") == 0);
  CHECK_MESSAGE(r.str().find("NOT CHECKED: every check was skipped (hvp: op 'softsign' has no second-order rule") !=
                    std::string::npos,
                r.str());
}

TEST_CASE("options that cannot make a check are refused by name") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  struct Bad {
    GradcheckOptions opt;
    const char* expect;
  };
  auto with = [](auto set) {
    GradcheckOptions o;
    set(o);
    return o;
  };
  const Bad cases[] = {
      {with([](auto& o) { o.eps = 0; }), "eps must be finite and > 0, got 0"},
      {with([](auto& o) { o.eps = -1; }), "eps must be finite and > 0, got -1"},
      {with([&](auto& o) { o.eps = nan; }), "eps must be finite and > 0, got nan"},
      {with([&](auto& o) { o.eps = inf; }), "eps must be finite and > 0, got inf"},
      {with([](auto& o) { o.atol = -1; }), "atol must be finite and ≥ 0, got -1"},
      {with([&](auto& o) { o.atol = nan; }), "atol must be finite and ≥ 0, got nan"},
      {with([&](auto& o) { o.rtol = nan; }), "rtol must be finite and ≥ 0, got nan"},
      {with([&](auto& o) { o.rtol = inf; }), "rtol must be finite and ≥ 0, got inf"},
      {with([](auto& o) { o.projections = 0; }), "projections must be at least 1, got 0"},
      {with([](auto& o) { o.projections = -1; }), "projections must be at least 1, got -1"},
      {with([](auto& o) { o.full_jacobian_limit = -1; }), "full_jacobian_limit must not be negative, got -1"},
  };
  const Tensor x = Tensor::randn(DType::f64, {3}, 4);
  for (const Bad& b : cases) {
    CAPTURE(b.expect);
    CHECK_THROWS_WITH_AS(gradcheck(square_with_vjp(5), {x}, {"x"}, b.opt), doctest::Contains(b.expect), Error);
    CHECK_THROWS_WITH_AS(gradcheck_second_order(square_with_vjp(5), std::span<const Tensor>(&x, 1), {}, b.opt),
                         doctest::Contains(b.expect), Error);
  }
}

TEST_CASE("the fast mode with one projection still fails a VJP that is 5 times too large") {
  GradcheckOptions opt;
  opt.full_jacobian_limit = 0;
  opt.projections = 1;
  CHECK_FALSE(gradcheck(square_with_vjp(10), {Tensor::randn(DType::f64, {4, 5}, 5)}, {"x"}, opt).passed);
}

TEST_CASE("the command line: an empty claim input and eps = 1e300 fail, never pass") {
  ScratchDir dir;
  // d/dx Σ x² claimed as 3x: wrong, but on an input with no elements nothing can show it.
  const CliRun empty =
      run_cli(dir.path.string(), {"claim", "--forward", "sum(x * x)", "--vjp", "x = 3 * x * g", "--input", "x:0,4"});
  CHECK_MESSAGE(empty.code != 0, empty.out);
  CHECK_MESSAGE(empty.out.find("holds") == std::string::npos, empty.out);
  CHECK_MESSAGE(empty.out.find("nothing compared") != std::string::npos, empty.out);
  const CliRun huge_eps = run_cli(dir.path.string(), {"gradcheck", "--op", "exp", "--eps", "1e300"});
  CHECK_MESSAGE(huge_eps.code == 1, huge_eps.out);
  CHECK_MESSAGE(huge_eps.out.find("0 passed") != std::string::npos, huge_eps.out);
}
