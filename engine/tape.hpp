// The tape: a Wengert list of nodes, each with the VJP that reverse mode needs and the JVP that forward mode
// needs, next to the values and gradients it owns.
//
//   y = f(x):  forward computes y, records a node {op, inputs, output, vjp, jvp}
//   backward:  for nodes in reverse,  x̄ += VJP(ȳ)  = J(x)ᵀ ȳ      (adds: a value used twice gets the sum)
//   jvp:       for nodes in order,    ẏ  = JVP(ẋ) = J(x) ẋ        (the total derivative dF(θ)·θ̃)
//   hvp:       forward mode, then reverse mode that carries the tangent of every cotangent (forward over
//              reverse): for nodes in reverse,  x̄ += Jᵢᵀȳ  and  ẋ̄ᵢ += Jᵢᵀ ȳ̇ + Σⱼ ∂ⱼ(Jᵢᵀȳ)[ẋⱼ]
//              (the first term is the VJP again; the second, the op's second-order rule, is zero for ops
//              linear in their inputs). It keeps every value's tangent to the end, and a value's cotangent
//              and its tangent until the value's node has run (as backward releases gradients). Work: for a
//              product Y = AB of cost F a gradient is 3F and an HVP 9F (Ẏ = ȦB + AḂ, the VJPs of ȳ and ȳ̇,
//              the rule's ȳḂᵀ and Ȧᵀȳ), so about three gradients where products dominate (bench --only hvp).
//
// Values are handles (Var) into the tape. Their memory comes from the tape's arena, which clear() rewinds
// without freeing, so a training step after the first allocates nothing. A Var carries the tape's generation:
// using it after clear() throws instead of reading freed memory.
//
// Gradients of intermediate values (outputs of nodes) live only while backward needs them: once the node that
// produced a value has run its VJP, the value's gradient buffer goes back to the tape, and a later gradient of
// the same size or smaller reuses it, so backward holds a few gradients at a time instead of one per value.
// retain_grad(v) keeps v's gradient readable after backward, set_retain_grads(true) every value's (at the cost of
// one gradient per value). Leaves (inputs, parameters) always keep theirs.
//
// The tape itself only records and differentiates. What watches it (anomaly detection, the profile, scope names
// for the drawing, what each node allocated) is a TapeObserver (engine/tape_observer.hpp) attached to it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <new>
#include <optional>
#include <ostream>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "arena.hpp"
#include "scratch.hpp"
#include "source_place.hpp"
#include "tensor.hpp"

namespace tapegrad {

class Tape;
struct TapeObserver;  // engine/tape_observer.hpp

class Var {
 public:
  Var() = default;
  Tape& tape() const;
  const Tensor& value() const;
  const Shape& shape() const { return value().shape(); }
  DType dtype() const { return value().dtype(); }
  int rank() const { return shape().rank(); }
  Tensor grad() const;  // undefined until backward has reached this value (and after, unless kept: see above)
  bool requires_grad() const;
  uint32_t id() const { return id_; }
  bool defined() const { return tape_ != nullptr; }
  // Defined, and recorded since the tape's last clear(): its value can be read.
  bool live() const;

