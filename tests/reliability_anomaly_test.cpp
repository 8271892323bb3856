// Numerical guards on the tape: anomaly detection (off by default) stops at the first NaN or ±∞ a node produces,
// naming the node's op and the shapes, in the forward, the backward and forward mode; and the stable kernels
// stay finite at logits of ±1e4 with anomaly detection on.
//
// The values of softmax, log_softmax and cross_entropy at ±1e4 are checked against the shifted logits in
// tests/ops_softmax_test.cpp ("logits of ±1e4 give finite results equal to the shifted ones") and
// tests/ops_cross_entropy_test.cpp ("logits of ±1e4 give a finite loss and the analytic gradient"); here every
// node output and every gradient of those ops, and of attention whose scores reach ±1e4, must pass the guard.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "inspect/anomaly.hpp"
#include "engine/tape.hpp"
#include "ops/attention/attention.hpp"
#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

Tensor filled(DType dtype, Shape s, std::initializer_list<double> v) {
  return Tensor::from<double>(s, std::span<const double>(v.begin(), v.size())).to(dtype);
}

}  // namespace

TEST_CASE("anomaly detection is off by default: a NaN passes silently") {
  Tape tape;
  CHECK(tape.observers().empty());
  Var x = tape.leaf(filled(DType::f64, {2}, {1, -1}));
  Var y = log(x);  // log(−1) = NaN, recorded without complaint
  CHECK(std::isnan(y.value().item(1)));
  CHECK_NOTHROW(tape.backward(sum(y)));
}

TEST_CASE_TEMPLATE("the forward stops at the first non-finite output, naming its op and the shapes", T, float, double) {
  const DType dt = dtype_of<T>();
  Tape tape;
  AnomalyCheck check(tape);
  Var x = tape.leaf(filled(dt, {2, 3}, {1, 2, 3, 4, 0, 6}));
  Var w = tape.leaf(filled(dt, {3}, {1, 1, 1}));
  Var h = x * w;  // finite
  const std::string msg = error_of([&] { (void)exp(log(h) * 2.0); });
  INFO(msg);
  // log(0) = −∞ comes from log, not from the scale or exp after it.
  CHECK(msg.rfind("non-finite value from log:", 0) == 0);
  CHECK(msg.find(fmt::format("{} (2, 3)", dtype_name(dt))) != std::string::npos);
  CHECK(msg.find("-inf") != std::string::npos);
  CHECK(msg.find("at (1, 1)") != std::string::npos);  // element 4 of (2, 3)
  CHECK(msg.find('\n') == std::string::npos);
}

TEST_CASE_TEMPLATE("the backward stops at the first VJP that makes a gradient non-finite", T, float, double) {
  const DType dt = dtype_of<T>();
  // log(x) at a subnormal x is finite (≈ −737 or −92) but its derivative 1/x overflows to +∞.
  const double tiny = std::is_same_v<T, float> ? 1e-40 : 1e-320;
  Tape tape;
  AnomalyCheck check(tape);
  Var x = tape.leaf(filled(dt, {3}, {1, tiny, 2}));
  Var y = sum(log(x) * tape.constant(filled(dt, {3}, {1, 1, 1})));
  CHECK(std::isfinite(y.value().item()));
  const std::string msg = error_of([&] { tape.backward(y); });
  INFO(msg);
  CHECK(msg.rfind("non-finite value from log (backward):", 0) == 0);
  CHECK(msg.find(fmt::format("input 0 {} (3)", dtype_name(dt))) != std::string::npos);
  CHECK(msg.find("inf at (1)") != std::string::npos);
}

TEST_CASE("forward mode stops at the first JVP with a non-finite tangent") {
  Tape tape;
  AnomalyCheck check(tape);
  Var x = tape.leaf(filled(DType::f64, {2}, {1e-320, 1}));
  Var y = log(x);
  tape.set_tangent(x, filled(DType::f64, {2}, {1, 1}));
  const std::string msg = error_of([&] { tape.propagate_tangents(); });
  INFO(msg);
  CHECK(msg.rfind("non-finite value from log (forward mode):", 0) == 0);
  CHECK(msg.find("(2)") != std::string::npos);
  (void)y;
}

TEST_CASE("a leaf or a seed that already holds a NaN is reported as such") {
  Tape tape;
  AnomalyCheck check(tape);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::string msg = error_of([&] { (void)tape.leaf(filled(DType::f64, {2, 2}, {0, 1, nan, 3})); });
  CHECK(msg.find("non-finite value in a leaf") != std::string::npos);
  CHECK(msg.find("float64 (2, 2) holds nan at (1, 0)") != std::string::npos);
  Var x = tape.leaf(filled(DType::f64, {2}, {1, 2}));
  msg = error_of([&] { tape.backward(exp(x), filled(DType::f64, {2}, {1, nan})); });
  CHECK(msg.find("backward: the seed gradient float64 (2) holds nan at (1)") != std::string::npos);
}

TEST_CASE("inside a no-grad scope outputs are still checked") {
  Tape tape;
  AnomalyCheck check(tape);
  Var table = tape.leaf(filled(DType::f64, {8, 1}, {0, 1, 2, 3, 4, 5, 6, 7}));
  NoGradGuard no_grad(tape);
  CHECK_NOTHROW((void)embedding(tape.constant(Tensor::from<int32_t>({1}, {7})), table));
  const std::string msg = error_of([&] { (void)div(table, table); });  // 0/0 in row 0
  CHECK(msg.rfind("non-finite value from div:", 0) == 0);
}

TEST_CASE_TEMPLATE("softmax, log_softmax, cross_entropy and attention stay finite at logits of ±1e4", T, float,
                   double) {
  const DType dt = dtype_of<T>();
  Tape tape;
  AnomalyCheck check(tape);
  // Rows with spreads of 2e4, a row shifted far up, a row shifted far down, and a row of equal logits.
  Var logits = tape.leaf(filled(dt, {4, 3}, {1e4, -1e4, 0, 1e4, 1e4 - 1, 1e4 - 3, -1e4, -1e4 + 2, -1e4 + 5, 5, 5, 5}));
  Var targets = tape.constant(Tensor::from<int32_t>({4}, {1, 0, 2, 1}));
  Var loss = cross_entropy(logits, targets) + sum(softmax(logits) * log_softmax(logits)) * 1e-3;
  REQUIRE(std::isfinite(loss.value().item()));
  CHECK_NOTHROW(tape.backward(loss));
  CHECK(all_finite(logits.grad()));

  // Attention scores s·q·k of ±1e4: q = ±100, k = ±100·√d, s = 1/√d.
  Tape att;
  AnomalyCheck att_check(att);
  const double k0 = 100 * std::sqrt(2.0);
  Var q = att.leaf(filled(dt, {1, 1, 3, 2}, {100, 0, -100, 0, 0, 100}));
  Var k = att.leaf(filled(dt, {1, 1, 3, 2}, {k0, 0, -k0, 0, 0, -k0}));
  Var v = att.leaf(filled(dt, {1, 1, 3, 2}, {1, 2, 3, 4, 5, 6}));
  AttentionOptions causal;
  causal.causal = true;
  Var o = attention(q, k, v) + tiled_attention(q, k, v, causal, {}, 2) + attention(q, k, v, causal);
  CHECK(all_finite(o.value()));
  CHECK_NOTHROW(att.backward(sum(o)));
  for (Var p : {q, k, v}) CHECK(all_finite(p.grad()));
}
