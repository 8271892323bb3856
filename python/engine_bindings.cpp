#include "python/engine_bindings.hpp"

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>
#include <pybind11/stl.h>

#include "checker/explain.hpp"
#include "checker/trace.hpp"
#include "inspect/tape_dot.hpp"
#include "models/files.hpp"
#include "ops/ops.hpp"
#include "ops/registry.hpp"
#include "python/numpy_tensor.hpp"

namespace tapegrad::python {

namespace {

// A Python keyword argument as one of OpArgs' kinds (ops/sheet.hpp): a bool, an integer, a number, a string, or a
// sequence of integers; numpy's scalars and what has __index__ or __float__ count as what they convert to. Read
// with the GIL and the tape's lock held: a keyword's __float__ that calls back into the same tape is refused
// (TapeInUse), not run in the middle of the op.
OpArgs::Value keyword_value(const std::string& op, const std::string& key, const py::handle v) {
  auto integer = [&](const py::handle i) {
    int overflow = 0;
    const long long n = PyLong_AsLongLongAndOverflow(py::int_(py::reinterpret_borrow<py::object>(i)).ptr(), &overflow);
    if (overflow != 0) fail("{}: the keyword {}= is an integer too large for 64 bits", op, key);
    return static_cast<int64_t>(n);
  };
  const std::string type = Py_TYPE(v.ptr())->tp_name;
  if (py::isinstance<py::bool_>(v) || type == "numpy.bool_" || type == "numpy.bool") return v.cast<bool>();
  if (py::isinstance<py::int_>(v)) return integer(v);
  if (py::isinstance<py::float_>(v)) return v.cast<double>();
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (py::hasattr(v, "__index__")) return integer(v);
  if (py::isinstance<py::sequence>(v)) {
    std::vector<int64_t> list;
    for (const py::handle item : py::reinterpret_borrow<py::sequence>(v)) {
      if (py::isinstance<py::bool_>(item) || !(py::isinstance<py::int_>(item) || py::hasattr(item, "__index__")))
        fail("{}: the keyword {}= holds a {}; a list keyword holds integers", op, key, Py_TYPE(item.ptr())->tp_name);
      list.push_back(integer(item));
    }
    return list;
  }
  if (py::hasattr(v, "__float__")) return py::float_(py::reinterpret_borrow<py::object>(v)).cast<double>();
  fail("{}: the keyword {}= is a {}; keywords are bools, integers, numbers, strings or lists of integers", op, key,
       type);
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
  // The names given to leaves and constants (Tape.leaf(x, name="q")), by value id, as DotOptions::names holds them
  // for the drawing; read and written with the lock held, forgotten by clear().
  std::unordered_map<uint32_t, std::string> names;
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

// The name given to v where it was made (Tape.leaf(x, name="q")), or "" for none or a Var from before clear().
// Called with the tape's lock held.
std::string name_of(const Var& v) {
  if (!v.defined() || !v.live()) return {};
  const auto& names = static_cast<const PyTape&>(v.tape()).names;
  const auto it = names.find(v.id());
  return it == names.end() ? std::string() : it->second;
}

// v's name quoted for a message ("'q'"), or "input 1" where it has none.
std::string input_text(const Var& v, size_t i) {
  const std::string name = name_of(v);
  return name.empty() ? fmt::format("input {}", i) : fmt::format("'{}'", name);
}

// A leaf's or a constant's name, refused where it could not be read back on a drawing or in a message.
void name_value(PyTape& t, const Var& v, const py::object& name, const char* what) {
  if (name.is_none()) return;
  if (!py::isinstance<py::str>(name)) fail("{}: name= is a {}; a name is a string", what, Py_TYPE(name.ptr())->tp_name);
  std::string n = name.cast<std::string>();
  if (n.empty()) fail("{}: name= is empty; leave it out for a value without a name", what);
  t.names[v.id()] = std::move(n);
}

// f() with the lock of the tape `on` (a Tape or a Var's) held.
template <class On, class F>
auto in_use(On& on, F&& f) {
  const TapeInUse use(on);
  return f();
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
      .def_property_readonly("shape",
                             [](const Var& v) {
                               const TapeInUse use(v);
                               const auto d = v.shape().dims();
                               return py::tuple(py::cast(std::vector<int64_t>(d.begin(), d.end())));
                             })
      .def_property_readonly("dtype",
                             [](const Var& v) { return in_use(v, [&] { return std::string(dtype_name(v.dtype())); }); })
      .def_property_readonly("live", [](const Var& v) { return in_use(v, [&] { return v.live(); }); })
      .def_property_readonly("id", &Var::id)
      .def("numpy", [](const Var& v) { return in_use(v, [&] { return value_array(v); }); })
      .def_property_readonly(
          "name",
          [](const Var& v) {
            return in_use(v, [&] {
              const std::string n = name_of(v);
              return n.empty() ? py::object(py::none()) : py::object(py::str(n));
            });
          },
          "The name given by Tape.leaf(x, name=...) or Tape.constant(x, name=...); None for none")
      .def("__repr__", [](const Var& v) {
        return in_use(v, [&] {
          const std::string n = name_of(v), text = to_string(v);
          // "Var #0 'q' ..." : the name after the id, as the drawing shows it beside the op.
          if (n.empty()) return text;
          const size_t space = text.find(' ', 4);
          return text.substr(0, space) + fmt::format(" '{}'", n) +
                 (space == std::string::npos ? "" : text.substr(space));
        });
      });

  // Each binding holds the tape's lock (TapeInUse) for the whole call: calls on one tape from several threads run
  // one after another.
  py::class_<PyTape>(m, "Tape", "A tape: leaves from numpy arrays, the built-in ops by name, reverse and forward mode")
      .def(py::init<>())
      // The leaf's memory is the array's own (no copy) when it is a C-contiguous float32/float64 array; the tape
      // keeps a reference to it until clear().
      // A Var points at its tape: each one returned keeps the Python tape alive (keep_alive<0, 1>).
      // A name (name="q") is shown on the value's node in tapegrad.graph and in the messages of Tape.op.
      .def(
          "leaf",
          [](PyTape& t, const py::object& a, bool requires_grad, const py::object& name) {
            const Tensor value = view_of(a, "leaf");
            const TapeInUse use(t);
            const Var v = t.leaf(value, requires_grad);
            name_value(t, v, name, "leaf");
            return v;
          },
          py::arg("array"), py::arg("requires_grad") = true, py::kw_only(), py::arg("name") = py::none(),
          py::keep_alive<0, 1>())
      .def(
          "constant",
          [](PyTape& t, const py::object& a, const py::object& name) {
            const Tensor value = view_of(a, "constant");
            const TapeInUse use(t);
            const Var v = t.constant(value);
            name_value(t, v, name, "constant");
            return v;
          },
          py::arg("array"), py::kw_only(), py::arg("name") = py::none(), py::keep_alive<0, 1>())
      .def(
          "op",
          [](PyTape& t, const std::string& name, py::args values, const py::kwargs& kw) {
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
            OpArgs args(name);
            for (const auto& [key, value] : kw) {
              const std::string k = py::str(key);
              args.set(k, keyword_value(name, k, value));
            }
            // The op from its sheet (OpSheet::call), without the GIL. Its message names the inputs that have names
            // ("matmul on shapes (4, 3), (4, 4): ... [inputs: 'q', input 1]"): the shapes alone may not say which.
            std::string inputs;
            bool named = false;
            for (size_t i = 0; i < xs.size(); ++i) {
              named = named || !name_of(xs[i]).empty();
              inputs += (i ? ", " : "") + input_text(xs[i], i);
            }
            py::gil_scoped_release nogil;
            try {
              return builtin_registry().call(name, xs, std::move(args));
            } catch (const Error& e) {
              if (!named) throw;
              throw Error(fmt::format("{} [inputs: {}]", e.what(), inputs));
            } catch (const std::bad_alloc&) {
              std::string shapes;
              for (size_t i = 0; i < xs.size(); ++i) shapes += (i ? ", " : "") + xs[i].shape().str();
              throw OutOfMemory(
                  fmt::format("{} on shapes {}: the memory for its result and its work could not be "
                              "allocated (no node was recorded)",
                              name, shapes));
            }
          },
          py::keep_alive<0, 1>())
      .def(
          "backward",
          [](PyTape& t, const Var& y, const py::object& seed) {
            const Tensor s = seed.is_none() ? Tensor{} : view_of(seed, "backward");
            const TapeInUse use(t);
            py::gil_scoped_release nogil;
            t.backward(y, s);
          },
          py::arg("y"), py::arg("seed") = py::none())
      .def("grad", [](const PyTape&, const Var& v) { return in_use(v, [&] { return grad_array(v); }); })
      .def("retain_grad",
           [](PyTape& t, const Var& v) {
             const TapeInUse use(t);
             t.retain_grad(v);
           })
      .def(
          "jvp",
          [](PyTape& t, const Var& y, const std::vector<Var>& leaves, const py::list& tangents) {
            if (leaves.size() != py::len(tangents))
              fail("jvp: {} leaves and {} tangents", leaves.size(), py::len(tangents));
            std::vector<Tensor> views;
            for (size_t i = 0; i < leaves.size(); ++i) views.push_back(view_of(tangents[i], "jvp"));
            const TapeInUse use(t);
            for (size_t i = 0; i < leaves.size(); ++i) t.set_tangent(leaves[i], views[i].clone());
            {
              py::gil_scoped_release nogil;
              t.propagate_tangents();
            }
            const Tensor ty = t.tangent(y);
            return ty.defined() ? py::object(copy_to_numpy(ty)) : py::object(py::none());
          },
          py::arg("y"), py::arg("leaves"), py::arg("tangents"),
          "The tangent of y for the leaves' tangents: J·ẋ by forward mode over what was recorded")
      .def(
          "hvp",
          [](PyTape& t, const Var& y, const std::vector<Var>& wrt, const py::list& directions, const py::object& seed) {
            std::vector<Tensor> dirs;
            for (const py::handle d : directions)
              dirs.push_back(view_of(py::reinterpret_borrow<py::object>(d), "hvp").clone());
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
          },
          py::arg("y"), py::arg("wrt"), py::arg("directions"), py::arg("seed") = py::none(),
          "(gradient, H·v) of s = <seed, y> for the leaves wrt along the directions (forward over reverse)")
      .def("clear",
           [](PyTape& t) {
             const TapeInUse use(t);
             t.clear();
             t.names.clear();
           })
      .def_property_readonly("num_nodes", [](PyTape& t) { return in_use(t, [&] { return t.num_nodes(); }); })
      .def_property_readonly("num_values", [](PyTape& t) { return in_use(t, [&] { return t.num_values(); }); });

  // The tape drawn (inspect/tape_dot.hpp): DOT text, or what Graphviz's dot renders of it (svg, png, ...); returned,
  // or with a path written there by the program's one file writer (models/files.hpp: atomic, links followed).
  m.def(
      "_draw",
      [](PyTape& t, const std::string& format, const std::string& title, const std::string& path, bool formulas,
         size_t max_nodes) {
        DotOptions o;
        o.registry = &builtin_registry();
        o.title = title;
        o.formulas = formulas;
        o.max_nodes = max_nodes;
        o.caller = DotOptions::Caller::python;  // its hints name Python's calls (tape.retain_grad(v))
        std::string out = in_use(t, [&] {
          o.names = t.names;
          return tape_to_dot(t, o);
        });
        {
          py::gil_scoped_release nogil;
          if (format != "dot") out = render_dot(out, format);
          if (!path.empty()) write_file_atomic(path, out);
        }
        return path.empty() ? py::object(py::bytes(out)) : py::object(py::none());
      },
      py::arg("tape"), py::arg("format"), py::arg("title") = "", py::arg("path") = "", py::arg("formulas") = true,
      py::arg("max_nodes") = DotOptions{}.max_nodes);
  m.def(
      "ops", [] { return builtin_registry().callable(); },
      "The ops Tape.op calls by name: those of tapegrad's registry whose sheet gives a call");
  m.def(
      "registered_ops",
      [] {
        std::vector<std::string> names;
        for (const OpSheet& op : builtin_registry().ops()) names.push_back(op.name);
        return names;
      },
      "The ops of tapegrad's registry (what tapegrad gradcheck --list and explain know)");
  // explain(op) as `tapegrad explain OP --json` prints it, parsed by Python's json module.
  m.def(
      "_explain_json",
      [](const std::string& op, const std::string& derivations_path) {
        ExplainOptions o;
        o.derivations_path = derivations_path;
        Explanation e;
        {
          py::gil_scoped_release nogil;
          e = explain(builtin_registry(), op, o);
        }
        return explanation_json(e).dump();
      },
      py::arg("op"), py::arg("derivations_path") = "");
  // explain(op, trace=True): `tapegrad explain OP --trace --json` parsed by Python's json module, and its text.
  m.def(
      "_trace_json",
      [](const std::string& op, uint64_t seed, const std::vector<std::pair<std::string, std::vector<int64_t>>>& at) {
        GradcheckOptions o;
        o.seed = seed;
        std::vector<std::pair<std::string, Shape>> shapes;
        for (const auto& [name, dims] : at) shapes.emplace_back(name, Shape(dims));
        OpTraceRun run;
        {
          py::gil_scoped_release nogil;
          run = trace_op(builtin_registry(), op, o, shapes);
        }
        nlohmann::json j = trace_json(run);
        j["text"] = format_trace(run);
        return j.dump();
      },
      py::arg("op"), py::arg("seed") = GradcheckOptions{}.seed,
      py::arg("shapes") = std::vector<std::pair<std::string, std::vector<int64_t>>>{});
}

}  // namespace tapegrad::python
