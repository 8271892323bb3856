// The gradchecker over every registered op, and planted bugs that it must catch.
#include <doctest/doctest.h>

#include <set>

#include "engine/gradcheck.hpp"
#include "ops/ops.hpp"

using namespace tapegrad;

namespace {

// The op names recorded on the tape when a case is built.
std::set<std::string> recorded_ops(const GradcheckCase& c) {
  Tape tape;
  auto xs = make_inputs(c.inputs, DType::f64, 1);
  std::vector<Var> vars;
  for (auto& x : xs) vars.push_back(tape.leaf(x, x.dtype() != DType::i32));
  c.build(tape, vars);
  std::set<std::string> names;
  for (size_t i = 0; i < tape.num_nodes(); ++i) names.insert(tape.node(i).op);
  return names;
}

const CheckResult* find_check(const GradcheckReport& r, std::string_view check) {
  for (const auto& c : r.checks)
    if (c.check == check && !c.passed) return &c;
  return nullptr;
}

// y = x² element-wise, recorded with the given VJP and JVP factors: x̄ += vjp_factor·x·ȳ, ẏ += jvp_factor·x·ẋ
// (both right at 2). `overwrite` makes the VJP assign instead of add.
Var planted_square(Var x, double vjp_factor, double jvp_factor, bool overwrite = false) {
  Tape& tape = x.tape();
  Tensor xv = x.value();
  Tensor y = tape.empty(DType::f64, x.shape());
  const int64_t n = y.numel();
  for (int64_t i = 0; i < n; ++i) y.data<double>()[i] = xv.data<double>()[i] * xv.data<double>()[i];
  return tape.record(
      "planted_square", {x}, y,
      [=](const Tensor& g, std::span<const Tensor> gin) {
        for (int64_t i = 0; i < n; ++i) {
          double v = vjp_factor * xv.data<double>()[i] * g.data<double>()[i];
          gin[0].data<double>()[i] = overwrite ? v : gin[0].data<double>()[i] + v;
        }
      },
      [=](std::span<const Tensor> tin, const Tensor& ty) {
        for (int64_t i = 0; i < n; ++i) ty.data<double>()[i] += jvp_factor * xv.data<double>()[i] * tin[0].data<double>()[i];
      });
}

GradcheckCase planted_case(double vjp_factor, double jvp_factor, bool overwrite = false) {
  return {"planted", {{"x", {3, 4}}}, [=](Tape&, std::span<const Var> x) {
            return planted_square(x[0], vjp_factor, jvp_factor, overwrite);
          }};
}

}  // namespace

TEST_CASE("every registered op has a gradcheck case, and each case records that op") {
  const Registry& reg = builtin_registry();
  REQUIRE(reg.ops().size() > 0);
  for (const OpInfo& op : reg.ops()) {
    CAPTURE(op.name);
    CHECK_MESSAGE(!op.cases.empty(), "op '" << op.name << "' is registered without a gradcheck case");
    for (const auto& c : op.cases) {
      CAPTURE(c.name);
      CHECK(recorded_ops(c).count(op.name) == 1);
    }
  }
}

TEST_CASE("every registered case passes the VJP, JVP, adjoint and accumulation checks in float64") {
  int cases = 0;
  for (const OpInfo& op : builtin_registry().ops())
    for (const auto& c : op.cases) {
      GradcheckReport r = gradcheck(c, {}, op.name);
      INFO(r.str());
      CHECK(r.passed());
      CHECK(r.checks.size() >= 4);
      ++cases;
    }
  MESSAGE(cases << " cases checked");
}

TEST_CASE("the fast mode (random projections) passes on correct ops") {
  GradcheckOptions fast;
  fast.full_jacobian_limit = 0;
  for (const char* name : {"mul", "gelu", "div"}) {
    const OpInfo* op = builtin_registry().find(name);
    REQUIRE(op);
    GradcheckReport r = gradcheck(op->cases.back(), fast, name);
    INFO(r.str());
    CHECK(r.passed());
    CHECK(r.checks[0].mode == "fast");
  }
}

TEST_CASE("a correct planted op passes") {
  GradcheckReport r = gradcheck(planted_case(2, 2));
  INFO(r.str());
  CHECK(r.passed());
}

TEST_CASE("a sign slip in the VJP is caught by the VJP and adjoint checks, not blamed on the JVP") {
  for (int64_t limit : {int64_t{40000}, int64_t{0}}) {  // full Jacobian and fast mode
    GradcheckOptions opt;
    opt.full_jacobian_limit = limit;
    GradcheckReport r = gradcheck(planted_case(-2, 2), opt);
    INFO(r.str());
    CHECK_FALSE(r.passed());
    CHECK(find_check(r, "vjp"));
    CHECK(find_check(r, "adjoint"));
    CHECK_FALSE(find_check(r, "jvp"));
  }
}

TEST_CASE("a wrong factor in the JVP is caught by the JVP and adjoint checks, not blamed on the VJP") {
  GradcheckReport r = gradcheck(planted_case(2, 1));
  INFO(r.str());
  CHECK_FALSE(r.passed());
  CHECK(find_check(r, "jvp"));
  CHECK(find_check(r, "adjoint"));
  CHECK_FALSE(find_check(r, "vjp"));
  const CheckResult* jv = find_check(r, "jvp");
  CHECK(jv->max_rel_err == doctest::Approx(0.5).epsilon(1e-6));  // half the true derivative
}

TEST_CASE("a VJP that overwrites the gradient instead of adding to it is caught") {
  GradcheckReport r = gradcheck(planted_case(2, 2, /*overwrite=*/true));
  INFO(r.str());
  CHECK_FALSE(r.passed());
  CHECK(find_check(r, "accumulate"));
  CHECK_FALSE(find_check(r, "vjp"));
}

TEST_CASE("the report names the worst element and the input") {
  GradcheckReport r = gradcheck(planted_case(-2, 2));
  const CheckResult* vj = find_check(r, "vjp");
  REQUIRE(vj);
  CHECK(vj->input == "x");
  CHECK(vj->worst.find("x[") != std::string::npos);
  CHECK(r.str().find("FAIL") != std::string::npos);
}

TEST_CASE("gradcheck refuses float32 inputs") {
  Tensor x = Tensor::zeros(DType::f32, {2});
  std::vector<Tensor> xs{x};
  CHECK_THROWS_AS(gradcheck([](Tape&, std::span<const Var> v) { return exp(v[0]); }, xs, {}), Error);
}
