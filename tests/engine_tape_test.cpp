// The tape: accumulation, no-grad, clearing, forward mode, misuse.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "inspect/allocation_log.hpp"
#include "engine/tape.hpp"
#include "ops/attention/attention.hpp"
#include "ops/ops.hpp"

using namespace tapegrad;

namespace {

// Runs f and checks that it throws a tapegrad::Error whose message contains every one of `parts`.
template <class F>
void check_error(F&& f, std::initializer_list<const char*> parts) {
  try {
    f();
    FAIL("no error thrown");
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const char* p : parts) {
      INFO("message: " << msg);
      CHECK(msg.find(p) != std::string::npos);
    }
  }
}

Tensor vec(std::initializer_list<double> v) { return Tensor::from<double>({static_cast<int64_t>(v.size())}, v); }

}  // namespace

TEST_CASE("a value used twice gets the sum of both gradients") {
  Tape tape;
  Var x = tape.leaf(vec({1, 2, 3}));
  Var y = sum(x * x + x);  // dy/dx = 2x + 1
  tape.backward(y);
  CHECK(x.grad().to_vector() == std::vector<double>{3, 5, 7});
}

TEST_CASE("a parameter's gradient accumulates across steps until the caller zeroes it") {
  Tensor w = vec({0.5, -1});
  Tensor gw = Tensor::zeros(DType::f64, w.shape());
  Tape tape;
  for (int step = 0; step < 2; ++step) {
    Var p = tape.param(w, gw);
    tape.backward(sum(p * p));  // 2w per step
    tape.clear();
  }
  CHECK(gw.to_vector() == std::vector<double>{2, -4});
}

TEST_CASE("inside a no-grad scope nothing is recorded and nothing requires a gradient") {
  Tape tape;
  Var x = tape.leaf(vec({1, 2}));
  size_t before = tape.num_nodes();
  Var y;
  {
    NoGradGuard guard(tape);
    y = exp(x) * x;
  }
  CHECK(tape.num_nodes() == before);
  CHECK_FALSE(y.requires_grad());
  CHECK(y.value().item(0) == doctest::Approx(std::exp(1.0)));
  Var z = sum(x * x);  // recording again after the scope
  CHECK(tape.num_nodes() == before + 2);
  CHECK(z.requires_grad());
}

TEST_CASE("a value from a cleared tape is an error, not a read of freed memory") {
  Tape tape;
  Var x = tape.leaf(vec({1, 2}));
  Var y = exp(x);
  tape.clear();
  check_error([&] { (void)y.value(); }, {"cleared tape"});
  check_error([&] { (void)exp(x); }, {"cleared tape"});
  check_error([&] { tape.backward(y); }, {"cleared tape"});
}

TEST_CASE("backward twice over one recording is an error") {
  Tape tape;
  Var x = tape.leaf(vec({1, 2}));
  Var y = sum(x * x);
  tape.backward(y);
  check_error([&] { tape.backward(y); }, {"backward", "twice"});
}

TEST_CASE("backward of a non-scalar needs a seed of its shape") {
  Tape tape;
  Var x = tape.leaf(vec({1, 2, 3}));
  Var y = exp(x);
  check_error([&] { tape.backward(y); }, {"backward", "(3)", "seed"});
  check_error([&] { tape.backward(y, vec({1, 1})); }, {"backward", "(2)", "(3)"});
  tape.backward(y, vec({1, 0, 2}));
  CHECK(x.grad().item(2) == doctest::Approx(2 * std::exp(3.0)));
}

TEST_CASE("backward of a value that depends on nothing trainable is an error") {
  Tape tape;
  Var x = tape.constant(vec({1, 2}));
  check_error([&] { tape.backward(sum(x)); }, {"backward", "requires a gradient"});
}

TEST_CASE("values from two tapes cannot meet in one op") {
  Tape a, b;
  Var x = a.leaf(vec({1}));
  Var y = b.leaf(vec({2}));
  check_error([&] { (void)add(x, y); }, {"add", "different tapes"});
}

