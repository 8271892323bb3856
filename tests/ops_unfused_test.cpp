// A fused op's unfused form (OpSheet::unfused, and a case's own GradcheckCase::unfused, drawn by `tapegrad graph
// --unfused`) is the same map: on the op's first gradcheck case, and on every case that gives its own, in float64,
// its value and the gradient of every differentiable input for a random seed gradient equal the fused op's to 1e-12
// relative, and it records none of the op itself, only ops with sheets.
#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>

#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;

namespace {

struct Run {
  Tensor out;
  std::vector<Tensor> grads;  // per input; undefined for one that is not differentiable
  std::set<std::string> ops;  // the ops recorded
};

Run run(const Function& f, const GradcheckCase& c, const std::vector<Tensor>& xs, uint64_t seed) {
  Tape tape;
  std::vector<Var> vars;
  for (size_t i = 0; i < xs.size(); ++i) vars.push_back(tape.leaf(xs[i], c.inputs[i].differentiable()));
  const Var y = f(tape, vars);
  Run r{y.value().clone(), {}, {}};
  tape.backward(y, testing::draw_like(y.shape(), y.dtype(), seed));
  for (const Var& v : vars) r.grads.push_back(v.requires_grad() ? v.grad().clone() : Tensor{});
  for (size_t k = 0; k < tape.num_nodes(); ++k) r.ops.insert(tape.node(k).op);
  return r;
}

}  // namespace

namespace {

void check_same_map(const OpSheet& op, const GradcheckCase& c, const Function& form) {
  CAPTURE(op.name);
  CAPTURE(c.name);
  const std::vector<Tensor> xs = make_inputs(c.inputs, DType::f64, 11);
  const Run fused = run(c.build, c, xs, 12), unfused = run(form, c, xs, 12);
  CHECK(fused.ops.count(op.name) == 1);
  CHECK(unfused.ops.count(op.name) == 0);
  CHECK(unfused.ops.size() >= 2);
  for (const std::string& name : unfused.ops) CHECK_MESSAGE(builtin_registry().find(name) != nullptr, name);
  CHECK(testing::max_relative_difference(unfused.out, fused.out) <= 1e-12);
  for (size_t i = 0; i < xs.size(); ++i) {
    CAPTURE(c.inputs[i].name);
    CHECK(c.inputs[i].differentiable() == fused.grads[i].defined());
    CHECK(testing::max_relative_difference(unfused.grads[i], fused.grads[i]) <= 1e-12);
  }
}

}  // namespace

TEST_CASE("OpSheet::unfused: the same map as the fused op, value and gradient, on its first case in float64") {
  std::set<std::string> with;
  for (const OpSheet& op : builtin_registry().ops()) {
    if (!op.unfused) continue;
    with.insert(op.name);
    REQUIRE(!op.cases.empty());
    check_same_map(op, op.cases.front(), op.unfused);
  }
  // The fused ops that have a primitive form (docs/graph.md lists them).
  CHECK(with == std::set<std::string>{"attention", "attention_qkv", "beta_attention", "cross_entropy", "layer_norm",
                                      "linear", "linear_attention", "mlp", "mse_loss", "tiled_attention"});
}

TEST_CASE("GradcheckCase::unfused: every case of attention and tiled_attention, causal and with a bias, is drawn") {
  int cases = 0;
  for (const char* name : {"attention", "tiled_attention"}) {
    const OpSheet& op = *builtin_registry().find(name);
    for (const GradcheckCase& c : op.cases) {
      REQUIRE_MESSAGE(c.unfused, c.name);
      check_same_map(op, c, c.unfused);
      ++cases;
    }
  }
  CHECK(cases >= 26);
  for (const OpSheet& op : builtin_registry().ops())  // a case's own form is for a fused op, drawn by --unfused
    for (const GradcheckCase& c : op.cases) CHECK_MESSAGE((!c.unfused || op.unfused), op.name << " / " << c.name);
}