 private:
  friend class Tape;
  Var(Tape* t, uint32_t id, uint32_t gen) : tape_(t), id_(id), gen_(gen) {}
  Tape* tape_ = nullptr;
  uint32_t id_ = 0;
  uint32_t gen_ = 0;
};

// A recorded node. gin[i] / tin[i] are undefined where input i needs no gradient / has no tangent. VJP and JVP add
// into gin and tout (zeroed by the tape), the only tensors they may write: gout, tin and saved values are const.
// A node marked writes_fresh (Tape::vjp_writes_fresh) may instead write gin[i] where Tape::fresh_gradient(i) says
// the buffer is fresh: backward has not zeroed it, and this VJP is the first to give the input a gradient.
class Node {
 public:
  Node(const char* op_name, uint32_t out_id, std::span<const uint32_t> input_ids, size_t kept, SourcePlace at)
      : op(op_name), out(out_id), inputs(input_ids), bytes_kept(kept), where(at) {}
  virtual ~Node() = default;
  virtual void vjp(const Tensor& gout, std::span<Tensor> gin) const = 0;
  virtual void jvp(std::span<const Tensor> tin, Tensor& tout) const = 0;
  // Second order: the tangent of the VJP at a fixed cotangent, gin_dot[i] += Σⱼ ∂ⱼ(Jᵢᵀ gout)[tin[j]] (tin[j]
  // undefined: no tangent). has_second_order() is false for an op recorded without the rule.
  virtual bool has_second_order() const { return false; }
  virtual void vjp_tangent(const Tensor&, std::span<const Tensor>, std::span<Tensor>) const {}
  const char* op;
  uint32_t out;
  std::span<const uint32_t> inputs;
  // Arena bytes the op allocated since the tape's previous node or leaf: its output and what its VJP and JVP keep.
  size_t bytes_kept;
  SourcePlace where;          // the op's tape.record call: its forward, with the VJP and JVP it passes
  bool writes_fresh = false;  // its VJP writes each fresh gradient in full (see above)
};

class Tape {
 public:
  explicit Tape(size_t arena_block_bytes = size_t{1} << 20) : arena_(arena_block_bytes) {}
  ~Tape() { destroy_nodes(); }
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  // Leaves. A leaf's gradient is allocated on the tape when backward reaches it; a parameter's gradient
  // is the caller's tensor, which backward adds into (and which outlives clear()).
  Var leaf(const Tensor& value, bool requires_grad = true);
  Var param(const Tensor& value, const Tensor& grad);
  Var constant(const Tensor& value) { return leaf(value, false); }

  // Arena memory, valid until clear(). `what` names the tensor for observers that list what a node keeps
  // (inspect/allocation_log.hpp): "A" for attention's probabilities, "μ" and "ρ" for layer_norm's statistics.
  Tensor empty(DType dtype, Shape shape, const char* what = nullptr);
  Tensor zeros(DType dtype, Shape shape, const char* what = nullptr) {
    Tensor t = empty(dtype, shape, what);
    return t.fill_zero(), t;
  }

  struct NoSecondOrder {};   // recorded without a second-order rule: hvp refuses the op
  struct LinearInInputs {};  // the second-order rule of an op linear in its inputs: Σⱼ ∂ⱼ(Jᵢᵀȳ) = 0
  static constexpr LinearInInputs linear_in_inputs{};
  // Records `out` as the result of `op` on `inputs`. vjp: (const Tensor& gout, std::span<Tensor> gin);
  // jvp: (std::span<const Tensor> tin, Tensor& tout); the closures hold exactly what they reuse. `second`,
  // the op's second-order rule (for hvp), when given: (const Tensor& gout, std::span<const Tensor> tin,
  // std::span<Tensor> gin_dot) (see Node), or linear_in_inputs for an op whose VJP does not depend on its inputs.
  template <class Vjp, class Jvp, class Second>
  Var record(const char* op, std::span<const Var> inputs, Tensor out, Vjp&& vjp, Jvp&& jvp, Second&& second,
             SourcePlace where = SourcePlace::current()) {
    using N = NodeImpl<std::decay_t<Vjp>, std::decay_t<Jvp>, std::decay_t<Second>>;
    return record_node<N>(op, inputs, std::move(out), where, std::forward<Vjp>(vjp), std::forward<Jvp>(jvp),
                          std::forward<Second>(second));
  }
  template <class Vjp, class Jvp, class Second>
  Var record(const char* op, std::initializer_list<Var> inputs, Tensor out, Vjp&& vjp, Jvp&& jvp, Second&& second,
             SourcePlace where = SourcePlace::current()) {
    return record(op, std::span<const Var>(inputs.begin(), inputs.size()), std::move(out), std::forward<Vjp>(vjp),
                  std::forward<Jvp>(jvp), std::forward<Second>(second), where);
  }
  template <class Vjp, class Jvp>
  Var record(const char* op, std::span<const Var> inputs, Tensor out, Vjp&& vjp, Jvp&& jvp,
             SourcePlace where = SourcePlace::current()) {
    return record(op, inputs, std::move(out), std::forward<Vjp>(vjp), std::forward<Jvp>(jvp), NoSecondOrder{}, where);
  }
  template <class Vjp, class Jvp>
  Var record(const char* op, std::initializer_list<Var> inputs, Tensor out, Vjp&& vjp, Jvp&& jvp,
             SourcePlace where = SourcePlace::current()) {
    return record(op, std::span<const Var>(inputs.begin(), inputs.size()), std::move(out), std::forward<Vjp>(vjp),
                  std::forward<Jvp>(jvp), NoSecondOrder{}, where);
  }

