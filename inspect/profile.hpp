// Where the time of a step goes, op by op.
//
// A Profile attached to a tape (tape.add_observer(&profile), engine/tape_observer.hpp) reads the clock at each event and charges the time since the
// previous event to what the event ends:
//   a node recorded          → its op's forward   (the op computed its output just before recording it)
//   a node's VJP returned    → its op's backward  (timed around the call)
//   gradient buffers made    → "tape: gradient buffers"  (the x̄ a VJP adds into, zeroed, or a fresh one it writes)
//   a leaf or parameter made → "tape: leaves and glue"   (with whatever the caller did since the last event)
//   backward or clear() ends → "tape: backward" / "tape: clear"
// and the caller names what it does outside the tape with mark("optimizer: AdamW"), the same way. Between pause()
// and resume() nothing is charged (evaluation, logging). Every interval is charged to exactly one row, so the rows
// add up to the time profiled; a caller that also times its steps can compare the two (format_profile does).
//
// FLOPs come from the cost function an op registered (OpSheet::cost), evaluated on each recorded node's shapes.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "../engine/tape_observer.hpp"

namespace tapegrad {

class Registry;

class Profile final : public TapeObserver {
 public:
  // `costs`: where ops' cost functions are found (nullptr: no FLOPs).
  explicit Profile(const Registry* costs = nullptr) : costs_(costs) {}

  struct Row {
    std::string name;
    bool op = false;           // a node's op (forward and backward) rather than a section outside ops
    int64_t calls = 0;         // forward calls (a section: times charged)
    double forward_ms = 0;     // an op's forward; a section's whole time
    double backward_ms = 0;    // an op's VJPs
    double forward_flops = 0;  // from the op's cost function; 0 if it has none
    double backward_flops = 0;
    double ms() const { return forward_ms + backward_ms; }
  };

  void start();                  // the clock starts (again): time before this is not charged
  void pause();                  // stops the clock: the time since the last event is not charged (mark() it first)
  void resume();                 // = start()
  void end_step() { ++steps_; }  // counts steps, for per-step figures
  // Charges the time since the last event to section `name` outside ops.
  void mark(std::string_view name);

  // Tape events (engine/tape_observer.hpp).
  void on_leaf(const Tape&, const Tensor&) override;
  void on_output(const Tape&, const char* op, std::span<const Var> inputs, const Tensor& out) override;
  void on_backward_begin(const Tape&, const Tensor&) override;
  void on_vjp_begin(const Tape&, const Node&) override;  // the time before a VJP: its gradient buffers
  void on_vjp_end(const Tape&, const Node& n, std::span<const Tensor>) override;
  void on_backward_end(const Tape&) override;
  void on_clear(const Tape&) override;

  const std::vector<Row>& rows() const { return rows_; }
  int64_t steps() const { return steps_; }
  double total_ms() const;  // sum of every row

 private:
  using Clock = std::chrono::steady_clock;
  double lap();  // ms since the last event; the event is now
  Row& row(std::string_view name, bool op);

  const Registry* costs_;
  std::vector<Row> rows_;
  Clock::time_point last_{};
  bool running_ = false;
  int64_t steps_ = 0;
};

// The profile as a table per step: op rows by time, then sections outside ops; calls, forward ms, backward ms,
// share, GFLOP/s where the op has a cost; the sum of the rows against `measured_step_ms` (when positive).
std::string format_profile(const Profile& p, double measured_step_ms, std::string_view title);
// The same as JSON: {steps, measured_step_ms (the mean of the steps profiled), profiled_step_ms, rows: [{name, kind, calls, forward_ms,
// backward_ms, ms, share, gflops}]}, figures per step.
nlohmann::json profile_json(const Profile& p, double measured_step_ms);

}  // namespace tapegrad
