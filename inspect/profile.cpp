#include "inspect/profile.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "ops/registry.hpp"

namespace tapegrad {

double Profile::lap() {
  const auto now = Clock::now();
  const double ms = running_ ? std::chrono::duration<double, std::milli>(now - last_).count() : 0.0;
  last_ = now;
  return ms;
}

Profile::Row& Profile::row(std::string_view name, bool op) {
  for (Row& r : rows_)
    if (r.op == op && r.name == name) return r;
  rows_.push_back(Row{std::string(name), op});
  return rows_.back();
}

void Profile::start() {
  running_ = true;
  last_ = Clock::now();
}

void Profile::pause() { running_ = false; }

void Profile::resume() { start(); }

void Profile::mark(std::string_view name) {
  if (!running_) return;
  const double ms = lap();
  Row& r = row(name, false);
  r.forward_ms += ms;
  ++r.calls;
}

namespace {
constexpr const char* kLeavesAndGlue = "tape: leaves and glue";
constexpr const char* kGradientBuffers = "tape: gradient buffers";
constexpr const char* kBackwardOther = "tape: backward (other)";
constexpr const char* kClear = "tape: clear";
}  // namespace

void Profile::on_leaf(const Tape&, const Tensor&) { mark(kLeavesAndGlue); }
void Profile::on_backward_begin(const Tape&, const Tensor&) { mark(kLeavesAndGlue); }
void Profile::on_backward_end(const Tape&) { mark(kBackwardOther); }
void Profile::on_clear(const Tape&) { mark(kClear); }

void Profile::on_output(const Tape&, const char* op, std::span<const Var> in, const Tensor& out) {
  if (!running_) return;
  std::vector<Shape> inputs;
  inputs.reserve(in.size());
  for (const Var& v : in) inputs.push_back(v.shape());
  const Shape& output = out.shape();
  const double ms = lap();
  Row& r = row(op, true);
  r.forward_ms += ms;
  ++r.calls;
  if (!costs_) return;
  if (const OpSheet* info = costs_->find(op); info && info->cost) {
    const OpCost c = info->cost(inputs, output);
    r.forward_flops += c.forward;
    r.backward_flops += c.backward;
  }
  last_ = Clock::now();  // the cost function's time is the profile's own
}

void Profile::on_vjp_begin(const Tape&, const Node&) {
  if (!running_) return;
  const double ms = lap();
  Row& r = row(kGradientBuffers, false);
  r.forward_ms += ms;
  ++r.calls;
}

void Profile::on_vjp_end(const Tape&, const Node& n, std::span<const Tensor>) {
  if (!running_) return;
  const double ms = lap();
  row(n.op, true).backward_ms += ms;
}

double Profile::total_ms() const {
  double s = 0;
  for (const Row& r : rows_) s += r.ms();
  return s;
}

namespace {

// Rows in the order shown: ops by time, then sections by time.
std::vector<const Profile::Row*> ordered(const Profile& p) {
  std::vector<const Profile::Row*> rows;
  for (const auto& r : p.rows()) rows.push_back(&r);
  std::stable_sort(rows.begin(), rows.end(), [](const Profile::Row* a, const Profile::Row* b) {
    if (a->op != b->op) return a->op;
    return a->ms() > b->ms();
  });
  return rows;
}

// GFLOP/s of a row: its FLOPs over its time, forward and backward together; NaN without a cost.
double gflops(const Profile::Row& r) {
  const double flops = r.forward_flops + r.backward_flops;
  return flops > 0 && r.ms() > 0 ? flops / r.ms() / 1e6 : NAN;
}

}  // namespace

std::string format_profile(const Profile& p, double measured_step_ms, std::string_view title) {
  const double steps = static_cast<double>(std::max<int64_t>(p.steps(), 1));
  const double total = p.total_ms() / steps;
  std::string s = fmt::format("{}: {} steps, figures per step\n", title, p.steps());
  s += fmt::format("  {:<28} {:>7} {:>9} {:>9} {:>9} {:>6} {:>8}\n", "op / outside ops", "calls", "fwd ms", "bwd ms",
                   "total ms", "share", "GFLOP/s");
  bool sections = false;
  for (const Profile::Row* r : ordered(p)) {
    if (!r->op && !sections) {
      s += "  outside ops:\n";
      sections = true;
    }
    const double ms = r->ms() / steps;
    const double g = gflops(*r);
    s += fmt::format("  {:<28} {:>7.4g} {:>9} {:>9} {:>9.3f} {:>5.1f}% {:>8}\n", r->name,
                     static_cast<double>(r->calls) / steps, r->op ? fmt::format("{:.3f}", r->forward_ms / steps) : "",
                     r->op ? fmt::format("{:.3f}", r->backward_ms / steps) : "", ms, total > 0 ? 100 * ms / total : 0.0,
                     std::isnan(g) ? "" : fmt::format("{:.1f}", g));
  }
  s += fmt::format("  {:<28} {:>7} {:>9} {:>9} {:>9.3f}\n", "sum of the rows", "", "", "", total);
  if (measured_step_ms > 0)
    s += fmt::format("  {:<28} {:>37.3f}  (rows {:+.1f}%)\n", "measured step (mean)", measured_step_ms,
                     100 * (total / measured_step_ms - 1));
  return s;
}

nlohmann::json profile_json(const Profile& p, double measured_step_ms) {
  const double steps = static_cast<double>(std::max<int64_t>(p.steps(), 1));
  const double total = p.total_ms() / steps;
  nlohmann::json rows = nlohmann::json::array();
  for (const Profile::Row* r : ordered(p)) {
    const double g = gflops(*r);
    rows.push_back({{"name", r->name},
                    {"kind", r->op ? "op" : "outside"},
                    {"calls", static_cast<double>(r->calls) / steps},
                    {"forward_ms", r->op ? nlohmann::json(r->forward_ms / steps) : nlohmann::json(nullptr)},
                    {"backward_ms", r->op ? nlohmann::json(r->backward_ms / steps) : nlohmann::json(nullptr)},
                    {"ms", r->ms() / steps},
                    {"share", total > 0 ? r->ms() / steps / total : 0.0},
                    {"gflops", std::isnan(g) ? nlohmann::json(nullptr) : nlohmann::json(g)}});
  }
  return {{"steps", p.steps()},
          {"measured_step_ms", measured_step_ms > 0 ? nlohmann::json(measured_step_ms) : nlohmann::json(nullptr)},
          {"profiled_step_ms", total},
          {"rows", rows}};
}

}  // namespace tapegrad