  // Fresh gradients. An op whose VJP can write an input's gradient rather than add into it marks its node right
  // after recording it (y: the output record() returned). backward then gives the node's inputs that no node has
  // given a gradient yet a buffer it has not zeroed, and the VJP asks fresh_gradient(i), for input i (the index of
  // gin), whether to write gin[i] whole (true) or to add into it (false, as every VJP does). What backward saves is
  // zeroing the buffer and the VJP's reading it back: the bits are the same, since 0 + v is v. False outside a
  // VJP that backward runs, in hvp, and for an input the node takes twice.
  void vjp_writes_fresh(Var y);
  bool fresh_gradient(size_t input) const { return input < fresh_.size() && fresh_[input] != 0; }

  // Reverse mode. A scalar y is seeded with 1; any other y needs a seed of its shape. Once per recording.
  void backward(Var y, const Tensor& seed = {});
  // Keeps the gradient of v, an intermediate value, readable through v.grad() after backward.
  void retain_grad(Var v) { values_[(rec(v, "retain_grad"), v.id_)].retain_grad = true; }
  // Keeps the gradients of all intermediate values (as retain_grad does for one), from the next backward on.
  void set_retain_grads(bool on) { retain_grads_ = on; }
  bool retain_grads() const { return retain_grads_; }

  // Hessian-vector products of s = ⟨seed, y⟩ (seed 1 for a scalar y): H·v for the leaves `wrt` along the
  // directions (one each, their shapes), by forward over reverse (top of this file), and s's gradient with respect
  // to them (gradient[i]). Throws naming the first op on the way without a second-order rule. Runs forward mode
  // over the recording (the leaves' tangents become the directions); backward may still be called after.
  struct HessianVectorProduct {
    std::vector<Tensor> gradient, hvp;
  };
  HessianVectorProduct hvp(Var y, const Tensor& seed, std::span<const Var> wrt, std::span<const Tensor> directions);

  // Forward mode over what was recorded: set tangents on leaves, then propagate to every value.
  void set_tangent(Var leaf, const Tensor& tangent);
  void propagate_tangents();
  Tensor tangent(Var v) const { return rec(v).tangent; }  // undefined if v depends on no value with a tangent

  // Forgets every node and value; Vars from before become invalid. Keeps the arena's memory.
  void clear();

  // Observers (engine/tape_observer.hpp), called in the order added. The tape does not own them.
  void add_observer(TapeObserver* o) { observers_.push_back(o); }
  void remove_observer(TapeObserver* o) { std::erase(observers_, o); }
  std::span<TapeObserver* const> observers() const { return observers_; }

  bool recording() const { return recording_; }
  size_t num_nodes() const { return nodes_.size(); }
  size_t num_values() const { return values_.size(); }
  const Node& node(size_t i) const { return *nodes_[i]; }
  const Arena& arena() const { return arena_; }
  Scratch& scratch() const { return scratch_; }  // the rules' working memory (engine/scratch.hpp), kept by clear()
  uint32_t generation() const { return generation_; }

  // Used by Var; throw if v is not a live value of this tape.
  const Tensor& value(const Var& v) const { return rec(v).value; }
  Tensor grad(const Var& v) const { return rec(v).grad; }
  bool requires_grad(const Var& v) const { return rec(v).requires_grad; }

  // The recording read by value id (0 ≤ id < num_values(), in the order made; Node::out and Node::inputs are
  // ids), for tools that inspect or draw a tape (inspect/tape_dot.hpp). Each throws for an id out of range.
  const Tensor& value_at(uint32_t id) const { return at(id).value; }
  Tensor grad_at(uint32_t id) const { return at(id).grad; }  // undefined where none is held (see the top)
  bool requires_grad_at(uint32_t id) const { return at(id).requires_grad; }
  bool is_leaf(uint32_t id) const { return at(id).leaf; }    // made by leaf(), param() or constant()
  bool is_param(uint32_t id) const { return at(id).param; }  // made by param(): its gradient is the caller's
  Var var_at(uint32_t id) { return Var(this, (static_cast<void>(at(id)), id), generation_); }  // the value as a Var
  // The value backward was called on, once it has been in this recording.
  std::optional<uint32_t> backward_output() const {
    return backward_done_ ? std::optional<uint32_t>(backward_output_) : std::nullopt;
  }

