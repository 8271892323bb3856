#include "engine/tape.hpp"

#include "engine/profile.hpp"

#include <cmath>
#include <cstring>
#include <string>

namespace tapegrad {

const Tape::ValueRec& Tape::rec(const Var& v, std::string_view op) const {
  const std::string who = op.empty() ? std::string() : fmt::format("{}: ", op);
  if (v.tape_ != this) fail("{}value #{} belongs to another tape", who, v.id_);
  if (v.gen_ != generation_)
    fail("{}value #{} is from a cleared tape (recorded in generation {}, the tape is now at {}); "
         "values do not survive Tape::clear()", who, v.id_, v.gen_, generation_);
  if (v.id_ >= values_.size()) fail("{}value #{} does not exist on this tape", who, v.id_);
  return values_[v.id_];
}

const Tape::ValueRec& Tape::at(uint32_t id) const {
  if (id >= values_.size()) fail("tape: value #{} does not exist (the tape holds {} values)", id, values_.size());
  return values_[id];
}

std::string_view Tape::scope_of(uint32_t id) const {
  const uint32_t s = at(id).scope;
  return s == 0 ? std::string_view() : std::string_view(scopes_[s - 1].name);
}

std::optional<uint32_t> Tape::backward_output() const {
  return backward_done_ ? std::optional<uint32_t>(backward_output_) : std::nullopt;
}

TapeScope::TapeScope(Tape& t, std::string_view name) : tape_(t), previous_(t.scope_) {
  if (name.empty()) fail("TapeScope: a scope needs a name");
  auto& scopes = t.scopes_;
  for (size_t i = 0; i < scopes.size(); ++i)
    if (scopes[i].parent == previous_ && std::string_view(scopes[i].name).substr(scopes[i].last) == name) {
      t.scope_ = static_cast<uint32_t>(i + 1);
      return;
    }
  std::string full = previous_ == 0 ? std::string() : scopes[previous_ - 1].name + '.';
  const size_t last = full.size();
  full += name;
  scopes.push_back({std::move(full), previous_, last});
  t.scope_ = static_cast<uint32_t>(scopes.size());
}

// ---- anomaly detection ----

namespace {

// Index of the first NaN or ±∞ of a float tensor, or −1.
int64_t first_non_finite(const Tensor& t) {
  if (!t.defined() || t.dtype() == DType::i32) return -1;
  return dispatch_float("anomaly detection", t.dtype(), [&]<class T>(T) -> int64_t {
    const T* p = t.data<T>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i)
      if (!std::isfinite(p[i])) return i;
    return -1;
  });
}

// "(i, j, k)": the multi-index of flat element `flat` of a row-major tensor of shape s.
std::string element_index(const Shape& s, int64_t flat) {
  std::vector<int64_t> idx(static_cast<size_t>(s.rank()));
  for (int d = s.rank() - 1; d >= 0; --d) {
    idx[static_cast<size_t>(d)] = s[d] == 0 ? 0 : flat % s[d];
    flat = s[d] == 0 ? 0 : flat / s[d];
  }
  return Shape(std::span<const int64_t>(idx)).str();
}

std::string shapes_of(const std::vector<Shape>& shapes) {
  std::string s;
  for (size_t i = 0; i < shapes.size(); ++i) s += (i ? ", " : "") + shapes[i].str();
  return s;
}

}  // namespace

void Tape::check_output(const char* op, std::span<const Var> inputs, const Tensor& out) const {
  const int64_t bad = first_non_finite(out);
  if (bad < 0) return;
  std::vector<Shape> in;
  for (const Var& v : inputs) in.push_back(rec(v, op).value.shape());
  fail("non-finite value from {}: its output {} {} holds {} at {} (inputs {})", op, out.dtype(), out.shape(),
       out.item(bad), element_index(out.shape(), bad), shapes_of(in));
}

