#include "engine/tape.hpp"

#include <algorithm>

#include "engine/tape_observer.hpp"

namespace tapegrad {

const Tape::ValueRec& Tape::rec(const Var& v, std::string_view op) const {
  const std::string who = op.empty() ? std::string() : fmt::format("{}: ", op);
  if (v.tape_ != this) fail("{}value #{} belongs to another tape", who, v.id_);
  if (v.gen_ != generation_)
    fail(
        "{}value #{} is from a cleared tape (recorded in generation {}, the tape is now at {}); "
        "values do not survive Tape::clear()",
        who, v.id_, v.gen_, generation_);
  if (v.id_ >= values_.size()) fail("{}value #{} does not exist on this tape", who, v.id_);
  return values_[v.id_];
}

const Tape::ValueRec& Tape::at(uint32_t id) const {
  if (id >= values_.size()) fail("tape: value #{} does not exist (the tape holds {} values)", id, values_.size());
  return values_[id];
}

// ---- observers: the tape only tells them (engine/tape_observer.hpp) ----

// Calls hook(o) for every observer o: a branch, not taken, when there is none.
template <class Hook>
void Tape::notify(Hook&& hook) const {
  if (!observers_.empty()) [[unlikely]]
    for (TapeObserver* o : observers_) hook(*o);
}

TapeScope::TapeScope(Tape& t, std::string_view name) : tape_(t) {
  if (name.empty()) fail("TapeScope: a scope needs a name");
  t.notify([&](TapeObserver& ob) { ob.on_scope_enter(t, name); });
}
TapeScope::~TapeScope() {
  tape_.notify([&](TapeObserver& ob) { ob.on_scope_exit(tape_); });
}

// ---- recording ----

Var Tape::add_value(Tensor value, bool requires_grad) {
  values_.push_back(ValueRec{std::move(value), Tensor{}, Tensor{}, requires_grad});
  return Var(this, static_cast<uint32_t>(values_.size() - 1), generation_);
}

Var Tape::leaf(const Tensor& value, bool requires_grad) {
  if (!value.defined() && value.numel() != 0) fail("leaf: undefined tensor");
  if (requires_grad && value.dtype() == DType::i32)
    fail("leaf: an int32 tensor of shape {} cannot require a gradient", value.shape());
  notify([&](TapeObserver& ob) { ob.on_leaf(*this, value); });
  arena_mark_ = arena_.bytes_in_use();
  return add_value(value, requires_grad && recording_);
}

Var Tape::param(const Tensor& value, const Tensor& grad) {
  if (grad.dtype() != value.dtype() || !(grad.shape() == value.shape()))
    fail("param: gradient {} {} does not match value {} {}", grad.dtype(), grad.shape(), value.dtype(), value.shape());
  Var v = leaf(value, true);
  values_[v.id_].grad = grad;
  values_[v.id_].param = true;
  return v;
}

Tensor Tape::empty(DType dtype, Shape shape, const char* what) {
  Tensor t = allocate(dtype, shape);
  notify([&](TapeObserver& ob) { ob.on_allocation(*this, t, what); });
  return t;
}

// An op's output: it needs a gradient when an input does (and the tape is recording).
Var Tape::add_output(const char* op, std::span<const Var> inputs, Tensor out) {
  bool rg = false;
  for (const Var& v : inputs) {
    if (v.tape_ != this) fail("{}: its inputs come from different tapes", op);
    rg = rec(v).requires_grad || rg;
  }
  notify([&](TapeObserver& ob) { ob.on_output(*this, op, inputs, out); });
  Var y = add_value(std::move(out), rg && recording_);
  values_.back().leaf = !recording_;
  return y;
}

void Tape::add_node(Node* n) {
  nodes_.push_back(n);
  arena_mark_ = arena_.bytes_in_use();
  notify([&](TapeObserver& ob) { ob.on_record(*this, *n); });
}

std::span<const uint32_t> Tape::store_ids(std::span<const Var> inputs) {
  auto* ids = static_cast<uint32_t*>(arena_.allocate(sizeof(uint32_t) * inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) ids[i] = inputs[i].id_;
  return {ids, inputs.size()};
}

// ---- gradient buffers: released ones are reused, smallest fit first ----

Tensor Tape::zeroed_gradient_buffer(DType dtype, const Shape& shape) {
  Tensor t = gradient_buffer(dtype, shape);
  t.fill_zero();
  return t;
}

Tensor Tape::gradient_buffer(DType dtype, const Shape& shape) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  size_t best = spare_grads_.size();  // the smallest spare buffer that fits
  for (size_t i = 0; i < spare_grads_.size(); ++i)
    if (spare_grads_[i].nbytes() >= bytes &&
        (best == spare_grads_.size() || spare_grads_[i].nbytes() < spare_grads_[best].nbytes()))
      best = i;
  Tensor t = best == spare_grads_.size() ? allocate(dtype, shape) : Tensor(dtype, shape, spare_grads_[best].raw());
  if (best < spare_grads_.size()) {
    spare_grads_[best] = std::move(spare_grads_.back());
    spare_grads_.pop_back();
  }
  return t;
}

void Tape::vjp_writes_fresh(Var y) {
  const ValueRec& r = rec(y, "vjp_writes_fresh");
  if (!recording_ || r.leaf) return;  // nothing recorded (NoGradGuard), or not an op's output
  if (nodes_.empty() || nodes_.back()->out != y.id_)
    fail("vjp_writes_fresh: call it right after record(), with the output it returned");
  nodes_.back()->writes_fresh = true;
}

void Tape::release_buffer(Tensor& t) {
  spare_grads_.push_back(std::move(t));
  t = Tensor{};
}

// ---- reverse mode ----

// The reverse sweep of backward and hvp. Each of the `Lanes` cotangents of value id is cotangent(lane, id), a
// Tensor& (backward: one lane, x̄ = ValueRec::grad; hvp: two, x̄ and its tangent x̄̇). For nodes in reverse whose
// output has a cotangent: the inputs that need a gradient get zeroed buffers on first use, step(node, gin) adds
// into them (gin[lane][i]: input i's buffer in that lane, undefined where it needs none), and then the output's
// buffers go back to the spares (unless it is a leaf or its gradient is kept), so only the cotangents of values
// still ahead of the sweep are held.
// In backward (one lane), a node marked writes_fresh gets the buffers it is the first to reach unzeroed, flagged in
// fresh_ for its VJP (Tape::fresh_gradient), unless it takes that input twice.
template <size_t Lanes, class Cotangent, class Step>
void Tape::reverse_sweep(Cotangent&& cotangent, Step&& step) {
  static_assert(Lanes <= 2);
  for (size_t k = nodes_.size(); k-- > 0;) {
    const Node& n = *nodes_[k];
    const ValueRec& o = values_[n.out];
    if (!o.requires_grad || !cotangent(0, n.out).defined()) continue;
    for (size_t lane = 0; lane < Lanes; ++lane) sweep_[lane].assign(n.inputs.size(), Tensor{});
    fresh_.assign(n.inputs.size(), 0);
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const uint32_t id = n.inputs[i];
      const ValueRec& r = values_[id];
      if (!r.requires_grad) continue;
      for (size_t lane = 0; lane < Lanes; ++lane) {
        Tensor& c = cotangent(lane, id);
        if (!c.defined()) {
          const bool fresh = Lanes == 1 && n.writes_fresh && std::count(n.inputs.begin(), n.inputs.end(), id) == 1;
          c = fresh ? gradient_buffer(r.value.dtype(), r.value.shape())
                    : zeroed_gradient_buffer(r.value.dtype(), r.value.shape());
          fresh_[i] = fresh;
        }
        sweep_[lane][i] = c;
      }
    }
    notify([&](TapeObserver& ob) { ob.on_vjp_begin(*this, n); });
    struct ClearFresh {
      std::vector<uint8_t>& f;
      ~ClearFresh() { f.clear(); }  // also when the VJP throws: no later call sees this node's flags
    } clear_fresh{fresh_};
    step(n, sweep_);
    notify([&](TapeObserver& ob) { ob.on_vjp_end(*this, n, sweep_[0]); });
    if (o.leaf || o.retain_grad || retain_grads_) continue;
    for (size_t lane = 0; lane < Lanes; ++lane) release_buffer(cotangent(lane, n.out));
  }
}

