#include "python/engine_bindings.hpp"

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>
#include <pybind11/stl.h>

#include "checker/explain.hpp"
#include "inspect/tape_dot.hpp"
#include "models/files.hpp"
#include "ops/attention/attention.hpp"
#include "ops/ops.hpp"
#include "python/numpy_tensor.hpp"

namespace tapegrad::python {

namespace {

// An op applied to its input values, with its numeric options (axis, p, eps, ...) from Python keywords. It runs
// without the GIL (call_op): reading a keyword takes the GIL back for that moment.
using OpCall = std::function<Var(std::span<const Var>, const py::kwargs&)>;

bool has_keyword(const py::kwargs& kw, const char* key) {
  py::gil_scoped_acquire gil;
  return kw.contains(key);
}
template <class T>
T keyword(const py::kwargs& kw, const char* key, T fallback) {
  py::gil_scoped_acquire gil;
  return kw.contains(key) ? kw[key].cast<T>() : fallback;
}
template <class T>
T required(const py::kwargs& kw, const char* op, const char* key) {
  py::gil_scoped_acquire gil;
  if (!kw.contains(key)) fail("{}: needs the keyword {}=", op, key);
  return kw[key].cast<T>();
}
GeluForm gelu_form(const py::kwargs& kw) {
  const std::string name = keyword<std::string>(kw, "form", "tanh");
  if (auto f = gelu_form_named(name)) return *f;
  fail("mlp: form must be exact or tanh, got '{}'", name);
}
AttentionOptions attention_options(const py::kwargs& kw) {
  return {keyword(kw, "scale", 0.0), keyword(kw, "causal", false)};
}

struct OpEntry {
  size_t inputs;  // how many values it takes (kAny: one or more)
  OpCall call;
};

constexpr size_t kAny = SIZE_MAX;

const std::map<std::string, OpEntry>& op_table() {
  using S = std::span<const Var>;
  using K = const py::kwargs&;
  static const std::map<std::string, OpEntry> table = {
      {"add", {2, [](S x, K) { return add(x[0], x[1]); }}},
      {"sub", {2, [](S x, K) { return sub(x[0], x[1]); }}},
      {"mul", {2, [](S x, K) { return mul(x[0], x[1]); }}},
      {"div", {2, [](S x, K) { return div(x[0], x[1]); }}},
      {"neg", {1, [](S x, K) { return neg(x[0]); }}},
      {"scale", {1, [](S x, K k) { return scale(x[0], keyword(k, "s", 1.0)); }}},
      {"exp", {1, [](S x, K) { return exp(x[0]); }}},
      {"log", {1, [](S x, K) { return log(x[0]); }}},
      {"tanh", {1, [](S x, K) { return tanh(x[0]); }}},
      {"relu", {1, [](S x, K) { return relu(x[0]); }}},
      {"gelu", {1, [](S x, K) { return gelu(x[0]); }}},
      {"gelu_erf", {1, [](S x, K) { return gelu_erf(x[0]); }}},
      {"elu", {1, [](S x, K k) { return elu(x[0], keyword(k, "alpha", 1.0)); }}},
      {"sigmoid", {1, [](S x, K) { return sigmoid(x[0]); }}},
      {"square", {1, [](S x, K) { return square(x[0]); }}},
      {"sqrt", {1, [](S x, K) { return sqrt(x[0]); }}},
      {"abs", {1, [](S x, K) { return abs(x[0]); }}},
      {"pow", {1, [](S x, K k) { return pow(x[0], keyword(k, "p", 2.0)); }}},
      {"sum", {1, [](S x, K k) {
                 return has_keyword(k, "axis") ? sum(x[0], keyword(k, "axis", -1), keyword(k, "keepdim", false))
                                           : sum(x[0]);
               }}},
      {"mean", {1, [](S x, K k) {
                  return has_keyword(k, "axis") ? mean(x[0], keyword(k, "axis", -1), keyword(k, "keepdim", false))
                                            : mean(x[0]);
                }}},
      {"transpose", {1, [](S x, K k) { return transpose(x[0], keyword(k, "axis0", -2), keyword(k, "axis1", -1)); }}},
      {"permute", {1, [](S x, K k) { return permute(x[0], required<std::vector<int>>(k, "permute", "perm")); }}},
      {"reshape", {1, [](S x, K k) {
                     const auto dims = required<std::vector<int64_t>>(k, "reshape", "shape");
                     return reshape(x[0], Shape(std::span<const int64_t>(dims)));
                   }}},
      {"slice", {1, [](S x, K k) {
                   return slice(x[0], required<int>(k, "slice", "axis"), required<int64_t>(k, "slice", "start"),
                                required<int64_t>(k, "slice", "stop"));
                 }}},
      {"concat", {kAny, [](S x, K k) { return concat(x, keyword(k, "axis", 0)); }}},
      {"embedding", {2, [](S x, K) { return embedding(x[0], x[1]); }}},
      {"mlp", {5, [](S x, K k) { return mlp(x[0], x[1], x[2], x[3], x[4], gelu_form(k)); }}},
      {"split_heads", {1, [](S x, K k) {
                         return split_heads(x[0], required<int64_t>(k, "split_heads", "heads"), keyword<int64_t>(k, "offset", 0),
                                            required<int64_t>(k, "split_heads", "width"));
                       }}},
      {"merge_heads", {1, [](S x, K) { return merge_heads(x[0]); }}},
      {"matmul", {2, [](S x, K) { return matmul(x[0], x[1]); }}},
      {"linear", {3, [](S x, K) { return linear(x[0], x[1], x[2]); }}},
      {"softmax", {1, [](S x, K) { return softmax(x[0]); }}},
      {"log_softmax", {1, [](S x, K) { return log_softmax(x[0]); }}},
      {"row_normalize", {1, [](S x, K) { return row_normalize(x[0]); }}},
      {"layer_norm", {3, [](S x, K k) { return layer_norm(x[0], x[1], x[2], keyword(k, "eps", 1e-5)); }}},
      {"mse_loss", {2, [](S x, K) { return mse_loss(x[0], x[1]); }}},
      {"cross_entropy", {2, [](S x, K) { return cross_entropy(x[0], x[1]); }}},
      {"attention", {3, [](S x, K k) { return attention(x[0], x[1], x[2], attention_options(k)); }}},
      {"tiled_attention", {3, [](S x, K k) {
                             return tiled_attention(x[0], x[1], x[2], attention_options(k), {},
                                                    keyword<int64_t>(k, "block", 64));
                           }}},
      {"beta_attention", {3, [](S x, K k) { return beta_attention(x[0], x[1], x[2], attention_options(k)); }}},
      {"linear_attention", {3, [](S x, K k) {
                              return linear_attention(x[0], x[1], x[2], keyword(k, "causal", false));
                            }}},
  };
  return table;
}

// A Tape made from Python. The engine's tape is not safe to use from two threads at once (an op appends to its
// lists of nodes and values, backward hands gradient buffers back, clear() rewinds the arena), and the bindings
// release the GIL during the C++ work, so two Python threads on one tape would race there. The lock serialises
// them: every binding that reads or writes the tape, a Var's value and gradient included, holds it for the whole
// call (TapeInUse). Every Var that Python can hold comes from a PyTape's leaf, constant or op, so a Var's tape is a
// PyTape.
struct PyTape : Tape {
  std::mutex mutex;
  std::atomic<std::thread::id> holder{};  // the thread in a call on this tape; none between calls
};

// Holds a tape's lock for one call; taken with the GIL held. Where another thread is in a call on the tape, it
// waits for it without the GIL (that call may need the GIL to read a keyword or to copy its result out). A second
// call on the tape from the thread already in one (Python code run by the first, such as a keyword's __float__,
// calling back into the tape) would wait for itself: it is refused instead, with a RuntimeError.
class TapeInUse {
 public:
  explicit TapeInUse(Tape& t) : tape_(static_cast<PyTape&>(t)) {
    if (!tape_.mutex.try_lock()) {
      if (tape_.holder.load() == std::this_thread::get_id())
        throw std::runtime_error(
            "this Tape is in use by a call that has not returned (Python code that call ran used the same Tape)");
      py::gil_scoped_release nogil;
      tape_.mutex.lock();
    }
    tape_.holder.store(std::this_thread::get_id());
  }
  explicit TapeInUse(const Var& v) : TapeInUse(tape_of(v)) {}
  ~TapeInUse() {
    tape_.holder.store(std::thread::id{});
    tape_.mutex.unlock();
  }
  TapeInUse(const TapeInUse&) = delete;
  TapeInUse& operator=(const TapeInUse&) = delete;

