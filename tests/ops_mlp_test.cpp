// The fused MLP against linear → gelu → linear: values, gradients and tangents; float32 and float64; errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

void check_against_composition(bool biases, GeluForm form, DType dtype, double tolerance) {
  std::vector<InputSpec> spec{{"x", {3, 20, 16}}, {"w1", {64, 16}}, {"w2", {16, 64}}};
  if (biases) {
    spec.push_back({"b1", {64}});
    spec.push_back({"b2", {16}});
  }
  Function fused = [biases, form](Tape&, std::span<const Var> v) {
    return mlp(v[0], v[1], biases ? v[3] : Var{}, v[2], biases ? v[4] : Var{}, form);
  };
  Function composed = [biases, form](Tape&, std::span<const Var> v) {
    const Var u = linear(v[0], v[1], biases ? v[3] : Var{});
    return linear(form == GeluForm::exact ? gelu_erf(u) : gelu(u), v[2], biases ? v[4] : Var{});
  };
  auto x = make_inputs(spec, dtype, 11);
  CHECK(max_relative_difference(evaluate(fused, x), evaluate(composed, x)) < tolerance);
  Tensor g = make_inputs(std::vector<InputSpec>{{"g", {3, 20, 16}}}, dtype, 12)[0];
  auto gf = vjp(fused, x, g), gc = vjp(composed, x, g);
  for (size_t i = 0; i < gf.size(); ++i) {
    CAPTURE(spec[i].name);
    CHECK(max_relative_difference(gf[i], gc[i]) < tolerance);
  }
  auto t = make_inputs(spec, dtype, 13);
  CHECK(max_relative_difference(jvp(fused, x, t).second, jvp(composed, x, t).second) < tolerance);
}

}  // namespace

TEST_CASE("mlp equals linear, gelu, linear in either form: forward, VJP and JVP") {
  for (GeluForm form : {GeluForm::exact, GeluForm::tanh})
    for (bool biases : {true, false}) {
      CAPTURE(gelu_form_name(form));
      CAPTURE(biases);
      check_against_composition(biases, form, DType::f64, 1e-12);
      check_against_composition(biases, form, DType::f32, 2e-5);
    }
}

TEST_CASE("mlp: shape errors name the op and the shapes") {
  Tape tape;
  Var x = tape.leaf(Tensor::zeros(DType::f32, {4, 8}));
  Var w1 = tape.leaf(Tensor::zeros(DType::f32, {32, 8})), w2 = tape.leaf(Tensor::zeros(DType::f32, {8, 32}));
  CHECK_THROWS_WITH(mlp(x, tape.leaf(Tensor::zeros(DType::f32, {32, 7})), {}, w2, {}, GeluForm::exact),
                    doctest::Contains("mlp: the first weight must be (H, 8) for an input of shape (4, 8), got (32, 7)"));
  CHECK_THROWS_WITH(mlp(x, w1, {}, tape.leaf(Tensor::zeros(DType::f32, {8, 31})), {}, GeluForm::exact),
                    doctest::Contains("mlp: the second weight must be (H, 32)"));
  CHECK_THROWS_WITH(mlp(x, w1, tape.leaf(Tensor::zeros(DType::f32, {31})), w2, {}, GeluForm::exact),
                    doctest::Contains("mlp: the first bias must be (32) for a weight of shape (32, 8), got (31)"));
  CHECK_THROWS_WITH(mlp(x, w1, {}, w2, tape.leaf(Tensor::zeros(DType::f64, {8})), GeluForm::exact), doctest::Contains("mlp"));
}
