#include "models/optim.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/parallel.hpp"

namespace tapegrad {

namespace {

// Elements per range of the parallel loops over a parameter: ~16k (small parameters run on one thread).
constexpr int64_t kGrain = 16384;

// fn(k, begin, end) over the elements of every parameter as if they were one array, in one parallel pass: a range
// that straddles parameters calls fn once for each part it holds. Most of a small model's parameters are far below
// kGrain; one hand-off to the pool per step, instead of one per parameter, lets the element-wise updates use every
// thread. The updates are element-wise, so the split changes no value. (fn takes its constants by value: captured
// by reference, they could alias the stores of the loop, and it would not vectorize.)
template <class F>
void for_each_parameter_range(const std::vector<Parameter>& params, F&& fn) {
  std::vector<int64_t> start(params.size() + 1, 0);
  for (size_t k = 0; k < params.size(); ++k) start[k + 1] = start[k] + params[k].value.numel();
  parallel_for(start.back(), kGrain, [&](int64_t begin, int64_t end) {
    auto k = static_cast<size_t>(std::upper_bound(start.begin(), start.end(), begin) - start.begin() - 1);
    for (; k < params.size() && start[k] < end; ++k) {
      const int64_t b = std::max(begin, start[k]) - start[k], e = std::min(end, start[k + 1]) - start[k];
      if (b < e) fn(k, b, e);
    }
  });
}

}  // namespace

Optimizer::Optimizer(std::vector<Parameter> params, double lr) : params_(std::move(params)), lr_(lr) {
  for (const auto& p : params_)
    if (p.value.dtype() != DType::f32 || !(p.grad.shape() == p.value.shape()) || p.grad.dtype() != DType::f32)
      fail("optimizer: parameter '{}' must be float32 with a gradient of its shape, got {} {} and gradient {} {}",
           p.name, p.value.dtype(), p.value.shape(), p.grad.dtype(), p.grad.shape());
  if (!(lr >= 0)) fail("optimizer: the learning rate must not be negative, got {}", lr);
}

void Optimizer::zero_grad() {
  for_each_parameter_range(params_, [&](size_t k, int64_t begin, int64_t end) {
    std::memset(params_[k].grad.data<float>() + begin, 0, static_cast<size_t>(end - begin) * sizeof(float));
  });
}

std::vector<Tensor> Optimizer::zeros_like_parameters() const {
  std::vector<Tensor> v;
  for (const auto& p : params_) v.push_back(Tensor::zeros(DType::f32, p.value.shape()));
  return v;
}

void Optimizer::save_state(Checkpoint& ck) const {
  // buffers() is not const (it hands out the tensors to fill); saving reads them only.
  auto bufs = const_cast<Optimizer*>(this)->buffers();
  for (size_t k = 0; k < params_.size(); ++k)
    for (const Buffer* b : bufs) ck.tensors.push_back({"optimizer." + b->name + "." + params_[k].name, b->tensors[k]});
  ck.metadata[std::string(steps_key())] = std::to_string(t_);
}

void Optimizer::load_state(const Checkpoint& ck, const std::string& path) {
  auto bufs = buffers();
  std::vector<const Tensor*> found;
  for (const Buffer* b : bufs)
    for (size_t k = 0; k < params_.size(); ++k) {
      const std::string name = "optimizer." + b->name + "." + params_[k].name;
      const Tensor* t = ck.find(name);
      if (!t) fail("checkpoint {}: no {} state '{}' for parameter '{}'", path, this->name(), name, params_[k].name);
      if (t->dtype() != DType::f32 || !(t->shape() == params_[k].value.shape()))
        fail("checkpoint {}: {} state '{}' is {} {}, the parameter is float32 {}", path, this->name(), name, t->dtype(),
             t->shape(), params_[k].value.shape());
      // A state that would poison the next step (and every checkpoint after it) is refused as it is read.
      const float* v = t->data<float>();
      for (int64_t e = 0; e < t->numel(); ++e)
        if (!std::isfinite(v[e]) || (b->non_negative && v[e] < 0))
          fail("checkpoint {}: {} state '{}' holds {} at element {}{}", path, this->name(), name, v[e], e,
               b->non_negative ? ", where it is a mean of squares (finite, not negative)" : ", not a finite number");
      found.push_back(t);
    }
  auto it = ck.metadata.find(std::string(steps_key()));
  if (it == ck.metadata.end())
    fail("checkpoint {}: no '{}' in its metadata ({} state)", path, steps_key(), this->name());
  int64_t steps = 0;
  try {
    size_t used = 0;
    steps = std::stoll(it->second, &used);
    if (used != it->second.size() || steps < 0) throw std::invalid_argument("not a count");
  } catch (const std::logic_error&) {
    fail("checkpoint {}: '{}' is '{}', not a step count", path, steps_key(), it->second.substr(0, 40));
  }
  size_t i = 0;
  for (Buffer* b : bufs)
    for (size_t k = 0; k < params_.size(); ++k) b->tensors[k].copy_from(*found[i++]);
  t_ = steps;
}

SGD::SGD(std::vector<Parameter> params, SGDOptions opt) : Optimizer(std::move(params), opt.lr), opt_(opt) {
  if (!(opt.momentum >= 0) || !(opt.weight_decay >= 0) || !(opt.dampening >= 0 && opt.dampening <= 1))
    fail("SGD: momentum and weight_decay must not be negative and dampening must be in [0, 1], got {}, {}, {}",
         opt.momentum, opt.weight_decay, opt.dampening);
  if (opt.nesterov && (opt.momentum <= 0 || opt.dampening != 0))
    fail("SGD: nesterov needs a positive momentum and no dampening");
  momentum_.tensors = zeros_like_parameters();
}

void SGD::update(float grad_scale, bool zero_grads) {
  ++t_;
  const float lr = static_cast<float>(lr_), mu = static_cast<float>(opt_.momentum);
  const float damp = t_ == 1 ? 0.0f : static_cast<float>(1 - opt_.dampening);  // b starts as g itself
  const float first = t_ == 1 ? 1.0f : 0.0f;
  const bool momentum = opt_.momentum > 0, nesterov = opt_.nesterov;
  for_each_parameter_range(params_, [=, this](size_t k, int64_t begin, int64_t end) {
    float* p = params_[k].value.data<float>();
    Tensor grad_tensor = params_[k].grad;  // a Parameter is a handle: its gradient is written through a copy of it
    float* grad = grad_tensor.data<float>();
    float* b = momentum_.tensors[k].data<float>();
    const float wd = params_[k].decay ? static_cast<float>(opt_.weight_decay) : 0.0f;
    // g = s·∇ + λp;   b ← μb + (1 − τ)g  (b ← g at the first step);   p ← p − lr·(nesterov ? g + μb : b)
    // (plain SGD, μ = 0: p ← p − lr·g; s the clipping scale, 1 without)
    for (int64_t i = begin; i < end; ++i) {
      float g = grad[i] * grad_scale + wd * p[i];
      if (momentum) {
        b[i] = first * g + (1 - first) * (mu * b[i] + damp * g);
        g = nesterov ? g + mu * b[i] : b[i];
      }
      p[i] -= lr * g;
    }
    if (zero_grads) std::memset(grad + begin, 0, static_cast<size_t>(end - begin) * sizeof(float));
  });
}

AdamW::AdamW(std::vector<Parameter> params, AdamWOptions opt) : Optimizer(std::move(params), opt.lr), opt_(opt) {
  if (!(opt.beta1 >= 0 && opt.beta1 < 1 && opt.beta2 >= 0 && opt.beta2 < 1) || !(opt.eps > 0) ||
      !(opt.weight_decay >= 0))
    fail("AdamW: betas must be in [0, 1), eps positive and weight_decay not negative, got β₁ {}, β₂ {}, ε {}, λ {}",
         opt.beta1, opt.beta2, opt.eps, opt.weight_decay);
  m_.tensors = zeros_like_parameters();
  v_.tensors = zeros_like_parameters();
}

// The update is element-wise: the elements of all parameters are split across the engine's threads, and the loop
// vectorizes (sqrt and division included: the library builds without math errno). Scaling each gradient as it is
// read and zeroing it after (step_and_zero_grad) saves the training loop two passes over the gradients: the same
// products g·s as clip_grad_norm's, so the same bits.
void AdamW::update(float grad_scale, bool zero_grads) {
  ++t_;
  const double lr = lr_;
  const double c1 = 1 - std::pow(opt_.beta1, static_cast<double>(t_));
  const double c2 = 1 - std::pow(opt_.beta2, static_cast<double>(t_));
  const float b1 = static_cast<float>(opt_.beta1), b2 = static_cast<float>(opt_.beta2);
  const float step_size = static_cast<float>(lr / c1), inv_sqrt_c2 = static_cast<float>(1 / std::sqrt(c2));
  const float eps = static_cast<float>(opt_.eps);
  for_each_parameter_range(params_, [=, this](size_t k, int64_t begin, int64_t end) {
    float* p = params_[k].value.data<float>();
    Tensor grad = params_[k].grad;  // a Parameter is a handle: its gradient is written through a copy of it
    float* g = grad.data<float>();
    float* m = m_.tensors[k].data<float>();
    float* v = v_.tensors[k].data<float>();
    const float decay = params_[k].decay ? static_cast<float>(1 - lr * opt_.weight_decay) : 1.0f;
    // ĝ = s·g (s the clipping scale, 1 without);  p ← p(1 − lr·λ);  m ← β₁m + (1−β₁)ĝ;  v ← β₂v + (1−β₂)ĝ²;
    // p ← p − lr·(m/(1−β₁ᵗ)) / (√(v/(1−β₂ᵗ)) + ε)   (Loshchilov & Hutter's decoupled decay, only where
    // Parameter::decay)
    for (int64_t i = begin; i < end; ++i) {
      const float gi = g[i] * grad_scale;
      p[i] *= decay;
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      p[i] -= step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_c2 + eps);
    }
    if (zero_grads) std::memset(g + begin, 0, static_cast<size_t>(end - begin) * sizeof(float));
  });
}

