// Anomaly detection: while an AnomalyCheck is attached to a tape, every op's output, every leaf, every seed of
// backward, every gradient a VJP adds into and every tangent a JVP produces is checked for NaN and ±∞; the first
// one found throws an Error "non-finite value from <op> ...", naming the node's op and the shapes. A log_softmax of
// a −∞-masked row legitimately holds −∞; anomaly detection reports it too.
//
//   AnomalyCheck check(tape);                    // until `check` goes out of scope
//   AnomalyCheck check(tape, cfg.detect_anomaly); // attached only when asked for
#pragma once

#include "../engine/tape_observer.hpp"

namespace tapegrad {

class AnomalyCheck final : public TapeObserver {
 public:
  explicit AnomalyCheck(Tape& tape, bool on = true) : tape_(on ? &tape : nullptr) {
    if (tape_) tape_->add_observer(this);
  }
  ~AnomalyCheck() override {
    if (tape_) tape_->remove_observer(this);
  }
  AnomalyCheck(const AnomalyCheck&) = delete;
  AnomalyCheck& operator=(const AnomalyCheck&) = delete;

  void on_leaf(const Tape&, const Tensor& value) override;
  void on_output(const Tape&, const char* op, std::span<const Var> inputs, const Tensor& out) override;
  void on_backward_begin(const Tape&, const Tensor& seed) override;
  void on_vjp_end(const Tape&, const Node& n, std::span<const Tensor> gin) override;
  void on_jvp_end(const Tape&, const Node& n, const Tensor& tout) override;

 private:
  Tape* tape_;
};

}  // namespace tapegrad
