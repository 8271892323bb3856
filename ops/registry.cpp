// The registry of sheets (ops/registry.hpp), the built-in one filled from the sheets the build lists
// (builtin_registry(), ops/ops.hpp), and what a sheet's call reads: the keyword arguments of an op called by name
// (OpArgs) and the count of its inputs (InputCount, ops/sheet.hpp).
#include "ops/registry.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#ifndef TAPEGRAD_SOURCE_DIR
#define TAPEGRAD_SOURCE_DIR "."
#endif

#include "engine/rng.hpp"
#include "ops/all_ops.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

// ---- the keyword arguments and the input count of an op called by name (ops/sheet.hpp) ----

namespace {

// What a value is, for an error: "the number 0.5", "the string 'tanh'", "a list of 2 integers".
std::string describe(const OpArgs::Value& v) {
  struct Describe {
    std::string operator()(bool b) const { return b ? "True" : "False"; }
    std::string operator()(int64_t i) const { return fmt::format("the integer {}", i); }
    std::string operator()(double d) const { return fmt::format("the number {}", d); }
    std::string operator()(const std::vector<int64_t>& l) const {
      return fmt::format("the list [{}]", fmt::join(l, ", "));
    }
    std::string operator()(const std::string& s) const { return fmt::format("the string '{}'", s); }
  };
  return std::visit(Describe{}, v);
}

}  // namespace

OpArgs& OpArgs::set(std::string key, Value value) {
  values_.insert_or_assign(std::move(key), std::move(value));
  return *this;
}

