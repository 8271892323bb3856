// AdamW with decoupled weight decay, the warm-up + cosine learning-rate schedule, and clipping by global norm.
#pragma once

#include <vector>

#include "gpt.hpp"

namespace tapegrad {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.99, eps = 1e-8, weight_decay = 0.1;
};

// For each parameter p with gradient g, at step t (from 1):
//   p ← p − lr·λ·p                      (decoupled decay, only where Parameter::decay)
//   m ← β₁m + (1−β₁)g,   v ← β₂v + (1−β₂)g²
//   p ← p − lr · (m/(1−β₁ᵗ)) / (√(v/(1−β₂ᵗ)) + ε)
class AdamW {
 public:
  AdamW(const std::vector<Parameter>& params, AdamWConfig cfg);
  void step(std::vector<Parameter>& params, double lr);
  int64_t steps() const { return t_; }
  // State for checkpoints: first and second moments per parameter, and the step count.
  std::vector<Tensor>& first_moments() { return m_; }
  std::vector<Tensor>& second_moments() { return v_; }
  void set_steps(int64_t t) { t_ = t; }

 private:
  AdamWConfig cfg_;
  std::vector<Tensor> m_, v_;
  int64_t t_ = 0;
};

// lr(it): linear warm-up lr·(it+1)/(warmup+1) for it < warmup, then cosine from lr down to min_lr at decay_iters.
double learning_rate(int64_t it, double lr, double min_lr, int64_t warmup, int64_t decay_iters);

// Scales all gradients by min(1, max_norm/(‖g‖ + 1e-6)); returns the norm before clipping.
double clip_grad_norm(std::vector<Parameter>& params, double max_norm);

}  // namespace tapegrad
