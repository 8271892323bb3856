// Curvature over a module's parameters (models/sharpness.hpp): H·v of a quadratic is A·v, and power iteration
// finds the eigenvalue of largest magnitude of a known matrix; on a small GPT, H·v agrees with differences of the
// gradient along v.
#include <doctest/doctest.h>

#include <cmath>

#include "models/gpt.hpp"
#include "models/sharpness.hpp"
#include "ops/ops.hpp"

using namespace tapegrad;

namespace {

// One parameter x (n, 1): L = ½ xᵀ A x for a fixed symmetric A.
struct Quadratic : Module {
  Tensor a;
  explicit Quadratic(Tensor a_) : a(std::move(a_)) {
    add_parameter("x", Tensor::randn(DType::f32, {a.shape()[0], 1}, 3), false);
  }
  Var loss(Tape& tape) const {
    const Var x = parameters()[0].on(tape);
    return scale(sum(mul(x, matmul(tape.constant(a), x))), 0.5);
  }
};

// A = Q diag(d) Qᵀ with the Householder reflection Q = I − 2uuᵀ/⟨u, u⟩: eigenvalues d, eigenvectors not axes.
Tensor rotated_diagonal(const std::vector<double>& d) {
  const int64_t n = static_cast<int64_t>(d.size());
  std::vector<double> u(static_cast<size_t>(n));
  double uu = 0;
  for (int64_t i = 0; i < n; ++i) uu += (u[static_cast<size_t>(i)] = 1.0 + 0.3 * static_cast<double>(i));
  uu = 0;
  for (double e : u) uu += e * e;
  auto q = [&](int64_t i, int64_t j) { return (i == j ? 1.0 : 0.0) - 2 * u[size_t(i)] * u[size_t(j)] / uu; };
  std::vector<double> a(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < n; ++k) a[size_t(i * n + j)] += q(i, k) * d[size_t(k)] * q(j, k);
  return Tensor::from<double>({n, n}, a).to(DType::f32);
}

}  // namespace

TEST_CASE("sharpness: H·v of a quadratic is A·v, and power iteration finds its largest |eigenvalue|") {
  const Tensor a = rotated_diagonal({2.0, -1.0, 5.0, 0.5, 3.0});
  const Quadratic q(a);
  const LossFunction loss = [&](Tape& tape) { return q.loss(tape); };
  const Tensor v = Tensor::randn(DType::f32, {5, 1}, 9);
  const Tensor dir[] = {v};
  const ParameterHvp h = parameter_hvp(q, loss, dir);
  for (int64_t i = 0; i < 5; ++i) {
    double av = 0;
    for (int64_t j = 0; j < 5; ++j) av += a.item(i * 5 + j) * v.item(j);
    CHECK(h.hvp[0].item(i) == doctest::Approx(av).epsilon(1e-5));
  }
  const Sharpness s = sharpness(q, loss, {.iterations = 200, .tolerance = 1e-7});
  CHECK(s.largest == doctest::Approx(5.0).epsilon(1e-4));
  CHECK(s.magnitude == s.largest);
  CHECK(s.residual < 1e-3);
  CHECK(s.iterations < 200);
  // With −6 beside 5, the largest magnitude is negative: the first run finds it, the shifted one λ_max = 5.
  const Quadratic neg(rotated_diagonal({2.0, -6.0, 5.0}));
  const Sharpness n =
      sharpness(neg, [&](Tape& tape) { return neg.loss(tape); }, {.iterations = 400, .tolerance = 1e-7});
  CHECK(n.magnitude == doctest::Approx(-6.0).epsilon(1e-4));
  CHECK(n.largest == doctest::Approx(5.0).epsilon(1e-3));
}

TEST_CASE("sharpness: on a small GPT (tied embedding), H·v agrees with differences of the gradient along v") {
  GPTConfig cfg;
  cfg.vocab_size = 7, cfg.block_size = 6, cfg.n_layer = 1, cfg.n_head = 2, cfg.n_embd = 8, cfg.dropout = 0;
  GPT model(cfg, 11);
  Rng rng(5);
  const Tensor x = Tensor::from<int32_t>({2, 6}, {1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5});
  const Tensor y = Tensor::from<int32_t>({2, 6}, {2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6});
  const LossFunction loss = [&](Tape& tape) { return model.loss(tape, x, y); };
  std::vector<Tensor> v;
  double vv = 0;
  for (const Parameter& p : model.parameters()) {
    v.push_back(Tensor::randn(DType::f64, p.value.shape(), rng));
    for (int64_t k = 0; k < v.back().numel(); ++k) vv += v.back().item(k) * v.back().item(k);
  }
  for (Tensor& t : v) {  // ‖v‖ = 1 over all parameters
    for (int64_t k = 0; k < t.numel(); ++k) t.data<double>()[k] /= std::sqrt(vv);
    t = t.to(DType::f32);
  }
  const ParameterHvp h = parameter_hvp(model, loss, v);
  // (∇L(θ + εv) − ∇L(θ − εv))/2ε in float32, compared as a whole: relative error of the two vectors.
  const double eps = 1e-2;
  auto gradient_at = [&](double c) {
    std::vector<Tensor> saved;
    for (size_t p = 0; p < v.size(); ++p) {
      saved.push_back(model.parameters()[p].value.clone());
      float* d = model.parameters()[p].value.data<float>();
      for (int64_t k = 0; k < v[p].numel(); ++k) d[k] += static_cast<float>(c * v[p].item(k));
    }
    const std::vector<Tensor> g = parameter_hvp(model, loss, v).gradient;
    for (size_t p = 0; p < v.size(); ++p) model.parameters()[p].value.copy_from(saved[p]);
    return g;
  };
  const std::vector<Tensor> plus = gradient_at(eps), minus = gradient_at(-eps);
  double err = 0, ref = 0;
  for (size_t p = 0; p < v.size(); ++p)
    for (int64_t k = 0; k < v[p].numel(); ++k) {
      const double n = (plus[p].item(k) - minus[p].item(k)) / (2 * eps);
      err += (h.hvp[p].item(k) - n) * (h.hvp[p].item(k) - n);
      ref += n * n;
    }
  MESSAGE("‖H v − differences‖ / ‖differences‖ = ", std::sqrt(err / ref));
  CHECK(std::sqrt(err / ref) < 2e-3);
}