TEST_CASE("mixing dtypes is an error that names the op and both shapes") {
  Tape tape;
  Var x = tape.leaf(Tensor::zeros(DType::f32, {2, 3}));
  Var y = tape.leaf(Tensor::zeros(DType::f64, {2, 3}));
  check_error([&] { (void)mul(x, y); }, {"mul", "float32", "float64", "(2, 3)"});
}

TEST_CASE("shapes that do not broadcast are an error that names the op and the shapes") {
  Tape tape;
  Var x = tape.leaf(Tensor::zeros(DType::f32, {2, 3}));
  Var y = tape.leaf(Tensor::zeros(DType::f32, {4}));
  check_error([&] { (void)add(x, y); }, {"add", "(2, 3)", "(4)", "broadcast"});
}

TEST_CASE("an int32 tensor cannot require a gradient or enter a float op") {
  Tape tape;
  Tensor ids = Tensor::from<int32_t>({2}, {1, 2});
  check_error([&] { (void)tape.leaf(ids, true); }, {"int32"});
  Var c = tape.constant(ids);
  check_error([&] { (void)exp(c); }, {"exp", "int32"});
}

TEST_CASE("an intermediate's gradient is released after its node's VJP unless retained; leaves keep theirs") {
  Tape tape;
  Var x = tape.leaf(vec({1, 2, 3}));
  Var a = x * x;   // intermediate, released
  Var b = exp(x);  // intermediate, retained
  tape.retain_grad(b);
  Var y = sum(a + b);
  tape.backward(y);
  CHECK_FALSE(a.grad().defined());
  CHECK_FALSE(y.grad().defined());
  CHECK(b.grad().to_vector() == std::vector<double>{1, 1, 1});
  const std::vector<double> gx = x.grad().to_vector();  // 2x + eˣ
  for (size_t i = 0; i < 3; ++i) CHECK(gx[i] == doctest::Approx(2.0 * double(i + 1) + std::exp(double(i + 1))));
}

TEST_CASE("backward reuses released gradient buffers: a chain of n equal-sized nodes holds O(1) gradients") {
  // Forward keeps n + 1 values of 64 KiB; backward without reuse would add n + 1 gradients of 64 KiB.
  Tape tape;
  const int64_t n = 32;
  Var x = tape.leaf(Tensor::zeros(DType::f64, {8192}));
  Var h = x;
  for (int64_t i = 0; i < n; ++i) h = tanh(h);
  Var y = sum(h);
  const size_t forward_bytes = tape.arena().bytes_in_use();
  tape.backward(y);
  const size_t backward_bytes = tape.arena().bytes_in_use() - forward_bytes;
  CHECK(backward_bytes <= 4 * 8192 * sizeof(double));
  CHECK(x.grad().to_vector()[0] == 1.0);  // tanh′(0) = 1 through the chain
}

TEST_CASE("a second identical step allocates nothing new: the arena is reused") {
  Tape tape;
  Tensor w = Tensor::zeros(DType::f32, {64, 64});
  Tensor gw = Tensor::zeros(DType::f32, {64, 64});
  auto step = [&] {
    Var p = tape.param(w, gw);
    Var x = tape.constant(Tensor::zeros(DType::f32, {64, 64}));
    tape.backward(sum(tanh(p * x + p)));
    tape.clear();
  };
  step();
  size_t reserved = tape.arena().bytes_reserved();
  for (int i = 0; i < 5; ++i) step();
  CHECK(tape.arena().bytes_reserved() == reserved);
  CHECK(tape.arena().high_water() <= reserved);
}

TEST_CASE("the arena merges the blocks of an outgrown step into one") {
  Tape tape(1024);  // tiny blocks
  auto step = [&] {
    Var x = tape.leaf(Tensor::zeros(DType::f64, {100}));
    for (int i = 0; i < 20; ++i) x = x * x;
    tape.backward(sum(x));
    tape.clear();
  };
  step();
  size_t reserved = tape.arena().bytes_reserved();
  step();
  step();
  CHECK(tape.arena().bytes_reserved() == reserved);
}