const OpArgs::Value* OpArgs::find(std::string_view key) const {
  const auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

const OpArgs::Value& OpArgs::need(std::string_view key) const {
  if (const Value* v = find(key)) return *v;
  fail("{}: needs the keyword {}=", op_, key);
}

void OpArgs::wrong(std::string_view key, const Value& v, std::string_view expected) const {
  fail("{}: the keyword {}= must be {}, got {}", op_, key, expected, describe(v));
}

double OpArgs::number(std::string_view key) const {
  const Value& v = need(key);
  if (const double* d = std::get_if<double>(&v)) return *d;
  if (const int64_t* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  wrong(key, v, "a number");
}
double OpArgs::number(std::string_view key, double fallback) const { return has(key) ? number(key) : fallback; }

int64_t OpArgs::integer(std::string_view key) const { return need_a<int64_t>(key, "an integer"); }
int64_t OpArgs::integer(std::string_view key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }

int OpArgs::axis(std::string_view key) const {
  const int64_t i = integer(key);
  if (i < std::numeric_limits<int>::min() || i > std::numeric_limits<int>::max())
    wrong(key, need(key), "an axis (an integer of a few digits)");
  return static_cast<int>(i);
}
int OpArgs::axis(std::string_view key, int fallback) const { return has(key) ? axis(key) : fallback; }

bool OpArgs::flag(std::string_view key) const { return need_a<bool>(key, "True or False"); }
bool OpArgs::flag(std::string_view key, bool fallback) const { return has(key) ? flag(key) : fallback; }

std::vector<int64_t> OpArgs::integers(std::string_view key) const {
  return need_a<std::vector<int64_t>>(key, "a list of integers");
}

std::string OpArgs::text(std::string_view key) const { return need_a<std::string>(key, "a string"); }
std::string OpArgs::text(std::string_view key, std::string fallback) const { return has(key) ? text(key) : fallback; }

std::string InputCount::str() const {
  if (min == max) return std::to_string(min);
  if (max == any) return min == 1 ? "one or more" : fmt::format("{} or more", min);
  if (max == min + 1) return fmt::format("{} or {}", min, max);
  return fmt::format("{} to {}", min, max);
}

// ---- the registry ----

Registry::Registry(std::initializer_list<std::vector<OpSheet>> sheets) {
  for (const auto& s : sheets) add(s);
}

void Registry::add(std::vector<OpSheet> sheets) {
  for (OpSheet& op : sheets) {
    const SourcePlace at = op.registered_at;
    add(std::move(op), at);
  }
}

void Registry::add(OpSheet op, SourcePlace where) {
  if (op.name.empty()) fail("registry: an op needs a name");
  op.registered_at = where;
  if (find(op.name)) fail("registry: op '{}' is registered twice", op.name);
  if (op.call && op.inputs.max == 0) fail("registry: op '{}' has a .call and no .inputs (how many it takes)", op.name);
  ops_.push_back(std::move(op));
}

std::vector<std::string> Registry::callable() const {
  std::vector<std::string> names;
  for (const OpSheet& op : ops_)
    if (op.call) names.push_back(op.name);
  std::sort(names.begin(), names.end());
  return names;
}

Var Registry::call(std::string_view name, std::span<const Var> inputs, OpArgs args) const {
  const OpSheet* op = find(name);
  if (!op) fail("no op '{}'; the ops called by name: {}", name, fmt::join(callable(), ", "));
  if (!op->call)
    fail("op '{}' is not called by name: its sheet (family {}) gives it no .call; the ops called by name: {}", name,
         op->family, fmt::join(callable(), ", "));
  if (!op->inputs.accepts(inputs.size()))
    fail("{}: takes {} value{}, got {}", name, op->inputs.str(), op->inputs.max == 1 ? "" : "s", inputs.size());
  std::string shapes;
  for (const Var& x : inputs) {
    if (!x.live()) fail("{}: an input is {}", name, to_string(x));
    shapes += (shapes.empty() ? "" : ", ") + x.shape().str();
  }
  args.set_op(op->name);
  try {
    return op->call(inputs, args);
  } catch (const Error& e) {
    fail("{} on shapes {}: {}", name, shapes, e.what());
  }
}

void Registry::add_case(std::string_view op, GradcheckCase c) {
  for (auto& o : ops_)
    if (o.name == op) {
      o.cases.push_back(std::move(c));
      return;
    }
  fail("registry: gradcheck case '{}' names op '{}', which is not registered", c.name, op);
}

std::string source_text(const SourcePlace& where) {
  if (where.line() == 0) return "?";
  std::string_view file = where.file_name();
  constexpr std::string_view root = TAPEGRAD_SOURCE_DIR "/";
  if (file.starts_with(root)) {
    file.remove_prefix(root.size());
  } else {  // relative to the build folder (ccache's base_dir, CMakeLists.txt), or a file of another project: from
            // its innermost folder named as one of ours, if any
    size_t at = 0;
    bool found = false;
    for (std::string_view top : {"/engine/", "/ops/", "/inspect/", "/checker/", "/models/", "/tools/", "/python/",
                                 "/tests/", "/examples/", "/fuzz/"})
      if (const size_t p = file.rfind(top); p != std::string_view::npos && (!found || p > at)) {
        at = p;
        found = true;
      }
    if (found) file.remove_prefix(at + 1);
  }
  return fmt::format("{}:{}", file, where.line());
}

const OpSheet* Registry::find(std::string_view name) const {
  for (const auto& o : ops_)
    if (o.name == name) return &o;
  return nullptr;
}

Function unfused_form_at(const OpSheet& op, const GradcheckCase& c, std::span<const Tensor> xs) {
  const Function& form = c.unfused ? c.unfused : op.unfused;
  if (!form) return {};
  auto value = [&](const Function& f) {
    Tape t;
    std::vector<Var> vars;
    for (const Tensor& x : xs) vars.push_back(t.constant(x));
    return f(t, vars).value().clone();
  };
  const Tensor fused = value(c.build), steps = value(form);
  double worst = fused.shape() == steps.shape() ? 0 : 1;
  for (int64_t i = 0; worst == 0 && i < fused.numel(); ++i)
    worst = std::max(worst, std::abs(fused.item(i) - steps.item(i)) / (1 + std::abs(fused.item(i))));
  return worst <= 1e-12 ? form : Function{};
}

std::vector<Tensor> make_inputs(std::span<const InputSpec> specs, DType dtype, uint64_t seed) {
  Rng rng(seed);
  std::vector<Tensor> xs;
  for (const InputSpec& s : specs) {
    if (s.fill == Fill::indices) {
      if (s.index_bound <= 0) fail("input '{}': indices need a positive index_bound", s.name);
      Tensor t = Tensor::empty(DType::i32, s.shape);
      auto* p = t.data<int32_t>();
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<int32_t>(rng.below(s.index_bound));
      xs.push_back(t);
      continue;
    }
    Tensor t = Tensor::empty(DType::f64, s.shape);
    auto* p = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      switch (s.fill) {
        case Fill::normal: p[i] = rng.normal(); break;
        case Fill::positive: p[i] = rng.uniform(0.5, 2.0); break;
        case Fill::away_from_zero: p[i] = (rng.uniform() < 0.5 ? -1 : 1) * rng.uniform(0.2, 2.0); break;
        case Fill::zeros: p[i] = 0; break;
        case Fill::indices: break;
      }
    }
    xs.push_back(dtype == DType::f64 ? t : t.to(dtype));
  }
  return xs;
}

// The built-in ops: every sheet function the files of ops/ define, listed by the build (ops/all_ops.hpp).
Registry& builtin_registry() {
  static Registry registry;
  static std::once_flag once;
  std::call_once(once, [] { registry.add(builtin_ops()); });
  return registry;
}

}  // namespace tapegrad