// x̄ += Jᵀȳ node by node, from ȳ = seed (1 for a scalar y).
void Tape::backward(Var y, const Tensor& given_seed) {
  const ValueRec& out = rec(y, "backward");
  Tensor seed = given_seed;
  if (!seed.defined()) {
    if (out.value.numel() != 1)
      fail("backward: the output has shape {}; a non-scalar output needs a seed gradient of that shape",
           out.value.shape());
    seed = Tensor::full(out.value.dtype(), out.value.shape(), 1.0);
  }
  if (backward_done_)
    fail("backward: called twice on one recording (output {} {}); clear() the tape and record the forward again",
         out.value.dtype(), out.value.shape());
  if (seed.dtype() != out.value.dtype() || !(seed.shape() == out.value.shape()))
    fail("backward: seed gradient {} {} does not match the output {} {}", seed.dtype(), seed.shape(), out.value.dtype(),
         out.value.shape());
  if (!out.requires_grad)
    fail("backward: the output {} depends on no value that requires a gradient", out.value.shape());
  notify([&](TapeObserver& ob) { ob.on_backward_begin(*this, seed); });
  backward_done_ = true;
  backward_output_ = y.id_;
  ValueRec& r = values_[y.id_];
  if (!r.grad.defined()) r.grad = zeroed_gradient_buffer(r.value.dtype(), r.value.shape());
  r.grad.accumulate(seed);
  reverse_sweep<1>([&](size_t, uint32_t id) -> Tensor& { return values_[id].grad; },
                   [&](const Node& n, std::vector<Tensor>* gin) { n.vjp(values_[n.out].grad, gin[0]); });
  notify([&](TapeObserver& ob) { ob.on_backward_end(*this); });
}

