#include "models/optim.hpp"

#include <cmath>

#include "engine/parallel.hpp"

namespace tapegrad {

AdamW::AdamW(const std::vector<Parameter>& params, AdamWConfig cfg) : cfg_(cfg) {
  for (const auto& p : params) {
    m_.push_back(Tensor::zeros(DType::f32, p.value.shape()));
    v_.push_back(Tensor::zeros(DType::f32, p.value.shape()));
  }
}

namespace {

// Elements per range of the parallel loops over a parameter: ~16k (small parameters run on one thread).
constexpr int64_t kGrain = 16384;

}  // namespace

// The update is element-wise: each parameter's elements are split across the engine's threads, and the loop
// vectorizes (sqrt and division included: the library builds without math errno).
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
    parallel_for(params[k].value.numel(), kGrain, [=](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        p[i] *= decay;
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        p[i] -= step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_c2 + eps);
      }
    });
  }
}

double learning_rate(int64_t it, double lr, double min_lr, int64_t warmup, int64_t decay_iters) {
  if (it < warmup) return lr * static_cast<double>(it + 1) / static_cast<double>(warmup + 1);
  if (it > decay_iters) return min_lr;
  double ratio = static_cast<double>(it - warmup) / static_cast<double>(std::max<int64_t>(1, decay_iters - warmup));
  return min_lr + 0.5 * (1 + std::cos(M_PI * ratio)) * (lr - min_lr);
}

// ‖g‖² in double: per parameter, each range of elements sums in four lanes and the ranges are added in order,
// so the norm is the same in every run for a given thread count.
double clip_grad_norm(std::vector<Parameter>& params, double max_norm) {
  double sq = 0;
  for (const auto& p : params) {
    const float* g = p.grad.data<float>();
    const int64_t n = p.grad.numel();
    double partial[256] = {};  // one per range: at most 256 threads (set_num_threads' limit)
    parallel_for(n, kGrain, [&](int64_t begin, int64_t end, int64_t chunk) {
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0;  // four lanes: element i to lane (i − begin) mod 4, the tail to lane 0
      int64_t i = begin;
      for (; i + 4 <= end; i += 4) {
        s0 += static_cast<double>(g[i]) * g[i];
        s1 += static_cast<double>(g[i + 1]) * g[i + 1];
        s2 += static_cast<double>(g[i + 2]) * g[i + 2];
        s3 += static_cast<double>(g[i + 3]) * g[i + 3];
      }
      for (; i < end; ++i) s0 += static_cast<double>(g[i]) * g[i];
      partial[chunk] = (s0 + s1) + (s2 + s3);
    });
    for (int64_t c = 0, chunks = parallel_chunks(n, kGrain); c < chunks; ++c) sq += partial[c];
  }
  const double norm = std::sqrt(sq);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1)
    for (auto& p : params) {
      float* g = p.grad.data<float>();
      const float scale = static_cast<float>(coef);
      parallel_for(p.grad.numel(), kGrain, [=](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) g[i] *= scale;
      });
    }
  return norm;
}

}  // namespace tapegrad
