#include "models/optim.hpp"

#include <cmath>

namespace tapegrad {

AdamW::AdamW(const std::vector<Parameter>& params, AdamWConfig cfg) : cfg_(cfg) {
  for (const auto& p : params) {
    m_.push_back(Tensor::zeros(DType::f32, p.value.shape()));
    v_.push_back(Tensor::zeros(DType::f32, p.value.shape()));
  }
}

void AdamW::step(std::vector<Parameter>& params, double lr) {
  ++t_;
  const double c1 = 1 - std::pow(cfg_.beta1, static_cast<double>(t_));
  const double c2 = 1 - std::pow(cfg_.beta2, static_cast<double>(t_));
  const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2);
  const float step_size = static_cast<float>(lr / c1), inv_sqrt_c2 = static_cast<float>(1 / std::sqrt(c2));
  const float eps = static_cast<float>(cfg_.eps);
  for (size_t k = 0; k < params.size(); ++k) {
    float* p = params[k].value.data<float>();
    const float* g = params[k].grad.data<float>();
    float* m = m_[k].data<float>();
    float* v = v_[k].data<float>();
    const float decay = params[k].decay ? static_cast<float>(1 - lr * cfg_.weight_decay) : 1.0f;
    for (int64_t i = 0, n = params[k].value.numel(); i < n; ++i) {
      p[i] *= decay;
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      p[i] -= step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_c2 + eps);
    }
  }
}

double learning_rate(int64_t it, double lr, double min_lr, int64_t warmup, int64_t decay_iters) {
  if (it < warmup) return lr * static_cast<double>(it + 1) / static_cast<double>(warmup + 1);
  if (it > decay_iters) return min_lr;
  double ratio = static_cast<double>(it - warmup) / static_cast<double>(std::max<int64_t>(1, decay_iters - warmup));
  return min_lr + 0.5 * (1 + std::cos(M_PI * ratio)) * (lr - min_lr);
}

double clip_grad_norm(std::vector<Parameter>& params, double max_norm) {
  double sq = 0;
  for (const auto& p : params) {
    const float* g = p.grad.data<float>();
    for (int64_t i = 0, n = p.grad.numel(); i < n; ++i) sq += static_cast<double>(g[i]) * g[i];
  }
  const double norm = std::sqrt(sq);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1)
    for (auto& p : params) {
      float* g = p.grad.data<float>();
      for (int64_t i = 0, n = p.grad.numel(); i < n; ++i) g[i] *= static_cast<float>(coef);
    }
  return norm;
}

}  // namespace tapegrad
