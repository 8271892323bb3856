// <tapegrad/tapegrad.hpp> as a project that links tapegrad includes it: every public header in one translation
// unit, found through the build's include folder (<build>/include/tapegrad), not through the source tree.
#include <doctest/doctest.h>

#include <cmath>

#include <tapegrad/tapegrad.hpp>

using namespace tapegrad;

TEST_CASE("the umbrella header gives the engine, the ops, pointwise and the gradchecker") {
  // y = 2x + 1 fitted by a one-weight model w·x + b under mse_loss, from a seeded start.
  const Tensor x = Tensor::uniform(DType::f64, {16, 1}, 3, -1.0, 1.0);
  Tensor target = Tensor::empty(DType::f64, {16, 1});
  for (int64_t i = 0; i < 16; ++i) target.data<double>()[i] = 2 * x.item(i) + 1;
  Tensor w = Tensor::randn(DType::f64, {1, 1}, 4), b = Tensor::zeros(DType::f64, {1});
  double first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    Tape tape;
    Tensor gw = Tensor::zeros(DType::f64, {1, 1}), gb = Tensor::zeros(DType::f64, {1});
    Var loss = mse_loss(linear(tape.constant(x), tape.param(w, gw), tape.param(b, gb)), tape.constant(target));
    tape.backward(loss);
    (step == 0 ? first : last) = loss.value().item();
    w.data<double>()[0] -= 0.5 * gw.item(0);
    b.data<double>()[0] -= 0.5 * gb.item(0);
  }
  CHECK(last < 1e-6 * first);
  CHECK(w.item(0) == doctest::Approx(2).epsilon(1e-3));
  CHECK(b.item(0) == doctest::Approx(1).epsilon(1e-3));

  Function softplus = [](Tape&, std::span<const Var> v) {
    return pointwise(
        "softplus", v[0], [](auto s) { return std::log1p(std::exp(s)); },
        [](auto s) { return 1 / (1 + std::exp(-s)); });
  };
  CHECK(gradcheck(softplus, {Tensor::randn(DType::f64, {3, 4}, 5)}, {"x"}).passed);
}
