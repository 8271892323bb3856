#include "models/sharpness.hpp"

#include <cmath>

#include "engine/rng.hpp"

namespace tapegrad {

ParameterHvp parameter_hvp(const Module& module, const LossFunction& loss, std::span<const Tensor> direction) {
  Tape tape;
  return parameter_hvp(module, loss, direction, tape);
}

ParameterHvp parameter_hvp(const Module& module, const LossFunction& loss, std::span<const Tensor> direction,
                           Tape& tape) {
  const std::vector<Parameter>& params = module.parameters();
  if (direction.size() != params.size())
    fail("parameter_hvp: {} directions for {} parameters; one each", direction.size(), params.size());
  for (size_t p = 0; p < params.size(); ++p)
    if (!(direction[p].shape() == params[p].value.shape()) || direction[p].dtype() != params[p].value.dtype())
      fail("parameter_hvp: the direction of {} is {} {}, expected {} {}", params[p].name, direction[p].dtype(),
           direction[p].shape(), params[p].value.dtype(), params[p].value.shape());
  tape.clear();
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

struct PowerIteration {
  double eigenvalue = 0, residual = 0;
  int iterations = 0;
  double loss = 0;
};

// Power iteration on H − shift·I; the eigenvalue returned is H's (the shift added back).
PowerIteration power_iteration(const Module& module, const LossFunction& loss, const SharpnessOptions& options,
                               double shift) {
  Rng rng(options.seed ^ 0x5ba1d0e5ull);
  std::vector<Tensor> v;
  for (const Parameter& p : module.parameters()) v.push_back(Tensor::randn(p.value.dtype(), p.value.shape(), rng));
  scale_all(v, 1 / std::sqrt(dot(v, v)));
  PowerIteration r;
  double previous = NAN;
  Tape tape;
  for (int it = 0; it < options.iterations; ++it) {
    ParameterHvp h = parameter_hvp(module, loss, v, tape);
    r.loss = h.loss;
    r.iterations = it + 1;
    const double lambda = dot(v, h.hvp);  // of H; H − shift·I has λ − shift
    double r2 = 0, n2 = 0;
    for (size_t i = 0; i < v.size(); ++i)
      for (int64_t k = 0; k < v[i].numel(); ++k) {
        const double hv = h.hvp[i].item(k), vk = v[i].item(k);
        r2 += (hv - lambda * vk) * (hv - lambda * vk);
        n2 += (hv - shift * vk) * (hv - shift * vk);
      }
    r.eigenvalue = lambda;
    r.residual = std::sqrt(r2) / std::max(std::abs(lambda), 1e-300);
    const double norm = std::sqrt(n2);
    if (!std::isfinite(norm)) fail("sharpness: a Hessian-vector product is not finite (‖H v‖ = {})", norm);
    if (norm == 0) break;  // (H − shift·I) v = 0
    const bool settled = std::abs(lambda - previous) <= options.tolerance * std::abs(lambda);
    previous = lambda;
    if (settled) break;
    // v ← (H − shift·I) v / ‖·‖
    for (size_t i = 0; i < v.size(); ++i) {
      Tensor next = h.hvp[i].clone();
      dispatch_float("sharpness", next.dtype(), [&]<class T>(T) {
        T* d = next.data<T>();
        for (int64_t k = 0; k < next.numel(); ++k)
          d[k] = static_cast<T>((static_cast<double>(d[k]) - shift * v[i].item(k)) / norm);
      });
      v[i] = next;
    }
  }
  return r;
}

}  // namespace

Sharpness sharpness(const Module& module, const LossFunction& loss, const SharpnessOptions& options) {
  if (options.iterations < 1) fail("sharpness: iterations must be at least 1, got {}", options.iterations);
  const PowerIteration first = power_iteration(module, loss, options, 0);
  Sharpness s;
  s.magnitude = s.largest = first.eigenvalue;
  s.residual = first.residual;
  s.iterations = first.iterations;
  s.loss = first.loss;
  if (first.eigenvalue < 0) {  // H − λI ≥ 0: its top eigenvalue is λ_max − λ
    const PowerIteration second = power_iteration(module, loss, options, first.eigenvalue);
    s.largest = second.eigenvalue;
    s.residual = second.residual;
    s.iterations += second.iterations;
  }
  return s;
}

}  // namespace tapegrad