double learning_rate(int64_t it, double lr, double min_lr, int64_t warmup, int64_t decay_iters) {
  if (it < warmup) return lr * static_cast<double>(it + 1) / static_cast<double>(warmup + 1);
  if (it > decay_iters) return min_lr;
  double ratio = static_cast<double>(it - warmup) / static_cast<double>(std::max<int64_t>(1, decay_iters - warmup));
  return min_lr + 0.5 * (1 + std::cos(M_PI * ratio)) * (lr - min_lr);
}

// ‖g‖² in double: per parameter, its elements cut into parallel_chunks(n, kGrain) equal ranges, each range summed
// in four lanes, and those range sums added parameter by parameter, range by range, so the norm is the same in
// every run for a given thread count. All the parameters' ranges run in one loop on the pool (one hand-off a
// step, not one per parameter: the per-parameter loops took about half of this pass at 2 threads).
double grad_norm(const std::vector<Parameter>& params) {
  struct Range {
    const float* g;
    int64_t begin, end;
  };
  std::vector<Range> ranges;  // parameter by parameter, range by range: the order the sums are added in
  for (const auto& p : params) {
    const int64_t n = p.grad.numel(), chunks = parallel_chunks(n, kGrain);
    for (int64_t c = 0; c < chunks; ++c)
      ranges.push_back({p.grad.data<float>(), chunk_begin(n, chunks, c), chunk_begin(n, chunks, c + 1)});
  }
  std::vector<double> sums(ranges.size());
  parallel_for(static_cast<int64_t>(ranges.size()), 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = ranges[r].g;
      const int64_t end = ranges[r].end;
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0;  // four lanes: element i to lane (i − begin) mod 4, the tail to lane 0
      int64_t i = ranges[r].begin;
      for (; i + 4 <= end; i += 4) {
        s0 += static_cast<double>(g[i]) * g[i];
        s1 += static_cast<double>(g[i + 1]) * g[i + 1];
        s2 += static_cast<double>(g[i + 2]) * g[i + 2];
        s3 += static_cast<double>(g[i + 3]) * g[i + 3];
      }
      for (; i < end; ++i) s0 += static_cast<double>(g[i]) * g[i];
      sums[r] = (s0 + s1) + (s2 + s3);
    }
  });
  double sq = 0;
  for (double s : sums) sq += s;
  return std::sqrt(sq);
}

float clip_scale(double norm, double max_norm) {
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1 ? static_cast<float>(coef) : 1.0f;
}

double clip_grad_norm(const std::vector<Parameter>& params, double max_norm) {
  const double norm = grad_norm(params);
  const float scale = clip_scale(norm, max_norm);
  if (scale < 1) {
    for_each_parameter_range(params, [=, &params](size_t k, int64_t begin, int64_t end) {
      Tensor grad = params[k].grad;  // a Parameter is a handle: its gradient is written through a copy of it
      float* g = grad.data<float>();
      for (int64_t i = begin; i < end; ++i) g[i] *= scale;
    });
  }
  return norm;
}

}  // namespace tapegrad