void Tape::check_vjp(const Node& n, std::span<const Tensor> gin) const {
  for (size_t i = 0; i < gin.size(); ++i) {
    const int64_t bad = first_non_finite(gin[i]);
    if (bad < 0) continue;
    const Tensor& gout = values_[n.out].grad;
    fail("non-finite value from {} (backward): after its VJP the gradient of its input {} {} {} holds {} at {} "
         "(output {})", n.op, i, gin[i].dtype(), gin[i].shape(), gin[i].item(bad), element_index(gin[i].shape(), bad),
         gout.shape());
  }
}

void Tape::check_jvp(const Node& n, const Tensor& tout) const {
  const int64_t bad = first_non_finite(tout);
  if (bad < 0) return;
  std::vector<Shape> in;
  for (uint32_t id : n.inputs) in.push_back(values_[id].value.shape());
  fail("non-finite value from {} (forward mode): the tangent of its output {} holds {} at {} (inputs {})", n.op,
       tout.shape(), tout.item(bad), element_index(tout.shape(), bad), shapes_of(in));
}

// ---- profiling (engine/profile.hpp) ----

namespace {
constexpr const char* kLeavesAndGlue = "tape: leaves and glue";
constexpr const char* kGradientBuffers = "tape: gradient buffers";
constexpr const char* kBackwardOther = "tape: backward (other)";
constexpr const char* kClear = "tape: clear";
}  // namespace

void Tape::profile_recorded(const char* op, std::span<const Var> inputs, const Tensor& out) const {
  std::vector<Shape> shapes;
  shapes.reserve(inputs.size());
  for (const Var& v : inputs) shapes.push_back(rec(v, op).value.shape());
  profile_->op_recorded(op, shapes, out.shape());
}

Var Tape::add_value(Tensor value, bool requires_grad) {
  values_.push_back(ValueRec{std::move(value), Tensor{}, Tensor{}, requires_grad, true, false, false, scope_});
  return Var(this, static_cast<uint32_t>(values_.size() - 1), generation_);
}

Var Tape::leaf(const Tensor& value, bool requires_grad) {
  if (!value.defined() && value.numel() != 0) fail("leaf: undefined tensor");
  if (requires_grad && value.dtype() == DType::i32)
    fail("leaf: an int32 tensor of shape {} cannot require a gradient", value.shape());
  if (detect_anomaly_) [[unlikely]] {
    if (const int64_t bad = first_non_finite(value); bad >= 0)
      fail("non-finite value in a leaf (an input, constant or parameter): {} {} holds {} at {}", value.dtype(),
           value.shape(), value.item(bad), element_index(value.shape(), bad));
  }
  if (profile_) [[unlikely]]
    profile_->mark(kLeavesAndGlue);
  arena_mark_ = arena_.bytes_in_use();
  pending_allocations_.clear();
  return add_value(value, requires_grad && recording_);
}

Var Tape::param(const Tensor& value, const Tensor& grad) {
  if (grad.dtype() != value.dtype() || !(grad.shape() == value.shape()))
    fail("param: gradient {} {} does not match value {} {}", grad.dtype(), grad.shape(), value.dtype(),
         value.shape());
  Var v = leaf(value, true);
  values_[v.id_].grad = grad;
  values_[v.id_].param = true;
  return v;
}

Tensor Tape::allocate(DType dtype, const Shape& shape) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  return Tensor(dtype, shape, arena_.allocate(bytes));
}

Tensor Tape::empty(DType dtype, Shape shape, const char* what) {
  Tensor t = allocate(dtype, shape);
  if (track_allocations_) [[unlikely]]
    pending_allocations_.push_back({{what, dtype, shape, t.nbytes()}, t.raw()});
  return t;
}

Tensor Tape::zeros(DType dtype, Shape shape, const char* what) {
  Tensor t = empty(dtype, shape, what);
  t.fill_zero();
  return t;
}