 private:
  friend class NoGradGuard;
  friend class TapeScope;
  struct ValueRec {
    Tensor value, grad, tangent;
    bool requires_grad = false;
    bool leaf = true;          // not the output of a recorded node
    bool retain_grad = false;  // an intermediate whose gradient outlives backward
    bool param = false;        // made by param()
  };
  // The records, in blocks that never move: a reference to one (Var::value(), Var::shape()) stays valid while the
  // tape records more values, until clear() (a vector would move them as it grew). The blocks are kept across
  // clear(), so a training step after the first allocates none.
  class ValueRecords {
   public:
    ValueRec& operator[](size_t i) { return blocks_[i / kBlock][i % kBlock]; }
    const ValueRec& operator[](size_t i) const { return blocks_[i / kBlock][i % kBlock]; }
    size_t size() const { return size_; }
    ValueRec& back() { return (*this)[size_ - 1]; }
    void push_back(ValueRec r) {
      if (size_ == blocks_.size() * kBlock) blocks_.push_back(std::make_unique<ValueRec[]>(kBlock));
      (*this)[size_++] = std::move(r);
    }
    void clear() {  // the records' tensors are released; their blocks stay
      for (size_t i = 0; i < size_; ++i) (*this)[i] = ValueRec{};
      size_ = 0;
    }

   private:
    static constexpr size_t kBlock = 256;
    std::vector<std::unique_ptr<ValueRec[]>> blocks_;
    size_t size_ = 0;
  };
  template <class Vjp, class Jvp, class Second>
  struct NodeImpl final : Node {
    NodeImpl(const char* name, uint32_t y, std::span<const uint32_t> xs, size_t kept, SourcePlace at, Vjp v, Jvp j,
             Second s)
        : Node(name, y, xs, kept, at), vjp_fn(std::move(v)), jvp_fn(std::move(j)), second_fn(std::move(s)) {}
    void vjp(const Tensor& gout, std::span<Tensor> gin) const override { vjp_fn(gout, gin); }
    void jvp(std::span<const Tensor> tin, Tensor& tout) const override { jvp_fn(tin, tout); }
    bool has_second_order() const override { return !std::is_same_v<Second, NoSecondOrder>; }
    void vjp_tangent(const Tensor& gout, std::span<const Tensor> tin, std::span<Tensor> gin_dot) const override {
      if constexpr (!std::is_same_v<Second, NoSecondOrder> && !std::is_same_v<Second, LinearInInputs>)
        second_fn(gout, tin, gin_dot);
    }
    mutable Vjp vjp_fn;  // mutable: a closure may write scratch it captured, saying so with a `mutable` lambda
    mutable Jvp jvp_fn;
    [[no_unique_address]] mutable Second second_fn;
  };

  // The output becomes a value; when recording, the node (in the arena, with its inputs' ids) follows it.
  template <class N, class... Closures>
  Var record_node(const char* op, std::span<const Var> inputs, Tensor out, SourcePlace where, Closures&&... fns) {
    Var y = add_output(op, inputs, std::move(out));
    if (!recording_) return y;
    static_assert(alignof(N) <= 64);
    const size_t kept = arena_.bytes_in_use() - arena_mark_;
    auto ids = store_ids(inputs);
    add_node(new (arena_.allocate(sizeof(N))) N(op, y.id_, ids, kept, where, std::forward<Closures>(fns)...));
    return y;
  }
  Var add_output(const char* op, std::span<const Var> inputs, Tensor out);
  void add_node(Node* n);
  template <class Hook>
  void notify(Hook&& hook) const;  // hook(o) for every observer o (tape.cpp)
  // The one reverse sweep, for backward (one lane: x̄) and hvp (two: x̄ and its tangent).
  template <size_t Lanes, class Cotangent, class Step>
  void reverse_sweep(Cotangent&& cotangent, Step&& step);

