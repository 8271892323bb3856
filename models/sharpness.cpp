#include "models/sharpness.hpp"

#include <cmath>

#include "engine/rng.hpp"

namespace tapegrad {

ParameterHvp parameter_hvp(const Module& module, const LossFunction& loss, std::span<const Tensor> direction) {
  const std::vector<Parameter>& params = module.parameters();
  if (direction.size() != params.size())
    fail("parameter_hvp: {} directions for {} parameters; one each", direction.size(), params.size());
  for (size_t p = 0; p < params.size(); ++p)
    if (!(direction[p].shape() == params[p].value.shape()) || direction[p].dtype() != params[p].value.dtype())
      fail("parameter_hvp: the direction of {} is {} {}, expected {} {}", params[p].name, direction[p].dtype(),
           direction[p].shape(), params[p].value.dtype(), params[p].value.shape());
  Tape tape;
  const Var L = loss(tape);
  if (L.shape().numel() != 1) fail("parameter_hvp: the loss has shape {}; expected a scalar", L.shape());
  // The parameters' leaves on this recording, by the storage they read (a parameter may have several).
  std::vector<Var> wrt;
  std::vector<size_t> owner;
  std::vector<Tensor> dirs;
  for (uint32_t id = 0; id < tape.num_values(); ++id) {
    if (!tape.is_param(id)) continue;
    for (size_t p = 0; p < params.size(); ++p)
      if (tape.value_at(id).raw() == params[p].value.raw()) {
        wrt.push_back(tape.var_at(id));
        owner.push_back(p);
        dirs.push_back(direction[p]);
        break;
      }
  }
  const Tensor seed = Tensor::from<double>(Shape{}, {1.0}).to(L.dtype()).view(L.shape());
  const Tape::HessianVectorProduct h = tape.hvp(L, seed, wrt, dirs);
  ParameterHvp out;
  out.loss = L.value().item();
  for (const Parameter& p : params) {
    out.gradient.push_back(Tensor::zeros(p.value.dtype(), p.value.shape()));
    out.hvp.push_back(Tensor::zeros(p.value.dtype(), p.value.shape()));
  }
  for (size_t k = 0; k < wrt.size(); ++k) {
    out.gradient[owner[k]].accumulate(h.gradient[k]);
    out.hvp[owner[k]].accumulate(h.hvp[k]);
  }
  return out;
}

namespace {

double dot(std::span<const Tensor> a, std::span<const Tensor> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (int64_t k = 0; k < a[i].numel(); ++k) s += a[i].item(k) * b[i].item(k);
  return s;
}

// v ← c·v element by element.
void scale_all(std::vector<Tensor>& v, double c) {
  for (Tensor& t : v)
    dispatch_float("sharpness", t.dtype(), [&]<class T>(T) {
      T* d = t.data<T>();
      for (int64_t k = 0; k < t.numel(); ++k) d[k] = static_cast<T>(c * static_cast<double>(d[k]));
    });
}

}  // namespace

Sharpness sharpness(const Module& module, const LossFunction& loss, const SharpnessOptions& options) {
  if (options.iterations < 1) fail("sharpness: iterations must be at least 1, got {}", options.iterations);
  Rng rng(options.seed ^ 0x5ba1d0e5ull);
  std::vector<Tensor> v;
  for (const Parameter& p : module.parameters()) v.push_back(Tensor::randn(p.value.dtype(), p.value.shape(), rng));
  scale_all(v, 1 / std::sqrt(dot(v, v)));
  Sharpness s;
  double previous = NAN;
  for (int it = 0; it < options.iterations; ++it) {
    ParameterHvp h = parameter_hvp(module, loss, v);
    s.loss = h.loss;
    s.iterations = it + 1;
    s.eigenvalue = dot(v, h.hvp);
    double r2 = 0;
    for (size_t i = 0; i < v.size(); ++i)
      for (int64_t k = 0; k < v[i].numel(); ++k) {
        const double e = h.hvp[i].item(k) - s.eigenvalue * v[i].item(k);
        r2 += e * e;
      }
    s.residual = std::sqrt(r2) / std::max(std::abs(s.eigenvalue), 1e-300);
    const double norm = std::sqrt(dot(h.hvp, h.hvp));
    if (!std::isfinite(norm)) fail("sharpness: a Hessian-vector product is not finite (‖H v‖ = {})", norm);
    if (norm == 0) break;  // H v = 0: λ = 0 along v
    const bool settled = std::abs(s.eigenvalue - previous) <= options.tolerance * std::abs(s.eigenvalue);
    previous = s.eigenvalue;
    if (settled) break;
    v = std::move(h.hvp);
    scale_all(v, 1 / norm);
  }
  return s;
}

}  // namespace tapegrad
