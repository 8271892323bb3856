#include "python/python_function.hpp"

#include <cstring>
#include <map>
#include <unordered_set>
#include <vector>

#include "engine/no_jvp.hpp"
#include "python/numpy_tensor.hpp"

namespace tapegrad::python {

namespace {

// A node keeps its op's name as a const char*: one stable copy per name (called under the GIL).
const char* interned(const std::string& name) {
  static std::unordered_set<std::string> names;
  return names.insert(name).first->c_str();
}

py::list copies(std::span<const Tensor> ts) {
  py::list out;
  for (const Tensor& t : ts) out.append(t.defined() ? py::object(copy_to_numpy(t)) : py::object(py::none()));
  return out;
}

// yshape as a Python tuple of ints, and the checker's per-input yes or no as a list of bools: the blocks' arguments.
py::tuple dims_of(const Shape& shape) {
  py::tuple dims(shape.rank());
  for (int d = 0; d < shape.rank(); ++d) dims[static_cast<size_t>(d)] = py::int_(shape[d]);
  return dims;
}
py::list bools(const std::vector<bool>& flags) {
  py::list out;
  for (const bool f : flags) out.append(py::bool_(f));
  return out;
}

// What a rule of the Python op returned for each input, added into the tape's buffers (undefined: not wanted).
void add_per_input(const py::object& result, std::span<Tensor> into, const char* op, const char* what) {
  if (!py::isinstance<py::sequence>(result) || py::len(result) != into.size())
    fail("{}: the {} must be a list of {} arrays (one per input, None for zero)", op, what, into.size());
  const auto items = py::reinterpret_borrow<py::sequence>(result);
  for (size_t i = 0; i < into.size(); ++i) {
    const py::object item = items[i];
    if (!into[i].defined() || item.is_none()) continue;
    const auto a = float64_result(item, into[i].shape(), op, fmt::format("{} of input {}", what, i));
    into[i].accumulate(Tensor(DType::f64, into[i].shape(), const_cast<double*>(a.data())));
  }
}

// The checker's blocks from the Python op's vjp_rows and unit_steps, each result checked as the per-point
// rules' results are.
class PythonBlocks final : public RuleBlocks {
 public:
  PythonBlocks(const char* name, py::object impl) : name_(name), impl_(std::move(impl)) {}

  std::vector<std::vector<Tensor>> vjp_rows(std::span<const Tensor> x, const Shape& yshape,
                                            const std::vector<bool>& wanted) override {
    const py::object got = impl_.attr("vjp_rows")(copies(x), dims_of(yshape), bools(wanted));
    if (!py::isinstance<py::sequence>(got) || py::len(got) != static_cast<size_t>(yshape.numel()))
      fail("{}: vjp_rows must return a list of {} rows (one per element of y)", name_, yshape.numel());
    std::vector<std::vector<Tensor>> rows;
    for (const py::handle row : got) {
      std::vector<Tensor> grads;  // zeros, into which x̄ is added as the tape's backward adds it; none where not wanted
      for (size_t i = 0; i < x.size(); ++i)
        grads.push_back(wanted[i] ? Tensor::zeros(DType::f64, x[i].shape()) : Tensor{});
      add_per_input(py::reinterpret_borrow<py::object>(row), grads, name_, "VJP");
      rows.push_back(std::move(grads));
    }
    return rows;
  }

  std::vector<bool> full_worth_its_cost(std::span<const Tensor> x, const Shape& yshape,
                                        const std::vector<bool>& wanted) override {
    if (!py::hasattr(impl_, "full_worth_its_cost")) return wanted;
    const py::object got = impl_.attr("full_worth_its_cost")(copies(x), dims_of(yshape), bools(wanted));
    if (!py::isinstance<py::sequence>(got) || py::len(got) != wanted.size())
      fail("{}: full_worth_its_cost must return a list of {} bools (one per input)", name_, wanted.size());
    std::vector<bool> worth;
    for (size_t i = 0; i < wanted.size(); ++i) worth.push_back(wanted[i] && py::cast<bool>(got[py::int_(i)]));
    return worth;
  }

