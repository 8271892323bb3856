#include "inspect/allocation_log.hpp"

namespace tapegrad {

void AllocationLog::on_allocation(const Tape&, const Tensor& t, const char* what) {
  pending_.push_back({{what, t.dtype(), t.shape(), t.nbytes()}, t.raw()});
}

void AllocationLog::on_record(const Tape& tape, const Node& n) {
  by_node_.resize(tape.num_nodes());
  std::vector<Allocation>& mine = by_node_.back();
  const void* out = tape.value_at(n.out).raw();
  for (const Pending& p : pending_) {
    mine.push_back(p.a);
    if (p.data == out && !mine.back().what) mine.back().what = "output";
  }
  pending_.clear();
}

void AllocationLog::on_clear(const Tape&) {
  pending_.clear();
  by_node_.clear();
}

std::span<const Allocation> AllocationLog::of(size_t node) const {
  if (node >= tape_.num_nodes())
    fail("allocations: node #{} does not exist on this tape ({} nodes)", node, tape_.num_nodes());
  if (node >= by_node_.size()) return {};
  return by_node_[node];
}

}  // namespace tapegrad