void Tape::take_allocations(const Tensor& out) {
  node_allocations_.resize(nodes_.size());
  std::vector<Allocation>& mine = node_allocations_.back();
  for (const PendingAllocation& p : pending_allocations_) {
    mine.push_back(p.a);
    if (p.data == out.raw() && !mine.back().what) mine.back().what = "output";
  }
  pending_allocations_.clear();
}

std::span<const Tape::Allocation> Tape::allocations(size_t node) const {
  if (node >= nodes_.size()) fail("allocations: node #{} does not exist on this tape ({} nodes)", node, nodes_.size());
  if (node >= node_allocations_.size()) return {};
  return node_allocations_[node];
}

bool Tape::inputs_require_grad(std::span<const Var> inputs, const char* op) const {
  bool rg = false;
  for (const Var& v : inputs) {
    if (v.tape_ != this) fail("{}: its inputs come from different tapes", op);
    rg = rec(v).requires_grad || rg;
  }
  return rg;
}

std::span<const uint32_t> Tape::store_ids(std::span<const Var> inputs) {
  auto* ids = static_cast<uint32_t*>(arena_.allocate(sizeof(uint32_t) * inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) ids[i] = inputs[i].id_;
  return {ids, inputs.size()};
}

Tensor Tape::zeroed_gradient_buffer(DType dtype, const Shape& shape) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  size_t best = spare_grads_.size();  // the smallest spare buffer that fits
  for (size_t i = 0; i < spare_grads_.size(); ++i)
    if (spare_grads_[i].bytes >= bytes && (best == spare_grads_.size() || spare_grads_[i].bytes < spare_grads_[best].bytes))
      best = i;
  Tensor t;
  if (best == spare_grads_.size()) {
    t = allocate(dtype, shape);
  } else {
    t = Tensor(dtype, shape, spare_grads_[best].data);
    spare_grads_[best] = spare_grads_.back();
    spare_grads_.pop_back();
  }
  t.fill_zero();
  return t;
}

void Tape::release_buffer(Tensor& t) {
  spare_grads_.push_back({t.raw(), t.nbytes()});
  t = Tensor{};
}

void Tape::ensure_grad(uint32_t id) {
  ValueRec& r = values_[id];
  if (!r.grad.defined()) r.grad = zeroed_gradient_buffer(r.value.dtype(), r.value.shape());
}

void Tape::release_grad(uint32_t id) {
  ValueRec& r = values_[id];
  if (r.leaf || r.retain_grad || retain_grads_ || !r.grad.defined()) return;
  release_buffer(r.grad);
}

void Tape::retain_grad(Var v) {
  rec(v, "retain_grad");
  values_[v.id_].retain_grad = true;
}

void Tape::backward(Var y) {
  const Tensor& v = rec(y, "backward").value;
  if (v.numel() != 1)
    fail("backward: the output has shape {}; a non-scalar output needs a seed gradient of that shape",
         v.shape());
  Tensor one = Tensor::zeros(v.dtype(), v.shape());
  dispatch_float("backward", v.dtype(), [&]<class T>(T) { one.data<T>()[0] = 1; });
  backward(y, one);
}

