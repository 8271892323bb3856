// Optimizers over any list of parameters (a Module's parameters(), or any subset), the warm-up + cosine
// learning-rate schedule, and clipping by global norm.
//
//   SGD opt(mlp.parameters(), {.lr = 0.1, .momentum = 0.9});
//   ... tape.backward(loss); tape.clear();
//   clip_grad_norm(opt.parameters(), 1.0);   // optional
//   opt.step();                              // at opt.lr(); set_lr() changes it between steps
//   opt.zero_grad();
// or the same in one pass over the parameters (the training loop's):
//   opt.step_and_zero_grad(clip_scale(grad_norm(opt.parameters()), 1.0));
//
// The defaults are PyTorch's (torch.optim.SGD and AdamW); the GPT's trainer passes nanoGPT's own. Each
// optimizer's state goes into a checkpoint next to the model (save_state) and comes back from it (load_state).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint.hpp"
#include "module.hpp"

namespace tapegrad {

class Optimizer {
 public:
  Optimizer(std::vector<Parameter> params, double lr);
  virtual ~Optimizer() = default;

  // One update of every parameter from its gradient, at lr().
  void step() { update(1.0f, false); }
  // A training loop's step in one pass over the parameters: each gradient multiplied by grad_scale as it is read
  // (clip_scale()'s factor), the update, and the gradient set to zero once read. The same bits as scaling the
  // gradients (clip_grad_norm), step() and zero_grad(), which take three passes.
  void step_and_zero_grad(float grad_scale = 1.0f) { update(grad_scale, true); }
  virtual std::string_view name() const = 0;  // "SGD", "AdamW"
  // Every parameter's gradient to zero.
  void zero_grad();

  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  int64_t steps() const { return t_; }
  std::vector<Parameter>& parameters() { return params_; }

  // Adds the state (per-parameter buffers as "optimizer.<buffer>.<parameter name>", the step count in the
  // metadata) to a checkpoint; load_state reads it back, checking every buffer's presence and shape first, so
  // that a checkpoint that does not fit changes nothing. Errors name `path`.
  void save_state(Checkpoint& ck) const;
  void load_state(const Checkpoint& ck, const std::string& path);

 protected:
  // The state buffers, one tensor per parameter each, by name ("exp_avg", "momentum_buffer", ...).
  struct Buffer {
    std::string name;
    std::vector<Tensor> tensors;
    bool non_negative = false;  // a mean of squares: a negative value in a checkpoint is a damaged one
  };
  virtual std::vector<Buffer*> buffers() = 0;
  // The update, reading each gradient element as grad·grad_scale and, where zero_grads, leaving 0 in its place:
  // what an optimizer of one's own implements (step() and step_and_zero_grad() call it).
  virtual void update(float grad_scale, bool zero_grads) = 0;
  virtual std::string_view steps_key() const = 0;  // the metadata key of the step count
  std::vector<Tensor> zeros_like_parameters() const;

  std::vector<Parameter> params_;
  double lr_;
  int64_t t_ = 0;
};

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;  // L2, added to the gradient of every parameter with Parameter::decay
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  explicit SGD(std::vector<Parameter> params, SGDOptions opt = {});
  std::string_view name() const override { return "SGD"; }
  const SGDOptions& options() const { return opt_; }

 private:
  std::vector<Buffer*> buffers() override { return {&momentum_}; }
  std::string_view steps_key() const override { return "tapegrad.sgd_steps"; }
  void update(float grad_scale, bool zero_grads) override;
  SGDOptions opt_;
  Buffer momentum_{"momentum_buffer", {}};
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.01;  // decoupled, only where Parameter::decay
};

class AdamW : public Optimizer {
 public:
  explicit AdamW(std::vector<Parameter> params, AdamWOptions opt = {});
  std::string_view name() const override { return "AdamW"; }
  const AdamWOptions& options() const { return opt_; }
  // The moments per parameter, in the order of parameters().
  std::vector<Tensor>& first_moments() { return m_.tensors; }
  std::vector<Tensor>& second_moments() { return v_.tensors; }

 private:
  std::vector<Buffer*> buffers() override { return {&m_, &v_}; }
  std::string_view steps_key() const override { return "tapegrad.adam_steps"; }
  void update(float grad_scale, bool zero_grads) override;
  AdamWOptions opt_;
  Buffer m_{"exp_avg", {}}, v_{"exp_avg_sq", {}, true};
};

// lr(it): linear warm-up lr·(it+1)/(warmup+1) for it < warmup, then cosine from lr down to min_lr at decay_iters.
double learning_rate(int64_t it, double lr, double min_lr, int64_t warmup, int64_t decay_iters);

// Scales all gradients by min(1, max_norm/(‖g‖ + 1e-6)); returns the norm before clipping.
double clip_grad_norm(const std::vector<Parameter>& params, double max_norm);
// ‖g‖ over all the gradients (clip_grad_norm's norm), and the factor clipping to max_norm scales them by:
// min(1, max_norm/(‖g‖ + 1e-6)) as a float (1 where the norm is within max_norm).
double grad_norm(const std::vector<Parameter>& params);
float clip_scale(double norm, double max_norm);

}  // namespace tapegrad