 private:
  static Tape& tape_of(const Var& v) {
    if (!v.defined()) fail("a Var that belongs to no tape");
    return v.tape();
  }
  PyTape& tape_;
};

// f() with the lock of the tape `on` (a Tape or a Var's) held.
template <class On, class F>
auto in_use(On& on, F&& f) {
  const TapeInUse use(on);
  return f();
}

std::string shapes_of(std::span<const Var> xs) {
  std::string s;
  for (const Var& x : xs) s += (s.empty() ? "" : ", ") + (x.live() ? x.shape().str() : to_string(x));
  return s;
}

// The op by name on values of one tape; the C++ work runs without the GIL. A tapegrad::Error from the op gets
// the op's name and its inputs' shapes in front.
Var call_op(const std::string& name, const std::vector<Var>& xs, const py::kwargs& kw) {
  const auto& table = op_table();
  const auto it = table.find(name);
  if (it == table.end()) {
    std::string known;
    for (const auto& [n, e] : table) known += (known.empty() ? "" : ", ") + n;
    fail("Tape.op: no op '{}' here; the ops: {}", name, known);
  }
  if (it->second.inputs == kAny ? xs.empty() : xs.size() != it->second.inputs)
    fail("{}: takes {} values, got {}", name, it->second.inputs == kAny ? "one or more" : std::to_string(it->second.inputs),
         xs.size());
  for (const Var& x : xs)
    if (!x.live()) fail("{}: an input is {}", name, to_string(x));
  const std::string shapes = shapes_of(xs);
  try {
    py::gil_scoped_release nogil;
    return it->second.call(xs, kw);
  } catch (const Error& e) {
    fail("{} on shapes {}: {}", name, shapes, e.what());
  }
}

py::array value_array(const Var& v) { return copy_to_numpy(v.value()); }

py::object grad_array(const Var& v) {
  const Tensor g = v.grad();
  return g.defined() ? py::object(copy_to_numpy(g)) : py::object(py::none());
}

}  // namespace

void bind_engine(py::module_& m) {
  py::class_<Var>(m, "Var", "A value on a tape; its value and gradient come out as numpy copies")
      .def_property_readonly("value", [](const Var& v) { return in_use(v, [&] { return value_array(v); }); })
      .def_property_readonly("grad", [](const Var& v) { return in_use(v, [&] { return grad_array(v); }); })
      .def_property_readonly("shape", [](const Var& v) {
        const TapeInUse use(v);
        const auto d = v.shape().dims();
        return py::tuple(py::cast(std::vector<int64_t>(d.begin(), d.end())));
      })
      .def_property_readonly("dtype", [](const Var& v) {
        return in_use(v, [&] { return std::string(dtype_name(v.dtype())); });
      })
      .def_property_readonly("live", [](const Var& v) { return in_use(v, [&] { return v.live(); }); })
      .def_property_readonly("id", &Var::id)
      .def("numpy", [](const Var& v) { return in_use(v, [&] { return value_array(v); }); })
      .def("__repr__", [](const Var& v) { return in_use(v, [&] { return to_string(v); }); });

  // Each binding holds the tape's lock (TapeInUse) for the whole call: calls on one tape from several threads run
  // one after another.
  py::class_<PyTape>(m, "Tape", "A tape: leaves from numpy arrays, the built-in ops by name, reverse and forward mode")
      .def(py::init<>())
      // The leaf's memory is the array's own (no copy) when it is a C-contiguous float32/float64 array; the tape
      // keeps a reference to it until clear().
      // A Var points at its tape: each one returned keeps the Python tape alive (keep_alive<0, 1>).
      .def("leaf", [](PyTape& t, const py::object& a, bool requires_grad) {
             const Tensor value = view_of(a, "leaf");
             const TapeInUse use(t);
             return t.leaf(value, requires_grad);
           }, py::arg("array"), py::arg("requires_grad") = true, py::keep_alive<0, 1>())
      .def("constant", [](PyTape& t, const py::object& a) {
             const Tensor value = view_of(a, "constant");
             const TapeInUse use(t);
             return t.constant(value);
           }, py::keep_alive<0, 1>())
      .def("op", [](PyTape& t, const std::string& name, py::args values, const py::kwargs& kw) {
             std::vector<Var> xs;
             for (const py::handle v : values) {
               if (!py::isinstance<Var>(v)) fail("{}: its inputs must be Vars of the tape (tape.leaf(array))", name);
               xs.push_back(v.cast<Var>());
               // The op records onto its inputs' tape: the one whose lock is held must be that one.
               if (!xs.back().defined() || &xs.back().tape() != &t)
                 fail("{}: input {} is a Var of another Tape (each Tape.op takes Vars of its own tape)", name,
                      xs.size() - 1);
             }
             const TapeInUse use(t);
             return call_op(name, xs, kw);
           }, py::keep_alive<0, 1>())
      .def("backward", [](PyTape& t, const Var& y, const py::object& seed) {
             const Tensor s = seed.is_none() ? Tensor{} : view_of(seed, "backward");
             const TapeInUse use(t);
             py::gil_scoped_release nogil;
             t.backward(y, s);
           }, py::arg("y"), py::arg("seed") = py::none())
      .def("grad", [](const PyTape&, const Var& v) { return in_use(v, [&] { return grad_array(v); }); })
      .def("retain_grad", [](PyTape& t, const Var& v) {
             const TapeInUse use(t);
             t.retain_grad(v);
           })
      .def("jvp", [](PyTape& t, const Var& y, const std::vector<Var>& leaves, const py::list& tangents) {
             if (leaves.size() != py::len(tangents)) fail("jvp: {} leaves and {} tangents", leaves.size(), py::len(tangents));
             std::vector<Tensor> views;
             for (size_t i = 0; i < leaves.size(); ++i) views.push_back(view_of(tangents[i], "jvp"));
             const TapeInUse use(t);
             for (size_t i = 0; i < leaves.size(); ++i)
               t.set_tangent(leaves[i], views[i].clone());
             {
               py::gil_scoped_release nogil;
               t.propagate_tangents();
             }
             const Tensor ty = t.tangent(y);
             return ty.defined() ? py::object(copy_to_numpy(ty)) : py::object(py::none());
           }, py::arg("y"), py::arg("leaves"), py::arg("tangents"),
           "The tangent of y for the leaves' tangents: J·ẋ by forward mode over what was recorded")
      .def("hvp", [](PyTape& t, const Var& y, const std::vector<Var>& wrt, const py::list& directions, const py::object& seed) {
             std::vector<Tensor> dirs;
             for (const py::handle d : directions) dirs.push_back(view_of(py::reinterpret_borrow<py::object>(d), "hvp").clone());
             const Tensor seed_view = seed.is_none() ? Tensor{} : view_of(seed, "hvp");
             const TapeInUse use(t);
             const Tensor s = seed.is_none() ? Tensor::full(y.dtype(), y.shape(), 1.0) : seed_view;
             Tape::HessianVectorProduct r;
             {
               py::gil_scoped_release nogil;
               r = t.hvp(y, s, wrt, dirs);
             }
             py::list gradient, hv;
             for (const Tensor& g : r.gradient) gradient.append(copy_to_numpy(g));
             for (const Tensor& h : r.hvp) hv.append(copy_to_numpy(h));
             return py::make_tuple(gradient, hv);
           }, py::arg("y"), py::arg("wrt"), py::arg("directions"), py::arg("seed") = py::none(),
           "(gradient, H·v) of s = <seed, y> for the leaves wrt along the directions (forward over reverse)")
      .def("clear", [](PyTape& t) {
             const TapeInUse use(t);
             t.clear();
           })
      .def_property_readonly("num_nodes", [](PyTape& t) { return in_use(t, [&] { return t.num_nodes(); }); })
      .def_property_readonly("num_values", [](PyTape& t) { return in_use(t, [&] { return t.num_values(); }); });

  // The tape drawn (inspect/tape_dot.hpp): DOT text, or what Graphviz's dot renders of it (svg, png, ...); returned,
  // or with a path written there by the program's one file writer (models/files.hpp: atomic, links followed).
  m.def("_draw", [](PyTape& t, const std::string& format, const std::string& title, const std::string& path) {
    DotOptions o;
    o.registry = &builtin_registry();
    o.title = title;
    std::string out = in_use(t, [&] { return tape_to_dot(t, o); });
    {
      py::gil_scoped_release nogil;
      if (format != "dot") out = render_dot(out, format);
      if (!path.empty()) write_file_atomic(path, out);
    }
    return path.empty() ? py::object(py::bytes(out)) : py::object(py::none());
  }, py::arg("tape"), py::arg("format"), py::arg("title") = "", py::arg("path") = "");
  m.def("ops", [] {
    std::vector<std::string> names;
    for (const auto& [n, e] : op_table()) names.push_back(n);
    return names;
  }, "The ops Tape.op calls by name");
  m.def("registered_ops", [] {
    std::vector<std::string> names;
    for (const OpInfo& op : builtin_registry().ops()) names.push_back(op.name);
    return names;
  }, "The ops of tapegrad's registry (what tapegrad gradcheck --list and explain know)");
  // explain(op) as `tapegrad explain OP --json` prints it, parsed by Python's json module.
  m.def("_explain_json", [](const std::string& op, const std::string& derivations_path) {
    ExplainOptions o;
    o.derivations_path = derivations_path;
    Explanation e;
    {
      py::gil_scoped_release nogil;
      e = explain(builtin_registry(), op, o);
    }
    return explanation_json(e).dump();
  }, py::arg("op"), py::arg("derivations_path") = "");
}

}  // namespace tapegrad::python