  // Kept per input with the point and step they were taken at: the edit search (checker/formulas/edits.hpp) asks
  // for the checker's differences again, and gets them without evaluating f again.
  void unit_steps(std::span<const Tensor> x, size_t i, double eps, const Shape& yshape, std::span<double> plus,
                  std::span<double> minus) override {
    std::vector<double> at;
    for (const Tensor& xi : x) {
      const Tensor v = xi.to(DType::f64);
      at.insert(at.end(), v.data<double>(), v.data<double>() + v.numel());
    }
    Steps& kept = steps_[i];
    const bool same_point = kept.eps == eps && kept.plus.size() == plus.size() && kept.at.size() == at.size() &&
                            std::memcmp(kept.at.data(), at.data(), at.size() * sizeof(double)) == 0;
    if (!same_point) {
      const py::tuple got = impl_.attr("unit_steps")(copies(x), i, eps);
      const Shape block({x[i].numel(), yshape.numel()});
      if (got.size() != 2) fail("{}: unit_steps must return (plus, minus)", name_);
      kept = Steps{std::move(at), eps, {}, {}};
      for (auto [value, into] : {std::pair{got[0], &kept.plus}, std::pair{got[1], &kept.minus}}) {
        const auto a = float64_result(value, block, name_, fmt::format("outputs with input {} moved by ±ε", i));
        into->assign(a.data(), a.data() + block.numel());
      }
    }
    std::copy(kept.plus.begin(), kept.plus.end(), plus.begin());
    std::copy(kept.minus.begin(), kept.minus.end(), minus.begin());
  }

 private:
  struct Steps {
    std::vector<double> at;  // every input's values, in order
    double eps = 0;
    std::vector<double> plus, minus;
  };
  const char* name_;
  py::object impl_;
  std::map<size_t, Steps> steps_;
};

}  // namespace

std::unique_ptr<RuleBlocks> python_blocks(const PythonOp& op) {
  if (!py::hasattr(op.impl, "vjp_rows") || !py::hasattr(op.impl, "unit_steps")) return nullptr;
  return std::make_unique<PythonBlocks>(interned(op.name), op.impl);
}

Function python_function(const PythonOp& op) {
  const char* name = interned(op.name);
  const py::object impl = op.impl;
  const bool second_order = op.second_order;
  return [name, impl, second_order](Tape& tape, std::span<const Var> xs) -> Var {
    py::list arrays;
    for (const Var& x : xs) arrays.append(copy_to_numpy(x.value().to(DType::f64)));
    const py::tuple result = impl.attr("forward")(arrays, tape.recording());
    if (result.size() != 2) fail("{}: forward must return (y, state)", name);
    const py::object y_obj = result[0];
    const auto y_any = py::array::ensure(y_obj);
    if (!y_any) fail("{}: the output is not an array", name);
    const Shape yshape = shape_of(y_any, name);
    const auto y64 = float64_result(y_obj, yshape, name, "output");
    Tensor y = tape.empty(DType::f64, yshape);
    y.copy_from(Tensor(DType::f64, yshape, const_cast<double*>(y64.data())));
    const py::object state = result[1];

    auto vjp = [name, impl, state](const Tensor& gout, std::span<Tensor> gin) {
      add_per_input(impl.attr("vjp")(state, copy_to_numpy(gout)), gin, name, "VJP");
    };
    auto jvp = [name, impl, state, yshape](std::span<const Tensor> tin, Tensor& tout) {
      const py::object t = impl.attr("jvp")(state, copies(tin));
      if (t.is_none()) throw NoJvp(name);
      if (py::isinstance<py::str>(t)) fail("{}", std::string(py::str(t)));  // why it cannot be had (a reason)
      const auto a = float64_result(t, yshape, name, "JVP");
      tout.accumulate(Tensor(DType::f64, yshape, const_cast<double*>(a.data())));
    };
    if (!second_order) return tape.record(name, xs, std::move(y), std::move(vjp), std::move(jvp));
    auto second = [name, impl, state](const Tensor& gout, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
      const py::object r = impl.attr("vjp_tangent")(state, copy_to_numpy(gout), copies(tin));
      if (py::isinstance<py::str>(r)) fail("{}", std::string(py::str(r)));
      add_per_input(r, gin_dot, name, "second-order rule");
    };
    return tape.record(name, xs, std::move(y), std::move(vjp), std::move(jvp), std::move(second));
  };
}

}  // namespace tapegrad::python
