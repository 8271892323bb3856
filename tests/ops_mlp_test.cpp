// The fused MLP against linear → gelu → linear: values, gradients and tangents; float32 and float64; errors; its
// fused gelu passes against the passes they replace.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/parallel.hpp"
#include "ops/common.hpp"
#include "ops/gelu.hpp"
#include "ops/ops.hpp"
#include "ops/products/blas.hpp"
#include "ops/products/products.hpp"
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
  CHECK_THROWS_WITH(
      mlp(x, tape.leaf(Tensor::zeros(DType::f32, {32, 7})), {}, w2, {}, GeluForm::exact),
      doctest::Contains("mlp: the first weight must be (H, 8) for an input of shape (4, 8), got (32, 7)"));
  CHECK_THROWS_WITH(mlp(x, w1, {}, tape.leaf(Tensor::zeros(DType::f32, {8, 31})), {}, GeluForm::exact),
                    doctest::Contains("mlp: the second weight must be (H, 32)"));
  CHECK_THROWS_WITH(mlp(x, w1, tape.leaf(Tensor::zeros(DType::f32, {31})), w2, {}, GeluForm::exact),
                    doctest::Contains("mlp: the first bias must be (32) for a weight of shape (32, 8), got (31)"));
  CHECK_THROWS_WITH(mlp(x, w1, {}, w2, tape.leaf(Tensor::zeros(DType::f64, {8})), GeluForm::exact),
                    doctest::Contains("mlp"));
}

// The node's fused pass over u (ops/gelu.hpp's gelu_forward_biased) against the two it replaces, u += b₁ then the
// gelu, bit for bit: with and without the bias, on one thread and split across two.
TEST_CASE("mlp's fused bias and gelu give the bits of the two passes they replace") {
  const int saved = num_threads();
  const int64_t rows = 601, cols = 70;  // 234 rows to a range: two ranges on two threads
  const std::vector<double> u0 =
      make_inputs(std::vector<InputSpec>{{"u", {rows, cols}}}, DType::f64, 21)[0].to_vector();
  const std::vector<double> b0 = make_inputs(std::vector<InputSpec>{{"b", {cols}}}, DType::f64, 23)[0].to_vector();
  std::vector<float> u(u0.begin(), u0.end()), b(b0.begin(), b0.end());
  for (float& e : u) e *= 4;  // both tails of Φ
  auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  for (int threads : {1, 2})
    for (GeluForm form : {GeluForm::exact, GeluForm::tanh})
      for (bool bias : {true, false}) {
        CAPTURE(threads);
        CAPTURE(gelu_form_name(form));
        CAPTURE(bias);
        set_num_threads(threads);
        const int64_t n = rows * cols;
        std::vector<float> u1 = u, u2 = u, s1(u.size()), s2(u.size()), h1(u.size()), h2(u.size());
        if (bias) add_rows(u1.data(), b.data(), rows, cols);
        gelu_forward(form, h1.data(), s1.data(), u1.data(), n);
        gelu_forward_biased(form, h2.data(), s2.data(), u2.data(), bias ? b.data() : nullptr, rows, cols);
        CHECK(same_bits(u1, u2));
        CHECK(same_bits(s1, s2));
        CHECK(same_bits(h1, h2));
      }
  set_num_threads(saved);
}

// bf16 products (at sizes that run in bf16): linear and mlp round each operand once and share the copy between
// their products; every product must still give the bits it gives rounding its operands itself.
TEST_CASE("bf16: linear's and mlp's shared roundings give the products' own bits" *
          doctest::skip(!bf16_unavailable_reason().empty())) {
  const PrecisionScope bf16(ProductPrecision::bf16);
  const int64_t n = 768, c = 128, h = 512;
  REQUIRE(runs_in_bf16(n, h, c));
  const Tensor x0 = Tensor::randn(DType::f32, {n, c}, 1), w1_0 = Tensor::randn(DType::f32, {h, c}, 2);
  const Tensor w2_0 = Tensor::randn(DType::f32, {c, h}, 3), g0 = Tensor::randn(DType::f32, {n, c}, 4);
  const Tensor gh = Tensor::randn(DType::f32, {n, h}, 5);
  SUBCASE("linear against its three products") {
    Tape tape;
    Var x = tape.leaf(x0), w = tape.leaf(w1_0);
    Var y = linear(x, w);
    tape.backward(y, gh);
    Tensor y_ref = Tensor::zeros(DType::f32, {n, h}), dx_ref = Tensor::zeros(DType::f32, {n, c});
    Tensor dw_ref = Tensor::zeros(DType::f32, {h, c});
    gemm<float>(n, h, c, 1.0f, as_is(x0.data<float>(), c), transposed(w1_0.data<float>(), c), 0.0f, y_ref.data<float>(),
                h);
    gemm<float>(n, c, h, 1.0f, as_is(gh.data<float>(), h), as_is(w1_0.data<float>(), c), 1.0f, dx_ref.data<float>(), c);
    gemm<float>(h, c, n, 1.0f, transposed(gh.data<float>(), h), as_is(x0.data<float>(), c), 1.0f, dw_ref.data<float>(),
                c);
    CHECK(y.value().to_vector() == y_ref.to_vector());
    CHECK(x.grad().to_vector() == dx_ref.to_vector());
    CHECK(w.grad().to_vector() == dw_ref.to_vector());
  }
  SUBCASE("mlp against linear, gelu, linear") {
    auto run = [&](bool fused) {
      Tape tape;
      Var x = tape.leaf(x0), w1 = tape.leaf(w1_0), w2 = tape.leaf(w2_0);
      Var y = fused ? mlp(x, w1, {}, w2, {}, GeluForm::exact) : linear(gelu_erf(linear(x, w1)), w2);
      tape.backward(y, g0);
      return std::vector<std::vector<double>>{y.value().to_vector(), x.grad().to_vector(), w1.grad().to_vector(),
                                              w2.grad().to_vector()};
    };
    const auto fused = run(true), composed = run(false);
    for (size_t i = 0; i < fused.size(); ++i) {
      CAPTURE(i);
      CHECK(fused[i] == composed[i]);
    }
  }
}