  // The record of v; throws naming `op` (when given) if v is not a live value of this tape.
  const ValueRec& rec(const Var& v, std::string_view op = {}) const;
  const ValueRec& at(uint32_t id) const;
  Var add_value(Tensor value, bool requires_grad);
  std::span<const uint32_t> store_ids(std::span<const Var> inputs);
  // A zeroed buffer for a gradient: the smallest released one that fits, else a new one from the arena; and one
  // whose contents are left as they are, for a VJP that writes it whole.
  Tensor zeroed_gradient_buffer(DType dtype, const Shape& shape);
  Tensor gradient_buffer(DType dtype, const Shape& shape);
  void release_buffer(Tensor& t);                     // t's memory becomes a spare; t is left undefined
  Tensor allocate(DType dtype, const Shape& shape) {  // unobserved: gradient and tangent buffers
    return Tensor(dtype, shape, arena_.allocate(static_cast<size_t>(shape.numel()) * dtype_size(dtype)));
  }
  void destroy_nodes();

  Arena arena_;
  mutable Scratch scratch_;  // not the recording's state: a const tape's rules use it too
  ValueRecords values_;
  std::vector<Node*> nodes_;
  std::vector<Tensor> sweep_[3];     // per node in a sweep: gin (and gin_dot, tin in hvp)
  std::vector<uint8_t> fresh_;       // per input of the node whose VJP backward runs: its gradient buffer is fresh
  std::vector<Tensor> spare_grads_;  // arena buffers of released gradients
  std::vector<TapeObserver*> observers_;
  size_t arena_mark_ = 0;  // arena bytes in use after the last node or leaf (Node::bytes_kept counts from here)
  uint32_t generation_ = 1;
  uint32_t backward_output_ = 0;  // the value backward was called on, once backward_done_
  bool recording_ = true;
  bool backward_done_ = false;
  bool retain_grads_ = false;
};

// Within its scope nothing is recorded: ops compute values only (no gradients, no tangents).
class NoGradGuard {
 public:
  explicit NoGradGuard(Tape& t) : tape_(t), was_(t.recording_) { t.recording_ = false; }
  ~NoGradGuard() { tape_.recording_ = was_; }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  Tape& tape_;
  bool was_;
};

// Names what is recorded while it lives (TapeScope(tape, "transformer.h.0") around TapeScope(tape, "attn"):
// "transformer.h.0.attn"), for the drawing to group by. The tape only tells its observers; ScopeNames
// (inspect/scope_names.hpp) remembers each value's scope. Values and numbers are unchanged.
class TapeScope {
 public:
  TapeScope(Tape& t, std::string_view name);
  ~TapeScope();
  TapeScope(const TapeScope&) = delete;
  TapeScope& operator=(const TapeScope&) = delete;

 private:
  Tape& tape_;
};

inline bool Var::live() const { return tape_ != nullptr && gen_ == tape_->generation() && id_ < tape_->num_values(); }
inline Tape& Var::tape() const {
  if (!tape_) fail("use of an undefined value (a default-constructed Var)");
  return *tape_;
}
inline const Tensor& Var::value() const { return tape().value(*this); }
inline Tensor Var::grad() const { return tape().grad(*this); }
inline bool Var::requires_grad() const { return tape().requires_grad(*this); }

// "Var #3 " and its value as Tensor::str() prints it; "Var (undefined)", "Var #3 (from before Tape::clear())".
inline std::string to_string(const Var& v) {
  if (!v.defined()) return "Var (undefined)";
  if (!v.live()) return fmt::format("Var #{} (from before Tape::clear())", v.id());
  return fmt::format("Var #{} {}", v.id(), v.value().str());
}
inline std::ostream& operator<<(std::ostream& os, const Var& v) { return os << to_string(v); }

}  // namespace tapegrad

template <>
struct fmt::formatter<tapegrad::Var> : fmt::formatter<std::string> {
  auto format(const tapegrad::Var& v, fmt::format_context& ctx) const {
    return fmt::formatter<std::string>::format(tapegrad::to_string(v), ctx);
  }
};

#include "functions.hpp"  // evaluate, jvp, vjp and hvp of a whole function, each on a private tape