// ---- forward mode ----

void Tape::set_tangent(Var v, const Tensor& t) {
  const ValueRec& r = rec(v, "set_tangent");
  if (t.dtype() != r.value.dtype() || !(t.shape() == r.value.shape()))
    fail("set_tangent: tangent {} {} does not match the value {} {}", t.dtype(), t.shape(), r.value.dtype(),
         r.value.shape());
  values_[v.id_].tangent = t;
}

// ẏ = Jẋ node by node, in recording order; a node none of whose inputs has a tangent gets none.
void Tape::propagate_tangents() {
  std::vector<Tensor>& tin = sweep_[2];
  for (Node* n : nodes_) {
    tin.assign(n->inputs.size(), Tensor{});
    bool any = false;
    for (size_t i = 0; i < n->inputs.size(); ++i) {
      tin[i] = values_[n->inputs[i]].tangent;
      any = any || tin[i].defined();
    }
    if (!any) continue;
    ValueRec& o = values_[n->out];
    o.tangent = allocate(o.value.dtype(), o.value.shape());
    o.tangent.fill_zero();
    n->jvp(tin, o.tangent);
    notify([&](TapeObserver& ob) { ob.on_jvp_end(*this, *n, o.tangent); });
  }
}

// ---- Hessian-vector products: forward mode, then the reverse sweep with two lanes (top of tape.hpp) ----

Tape::HessianVectorProduct Tape::hvp(Var y, const Tensor& seed, std::span<const Var> wrt,
                                     std::span<const Tensor> directions) {
  const ValueRec& out = rec(y, "hvp");
  if (seed.dtype() != out.value.dtype() || !(seed.shape() == out.value.shape()))
    fail("hvp: seed {} {} does not match the output {} {}", seed.dtype(), seed.shape(), out.value.dtype(),
         out.value.shape());
  if (wrt.size() != directions.size())
    fail("hvp: {} values to differentiate by and {} directions; one direction each", wrt.size(), directions.size());
  for (const Node* n : nodes_)
    if (values_[n->out].requires_grad && !n->has_second_order())
      fail("hvp: op '{}' has no second-order rule, so Hessian-vector products through it are not defined", n->op);
  for (size_t i = 0; i < wrt.size(); ++i) {
    if (!rec(wrt[i], "hvp").leaf)
      fail("hvp: value #{} is not a leaf: differentiate by inputs and parameters", wrt[i].id_);
    set_tangent(wrt[i], directions[i]);
  }
  propagate_tangents();
  // The cotangents ḡ and their tangents ḡ̇ live here, not in ValueRec::grad: a parameter's gradient is the
  // caller's, which an HVP leaves alone.
  std::vector<Tensor> g(values_.size()), g_dot(values_.size());
  const Shape& ys = out.value.shape();
  g[y.id_] = zeroed_gradient_buffer(seed.dtype(), ys);
  g[y.id_].accumulate(seed);
  g_dot[y.id_] = zeroed_gradient_buffer(seed.dtype(), ys);
  std::vector<Tensor>& tin = sweep_[2];
  reverse_sweep<2>([&](size_t lane, uint32_t id) -> Tensor& { return (lane == 0 ? g : g_dot)[id]; },
                   [&](const Node& n, std::vector<Tensor>* gin) {
                     tin.assign(n.inputs.size(), Tensor{});
                     for (size_t i = 0; i < n.inputs.size(); ++i) tin[i] = values_[n.inputs[i]].tangent;
                     n.vjp(g[n.out], gin[0]);               // x̄ += Jᵀȳ
                     n.vjp(g_dot[n.out], gin[1]);           // x̄̇ += Jᵀȳ̇
                     n.vjp_tangent(g[n.out], tin, gin[1]);  //    + Σⱼ ∂ⱼ(Jᵀȳ)[ẋⱼ]
                   });
  HessianVectorProduct r;
  for (const Var& v : wrt) {
    const bool reached = g[v.id_].defined();
    r.gradient.push_back(reached ? g[v.id_].clone() : Tensor::zeros(values_[v.id_].value.dtype(), v.shape()));
    r.hvp.push_back(reached ? g_dot[v.id_].clone() : Tensor::zeros(values_[v.id_].value.dtype(), v.shape()));
  }
  return r;
}

void Tape::destroy_nodes() {
  for (size_t k = nodes_.size(); k-- > 0;) nodes_[k]->~Node();
  nodes_.clear();
}

void Tape::clear() {
  destroy_nodes();
  values_.clear();
  for (auto& s : sweep_) s.clear();
  spare_grads_.clear();
  arena_.reset();
  arena_mark_ = 0;
  ++generation_;
  backward_done_ = false;
  notify([&](TapeObserver& ob) { ob.on_clear(*this); });
}

}  // namespace tapegrad
