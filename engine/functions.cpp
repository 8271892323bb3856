#include "engine/functions.hpp"

namespace tapegrad {

// ---- whole-function derivatives, each on a private tape ----

namespace {
std::vector<Var> leaves(Tape& tape, std::span<const Tensor> inputs) {
  std::vector<Var> xs;
  for (const Tensor& x : inputs) xs.push_back(tape.leaf(x, x.dtype() != DType::i32));
  return xs;
}
// One result per input: undefined for an integer input, else `t` if defined, else zeros.
Tensor per_input(const Tensor& input, const Tensor& t) {
  if (input.dtype() == DType::i32) return {};
  return t.defined() ? t : Tensor::zeros(input.dtype(), input.shape());
}
}  // namespace

Tensor evaluate(const Function& f, std::span<const Tensor> inputs) {
  Tape tape;
  NoGradGuard no_grad(tape);
  auto xs = leaves(tape, inputs);
  return f(tape, xs).value().clone();
}

std::pair<Tensor, Tensor> jvp(const Function& f, std::span<const Tensor> inputs, std::span<const Tensor> tangents,
                              TapeObserver* observer) {
  if (tangents.size() != inputs.size()) fail("jvp: {} tangents given for {} inputs", tangents.size(), inputs.size());
  Tape tape;
  if (observer) tape.add_observer(observer);
  auto xs = leaves(tape, inputs);
  for (size_t i = 0; i < xs.size(); ++i)
    if (tangents[i].defined()) tape.set_tangent(xs[i], tangents[i]);
  Var y = f(tape, xs);
  tape.propagate_tangents();
  Tensor t = tape.tangent(y);
  return {y.value().clone(), t.defined() ? t.clone() : Tensor::zeros(y.dtype(), y.shape())};
}

std::vector<Tensor> vjp(const Function& f, std::span<const Tensor> inputs, const Tensor& cotangent,
                        TapeObserver* observer) {
  Tape tape;
  if (observer) tape.add_observer(observer);
  auto xs = leaves(tape, inputs);
  Var y = f(tape, xs);
  if (y.requires_grad()) tape.backward(y, cotangent);  // else y does not depend on the inputs: zero gradients
  std::vector<Tensor> grads;
  for (size_t i = 0; i < xs.size(); ++i) {
    Tensor g = xs[i].requires_grad() && y.requires_grad() ? xs[i].grad() : Tensor{};
    grads.push_back(per_input(inputs[i], g.defined() ? g.clone() : g));
  }
  return grads;
}

std::vector<Tensor> hvp(const Function& f, std::span<const Tensor> inputs, const Tensor& cotangent,
                        std::span<const Tensor> directions) {
  if (directions.size() != inputs.size())
    fail("hvp: {} directions given for {} inputs", directions.size(), inputs.size());
  Tape tape;
  auto xs = leaves(tape, inputs);
  std::vector<Var> wrt;
  std::vector<Tensor> dirs;
  for (size_t i = 0; i < xs.size(); ++i)
    if (inputs[i].dtype() != DType::i32) {
      wrt.push_back(xs[i]);
      dirs.push_back(per_input(inputs[i], directions[i]));
    }
  Var y = f(tape, xs);
  std::vector<Tensor> h, out;
  if (y.requires_grad()) h = tape.hvp(y, cotangent, wrt, dirs).hvp;
  for (size_t i = 0, k = 0; i < inputs.size(); ++i)
    out.push_back(per_input(inputs[i], inputs[i].dtype() != DType::i32 && !h.empty() ? h[k++] : Tensor{}));
  return out;
}

}  // namespace tapegrad