void Tape::backward(Var y, const Tensor& seed) {
  const ValueRec& out = rec(y, "backward");
  if (backward_done_)
    fail("backward: called twice on one recording (output {} {}); clear() the tape and record the forward again",
         out.value.dtype(), out.value.shape());
  if (seed.dtype() != out.value.dtype() || !(seed.shape() == out.value.shape()))
    fail("backward: seed gradient {} {} does not match the output {} {}", seed.dtype(), seed.shape(),
         out.value.dtype(), out.value.shape());
  if (!out.requires_grad) fail("backward: the output {} depends on no value that requires a gradient",
                               out.value.shape());
  if (detect_anomaly_) [[unlikely]] {
    if (const int64_t bad = first_non_finite(seed); bad >= 0)
      fail("backward: the seed gradient {} {} holds {} at {}", seed.dtype(), seed.shape(), seed.item(bad),
           element_index(seed.shape(), bad));
  }
  backward_done_ = true;
  backward_output_ = y.id_;
  if (profile_) [[unlikely]]
    profile_->mark(kLeavesAndGlue);
  ensure_grad(y.id_);
  values_[y.id_].grad.accumulate(seed);
  for (size_t k = nodes_.size(); k-- > 0;) {
    const Node& n = *nodes_[k];
    const ValueRec& o = values_[n.out];
    if (!o.requires_grad || !o.grad.defined()) continue;
    scratch_.assign(n.inputs.size(), Tensor{});
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (!values_[n.inputs[i]].requires_grad) continue;
      ensure_grad(n.inputs[i]);
      scratch_[i] = values_[n.inputs[i]].grad;
    }
    if (profile_) [[unlikely]]
      profile_->vjp_starting(kGradientBuffers);
    n.vjp(o.grad, scratch_);
    if (profile_) [[unlikely]]
      profile_->vjp_done(n.op);
    if (detect_anomaly_) [[unlikely]]
      check_vjp(n, scratch_);
    release_grad(n.out);
  }
  if (profile_) [[unlikely]]
    profile_->mark(kBackwardOther);
}

void Tape::set_tangent(Var v, const Tensor& t) {
  const ValueRec& r = rec(v, "set_tangent");
  if (t.dtype() != r.value.dtype() || !(t.shape() == r.value.shape()))
    fail("set_tangent: tangent {} {} does not match the value {} {}", t.dtype(), t.shape(), r.value.dtype(),
         r.value.shape());
  values_[v.id_].tangent = t;
}

void Tape::propagate_tangents() {
  for (Node* n : nodes_) {
    scratch_.assign(n->inputs.size(), Tensor{});
    bool any = false;
    for (size_t i = 0; i < n->inputs.size(); ++i) {
      scratch_[i] = values_[n->inputs[i]].tangent;
      any = any || scratch_[i].defined();
    }
    if (!any) continue;
    ValueRec& o = values_[n->out];
    o.tangent = allocate(o.value.dtype(), o.value.shape());
    o.tangent.fill_zero();
    n->jvp(scratch_, o.tangent);
    if (detect_anomaly_) [[unlikely]]
      check_jvp(*n, o.tangent);
  }
}

Tensor Tape::tangent(Var v) const { return rec(v).tangent; }

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
      fail("hvp: op '{}' has no second-order rule, so Hessian-vector products through it are not defined",
           n->op);
  for (size_t i = 0; i < wrt.size(); ++i) {
    if (!rec(wrt[i], "hvp").leaf) fail("hvp: value #{} is not a leaf: differentiate by inputs and parameters", wrt[i].id_);
    set_tangent(wrt[i], directions[i]);
  }
  propagate_tangents();
  // Cotangents ḡ and their tangents, a pair per value on the way; an intermediate value's pair is released
  // once its node has run (as backward releases gradients), the tangents are kept to the end.
  std::vector<Tensor> g(values_.size()), g_dot(values_.size());
  auto zeros_like = [&](uint32_t id) { return zeroed_gradient_buffer(values_[id].value.dtype(), values_[id].value.shape()); };
  g[y.id_] = zeros_like(y.id_);
  g[y.id_].accumulate(seed);
  g_dot[y.id_] = zeros_like(y.id_);
  std::vector<Tensor> gin, gin_dot, tin;
  for (size_t k = nodes_.size(); k-- > 0;) {
    const Node& n = *nodes_[k];
    if (!values_[n.out].requires_grad || !g[n.out].defined()) continue;
    gin.assign(n.inputs.size(), Tensor{});
    gin_dot.assign(n.inputs.size(), Tensor{});
    tin.assign(n.inputs.size(), Tensor{});
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const uint32_t id = n.inputs[i];
      tin[i] = values_[id].tangent;
      if (!values_[id].requires_grad) continue;
      if (!g[id].defined()) {
        g[id] = zeros_like(id);
        g_dot[id] = zeros_like(id);
      }
      gin[i] = g[id];
      gin_dot[i] = g_dot[id];
    }
    n.vjp(g[n.out], gin);
    n.vjp(g_dot[n.out], gin_dot);
    n.vjp_tangent(g[n.out], tin, gin_dot);
    release_buffer(g[n.out]);
    release_buffer(g_dot[n.out]);
  }
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
  scratch_.clear();
  spare_grads_.clear();
  arena_.reset();
  arena_mark_ = 0;
  pending_allocations_.clear();
  node_allocations_.clear();
  if (scope_ == 0) scopes_.clear();  // an open scope's name must outlive it
  ++generation_;
  backward_done_ = false;
  if (profile_) [[unlikely]]
    profile_->mark(kClear);
}