TEST_CASE("jvp gives the total derivative dF(x)·ẋ of a composite, as central differences do") {
  Function f = [](Tape&, std::span<const Var> x) { return tanh(x[0] * x[1]) + exp(x[0]); };
  std::vector<Tensor> xs{vec({0.3, -0.7}), vec({1.1, 0.4})};
  std::vector<Tensor> ts{vec({1, 2}), vec({-0.5, 0.25})};
  auto [y, ydot] = jvp(f, xs, ts);
  const double eps = 1e-6;
  for (int64_t i = 0; i < 2; ++i) {
    auto at = [&](double h) {
      double a = xs[0].item(i) + h * ts[0].item(i), b = xs[1].item(i) + h * ts[1].item(i);
      return std::tanh(a * b) + std::exp(a);
    };
    CHECK(y.item(i) == doctest::Approx(at(0)));
    CHECK(ydot.item(i) == doctest::Approx((at(eps) - at(-eps)) / (2 * eps)).epsilon(1e-8));
  }
}

TEST_CASE("vjp and jvp satisfy the adjoint identity on a composite") {
  Function f = [](Tape&, std::span<const Var> x) { return x[0] * x[1] / exp(x[1]); };
  std::vector<Tensor> xs{vec({0.3, -0.7, 2}), vec({1.1, 0.4, -1})};
  std::vector<Tensor> ts{vec({1, 2, 3}), vec({-0.5, 0.25, 1})};
  Tensor u = vec({0.7, -1.3, 0.2});
  auto [y, ydot] = jvp(f, xs, ts);
  auto grads = vjp(f, xs, u);
  double lhs = 0, rhs = 0;
  for (int64_t i = 0; i < 3; ++i) {
    lhs += ydot.item(i) * u.item(i);
    rhs += ts[0].item(i) * grads[0].item(i) + ts[1].item(i) * grads[1].item(i);
  }
  CHECK(lhs == doctest::Approx(rhs).epsilon(1e-12));
}

TEST_CASE("tracked allocations name what each node keeps: its output and the tensors it saved") {
  Tape tape;
  AllocationLog log(tape);
  const Tensor t = Tensor::from<double>({2, 1, 3, 4}, std::vector<double>(24, 0.5));
  Var q = tape.leaf(t), k = tape.leaf(t), v = tape.leaf(t);
  Var o = attention(q, k, v, AttentionOptions{});
  REQUIRE(tape.num_nodes() == 1);
  const auto kept = log.of(0);
  REQUIRE(kept.size() == 2);
  CHECK(std::string(kept[0].what) == "A = softmax(S)");
  CHECK(kept[0].shape == Shape{2, 1, 3, 3});
  CHECK(std::string(kept[1].what) == "output");
  CHECK(kept[1].shape == o.shape());
  size_t bytes = 0;
  for (const auto& a : kept) bytes += a.bytes;
  CHECK(bytes <= tape.node(0).bytes_kept);  // the node's bytes also count the arena's alignment
  CHECK(tape.node(0).bytes_kept < bytes + 2 * 64);
  tape.backward(sum(o));  // gradient buffers are not a node's
  CHECK(log.of(0).size() == 2);
  tape.clear();
  Tape untracked;
  Var x = untracked.leaf(t);
  exp(x);
  AllocationLog late(untracked);  // attached after the node was recorded
  CHECK(late.of(0).empty());
}

TEST_CASE("a value's reference and its shape's stay valid while the tape records more values") {
  Tape tape;
  Var x = tape.leaf(Tensor::from<double>({3}, {1, 2, 3}));
  const Tensor& value = x.value();
  const Shape& shape = x.shape();
  for (int i = 0; i < 2000; ++i) x = scale(x, 1.0);  // thousands of records: storage that moved would dangle
  CHECK(value.to_vector() == std::vector<double>{1, 2, 3});
  CHECK(shape == Shape{3});
  CHECK(tape.num_values() == 2001);
}