// A residual added in the node against the add node it replaces (the GPT block's x + c_proj(…) and x + mlp(…)), in
// float32 at the default model's sizes, one thread and two: the same bits (±0 aside) in the value, the gradients,
// the tangent and the Hessian-vector product.
TEST_CASE("linear and mlp with a residual equal add(r, linear(…)) and add(r, mlp(…)) bit for bit in float32") {
  const int saved = num_threads();
  const int64_t N = 768, C = 128, H = 512;
  const std::vector<Tensor> lin_x{Tensor::randn(DType::f32, {N, C}, 1), Tensor::randn(DType::f32, {C, C}, 2),
                                  Tensor::randn(DType::f32, {N, C}, 3)};
  const std::vector<Tensor> mlp_x{Tensor::randn(DType::f32, {N, C}, 4), Tensor::randn(DType::f32, {H, C}, 5),
                                  Tensor::randn(DType::f32, {C, H}, 6), Tensor::randn(DType::f32, {N, C}, 7)};
  const Function lin_fused = [](Tape&, std::span<const Var> v) { return linear(v[0], v[1], Var{}, v[2]); };
  const Function lin_nodes = [](Tape&, std::span<const Var> v) { return add(v[2], linear(v[0], v[1])); };
  const Function mlp_fused = [](Tape&, std::span<const Var> v) {
    return mlp(v[0], v[1], Var{}, v[2], Var{}, GeluForm::exact, v[3]);
  };
  const Function mlp_nodes = [](Tape&, std::span<const Var> v) {
    return add(v[3], mlp(v[0], v[1], Var{}, v[2], Var{}, GeluForm::exact));
  };
  const Tensor g = Tensor::randn(DType::f32, {N, C}, 8);
  auto same = [&](const Function& fused, const Function& nodes, const std::vector<Tensor>& x) {
    std::vector<Tensor> t;
    for (size_t i = 0; i < x.size(); ++i) t.push_back(Tensor::randn(DType::f32, x[i].shape(), 20 + i));
    CHECK(evaluate(fused, x).to_vector() == evaluate(nodes, x).to_vector());
    const std::vector<Tensor> a = vjp(fused, x, g), b = vjp(nodes, x, g);
    for (size_t i = 0; i < x.size(); ++i) CHECK(a[i].to_vector() == b[i].to_vector());
    CHECK(jvp(fused, x, t).second.to_vector() == jvp(nodes, x, t).second.to_vector());
    const std::vector<Tensor> ha = hvp(fused, x, g, t), hb = hvp(nodes, x, g, t);
    for (size_t i = 0; i < x.size(); ++i) CHECK(ha[i].to_vector() == hb[i].to_vector());
  };
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    set_num_threads(threads);
    same(lin_fused, lin_nodes, lin_x);
    same(mlp_fused, mlp_nodes, mlp_x);
  }
  set_num_threads(saved);
}

TEST_CASE("a residual of another shape than the output is refused, naming both") {
  Tape tape;
  const Var x = tape.leaf(Tensor::zeros(DType::f64, {4, 3})), w = tape.leaf(Tensor::zeros(DType::f64, {2, 3}));
  const Var r = tape.leaf(Tensor::zeros(DType::f64, {4, 3}));
  CHECK_THROWS_WITH_AS(linear(x, w, Var{}, r), doctest::Contains("the residual must have the output's shape (4, 2)"),
                       Error);
  const Var w1 = tape.leaf(Tensor::zeros(DType::f64, {5, 3})), w2 = tape.leaf(Tensor::zeros(DType::f64, {2, 5}));
  CHECK_THROWS_WITH_AS(mlp(x, w1, Var{}, w2, Var{}, GeluForm::exact, r),
                       doctest::Contains("the residual must have the output's shape (4, 2)"), Error);
}