// ---- whole-function derivatives ----

namespace {
std::vector<Var> leaves(Tape& tape, std::span<const Tensor> inputs) {
  std::vector<Var> xs;
  for (const Tensor& x : inputs) xs.push_back(tape.leaf(x, x.dtype() != DType::i32));
  return xs;
}
}  // namespace

Tensor evaluate(const Function& f, std::span<const Tensor> inputs) {
  Tape tape;
  NoGradGuard no_grad(tape);
  auto xs = leaves(tape, inputs);
  return f(tape, xs).value().clone();
}

std::pair<Tensor, Tensor> jvp(const Function& f, std::span<const Tensor> inputs,
                              std::span<const Tensor> tangents) {
  if (tangents.size() != inputs.size())
    fail("jvp: {} tangents given for {} inputs", tangents.size(), inputs.size());
  Tape tape;
  auto xs = leaves(tape, inputs);
  for (size_t i = 0; i < xs.size(); ++i)
    if (tangents[i].defined()) tape.set_tangent(xs[i], tangents[i]);
  Var y = f(tape, xs);
  tape.propagate_tangents();
  Tensor t = tape.tangent(y);
  return {y.value().clone(), t.defined() ? t.clone() : Tensor::zeros(y.dtype(), y.shape())};
}

std::vector<Tensor> vjp(const Function& f, std::span<const Tensor> inputs, const Tensor& cotangent) {
  Tape tape;
  auto xs = leaves(tape, inputs);
  Var y = f(tape, xs);
  std::vector<Tensor> grads;
  if (!y.requires_grad()) {  // y does not depend on the inputs: all gradients are zero
    for (const Tensor& x : inputs)
      grads.push_back(x.dtype() == DType::i32 ? Tensor{} : Tensor::zeros(x.dtype(), x.shape()));
    return grads;
  }
  tape.backward(y, cotangent);
  for (size_t i = 0; i < xs.size(); ++i) {
    Tensor g = xs[i].requires_grad() ? xs[i].grad() : Tensor{};
    if (g.defined()) grads.push_back(g.clone());
    else if (inputs[i].dtype() == DType::i32) grads.emplace_back();
    else grads.push_back(Tensor::zeros(inputs[i].dtype(), inputs[i].shape()));
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
      dirs.push_back(directions[i].defined() ? directions[i] : Tensor::zeros(inputs[i].dtype(), inputs[i].shape()));
    }
  Var y = f(tape, xs);
  std::vector<Tensor> out;
  if (!y.requires_grad()) {
    for (const Tensor& x : inputs)
      out.push_back(x.dtype() == DType::i32 ? Tensor{} : Tensor::zeros(x.dtype(), x.shape()));
    return out;
  }
  const std::vector<Tensor> h = tape.hvp(y, cotangent, wrt, dirs).hvp;
  for (size_t i = 0, k = 0; i < inputs.size(); ++i)
    out.push_back(inputs[i].dtype() == DType::i32 ? Tensor{} : h[k++]);
  return out;
}

}  // namespace tapegrad
