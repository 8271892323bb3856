// What watches a tape without being part of it: anomaly detection (inspect/anomaly.hpp), the profile
// (inspect/profile.hpp), the names of scopes (inspect/scope_names.hpp) and what each node allocated
// (inspect/allocation_log.hpp) are observers. Attach one with tape.add_observer(&o) and take it off with
// tape.remove_observer(&o) before it dies; a tape without observers pays one branch per event.
//
// Every hook does nothing unless overridden. The tape calls them in the order the observers were added; a hook may
// throw (anomaly detection does), which stops what the tape was doing, as any Error would.
#pragma once

#include <span>
#include <string_view>

#include "tape.hpp"

namespace tapegrad {

struct TapeObserver {
  virtual ~TapeObserver() = default;

  // Recording.
  // A leaf (input, constant, parameter) is about to be added: it will be value #tape.num_values().
  virtual void on_leaf(const Tape&, const Tensor& /*value*/) {}
  // tape.empty / tape.zeros handed out `t`; `what` names it where the op names it (nullptr otherwise).
  virtual void on_allocation(const Tape&, const Tensor& /*t*/, const char* /*what*/) {}
  // An op computed `out` from `inputs`, recorded or not (within a NoGradGuard): it will be value #tape.num_values().
  virtual void on_output(const Tape&, const char* /*op*/, std::span<const Var> /*inputs*/, const Tensor& /*out*/) {}
  // Node `n` was recorded: the tape's last node.
  virtual void on_record(const Tape&, const Node& /*n*/) {}
  // A TapeScope opened or closed (scopes nest).
  virtual void on_scope_enter(const Tape&, std::string_view /*name*/) {}
  virtual void on_scope_exit(const Tape&) {}

  // Differentiation.
  virtual void on_backward_begin(const Tape&, const Tensor& /*seed*/) {}
  // Around the VJP of node n, in backward and in hvp: gin are the gradients it added into (undefined where an
  // input needs none).
  virtual void on_vjp_begin(const Tape&, const Node& /*n*/) {}
  virtual void on_vjp_end(const Tape&, const Node& /*n*/, std::span<const Tensor> /*gin*/) {}
  virtual void on_backward_end(const Tape&) {}
  // Forward mode: node n's JVP made `tout`, the tangent of its output.
  virtual void on_jvp_end(const Tape&, const Node& /*n*/, const Tensor& /*tout*/) {}

  // The tape forgot its recording (Tape::clear).
  virtual void on_clear(const Tape&) {}
};

}  // namespace tapegrad
