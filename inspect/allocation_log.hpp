// What each node allocated: attached to a tape before recording, an AllocationLog lists for every node the
// tensors its op took from tape.empty / tape.zeros between the previous node or leaf and its record: its output
// ("output") and the tensors its VJP and JVP keep, by the name the op gave them ("A = softmax(S)", "μ").
// Gradient and tangent buffers are not a node's. gradcheck's explain and the drawing (DotOptions::allocations)
// show them.
//
//   AllocationLog log(tape);
//   Var o = attention(q, k, v);
//   for (const Allocation& a : log.of(0)) ...   // node 0's
#pragma once

#include <span>
#include <vector>

#include "../engine/tape_observer.hpp"

namespace tapegrad {

struct Allocation {
  const char* what;  // nullptr: unnamed
  DType dtype;
  Shape shape;
  size_t bytes;
};

class AllocationLog final : public TapeObserver {
 public:
  explicit AllocationLog(Tape& tape) : tape_(tape) { tape_.add_observer(this); }
  ~AllocationLog() override { tape_.remove_observer(this); }
  AllocationLog(const AllocationLog&) = delete;
  AllocationLog& operator=(const AllocationLog&) = delete;

  // Node k's allocations (empty for a node recorded before the log was attached); throws for a k out of range.
  std::span<const Allocation> of(size_t node) const;

  void on_leaf(const Tape&, const Tensor&) override { pending_.clear(); }
  void on_allocation(const Tape&, const Tensor& t, const char* what) override;
  void on_record(const Tape&, const Node& n) override;
  void on_clear(const Tape&) override;

 private:
  struct Pending {
    Allocation a;
    const void* data;
  };
  Tape& tape_;
  std::vector<Pending> pending_;                  // since the last node or leaf
  std::vector<std::vector<Allocation>> by_node_;  // by node index
};

}  // namespace tapegrad
