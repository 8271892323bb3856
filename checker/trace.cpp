#include "checker/trace.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "checker/explain.hpp"
#include "engine/functions.hpp"

namespace tapegrad {

namespace {

// The worked example's gradients agree with the node's when they differ by no more than this part of their size
// (the same float64 arithmetic in another order).
constexpr double kSameGradient = 1e-12;

// Keeps each line's value as the lines run.
class Recorder : public TraceLines {
 public:
  explicit Recorder(std::vector<TracedLine>& lines) : lines_(lines) {}
  void part(std::string_view title) override { part_ = title; }
  Var show(std::string_view formula, Var v) override {
    if (!v.live()) fail("trace: line '{}' has no value", formula);
    lines_.push_back({part_, std::string(formula), v.value().to(DType::f64)});
    return v;
  }

 private:
  std::vector<TracedLine>& lines_;
  std::string part_ = "forward";
};

double max_abs(const Tensor& t) {
  double m = 0;
  for (const double v : t.to_vector()) m = std::max(m, std::abs(v));
  return m;
}

// `text` with every line after the first indented by `indent` spaces (empty lines stay empty).
std::string indented(const std::string& text, size_t indent) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    out += text[i];
    if (text[i] == '\n' && i + 1 < text.size() && text[i + 1] != '\n') out += std::string(indent, ' ');
  }
  return out;
}

// x̄ for a one-letter input, d(bias) for a longer name.
std::string gradient_name(const std::string& input) {
  return input.size() == 1 ? input + "\u0304" : "d(" + input + ")";
}

// A value as the trace prints it: its numbers, without Tensor::str's first line (the dtype is always float64).
std::string numbers(const Tensor& t) {
  const std::string s = t.str();
  const size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(nl + 1);
}

std::vector<std::string> names_of_ops_with_traces(const Registry& registry) {
  std::vector<std::string> names;
  for (const OpSheet& op : registry.ops())
    if (op.trace) names.push_back(op.name);
  return names;
}

// The Jacobian of input i of f at `inputs`, (m, n): column k is f's JVP at the tangent e_k of that input.
Tensor jacobian_by_jvp(const Function& f, std::span<const Tensor> inputs, size_t i, int64_t m) {
  const int64_t n = inputs[i].numel();
  Tensor j = Tensor::zeros(DType::f64, Shape{m, n});
  std::vector<Tensor> tangents(inputs.size());
  for (int64_t k = 0; k < n; ++k) {
    tangents[i] = Tensor::zeros(DType::f64, inputs[i].shape());
    tangents[i].data<double>()[k] = 1;
    const std::vector<double> column = jvp(f, inputs, tangents).second.to_vector();
    for (int64_t r = 0; r < m; ++r) j.data<double>()[r * n + k] = column[static_cast<size_t>(r)];
  }
  return j;
}

}  // namespace

OpTraceRun trace_op(const Registry& registry, std::string_view name, const GradcheckOptions& options,
                    std::span<const std::pair<std::string, Shape>> shapes) {
  const OpSheet* op = registry.find(name);
  if (!op) fail("explain --trace: no op named '{}'", name);
  if (!op->trace) {
    std::string with;
    for (const std::string& n : names_of_ops_with_traces(registry)) with += (with.empty() ? "" : ", ") + n;
    fail("explain --trace: op '{}' has no worked example in its sheet; the ops that have one: {}", name, with);
  }
  const OpTrace& trace = *op->trace;
  GradcheckCase example = trace.example;
  example.inputs = inputs_at_shapes(example, op->name, shapes, kTraceMaxInputElements, "explain --trace");
  if (!shapes.empty()) {  // named by its shapes: "x (2, 4)"
    std::vector<std::string> named;
    for (const InputSpec& spec : example.inputs) named.push_back(fmt::format("{} {}", spec.name, spec.shape));
    example.name = fmt::format("{}", fmt::join(named, ", "));
  }
  OpTraceRun run;
  run.op = op->name;
  run.case_name = example.name;
  run.seed = options.seed;
  run.shapes_given = !shapes.empty();
  const CaseInputs in = case_inputs(example, options);
  for (size_t i = 0; i < in.values.size(); ++i) run.inputs.emplace_back(in.names[i], in.values[i]);

  // The node's VJP at a cotangent drawn from the seed.
  const Tensor y = evaluate(example.build, in.values);
  run.ybar = Tensor::uniform(DType::f64, y.shape(), options.seed + 1, -1.0, 1.0);
  const std::vector<Tensor> node_gradients = vjp(example.build, in.values, run.ybar);

  // The lines, on another tape: what they compute owes nothing to the node's rules.
  Tape lines_tape;
  std::vector<Var> lx;
  for (const Tensor& v : in.values) lx.push_back(lines_tape.constant(v));
  Recorder recorder(run.lines);
  const std::vector<Var> traced = trace.lines(recorder, lx, lines_tape.constant(run.ybar));
  if (traced.size() != in.values.size())
    fail("explain --trace {}: the worked example returns {} gradients for {} inputs", op->name, traced.size(),
         in.values.size());
  bool agree = true;
  const std::vector<double> ybar = run.ybar.to_vector();
  for (size_t i = 0; i < traced.size(); ++i) {
    if (!example.inputs[i].differentiable()) continue;
    TracedGradient g{in.names[i]};
    if (!traced[i].live()) fail("explain --trace {}: the worked example gives no gradient of {}", op->name, g.input);
    const Tensor mine = traced[i].value().to(DType::f64);
    if (mine.shape() != node_gradients[i].shape())
      fail("explain --trace {}: the worked example's gradient of {} has shape {}, the input {}", op->name, g.input,
           mine.shape(), node_gradients[i].shape());
    const std::vector<double> a = mine.to_vector(), b = node_gradients[i].to_vector();
    bool finite = true;
    for (size_t j = 0; j < a.size(); ++j) {
      finite = finite && std::isfinite(a[j]) && std::isfinite(b[j]);
      g.max_abs_diff = std::max(g.max_abs_diff, std::abs(a[j] - b[j]));
    }
    g.scale = max_abs(node_gradients[i]);
    g.agrees = finite && g.max_abs_diff <= kSameGradient * (1 + g.scale);
    agree = agree && g.agrees;
    run.gradients.push_back(g);

    // x̄ = Jᵀȳ, J from forward mode.
    TracedJacobian jac;
    jac.input = in.names[i];
    jac.rows = y.numel();
    jac.cols = in.values[i].numel();
    const Tensor j = jacobian_by_jvp(example.build, in.values, i, jac.rows);
    const std::vector<double> jv = j.to_vector();
    bool jac_finite = true;
    for (int64_t k = 0; k < jac.cols; ++k) {
      double jt_ybar = 0;
      for (int64_t r = 0; r < jac.rows; ++r) jt_ybar += jv[static_cast<size_t>(r * jac.cols + k)] * ybar[r];
      jac_finite = jac_finite && std::isfinite(jt_ybar);
      jac.max_abs_diff = std::max(jac.max_abs_diff, std::abs(jt_ybar - a[static_cast<size_t>(k)]));
    }
    jac.agrees = jac_finite && finite && jac.max_abs_diff <= kSameGradient * (1 + g.scale);
    if (jac.rows * jac.cols <= kTracePrintedJacobian) jac.value = j;
    agree = agree && jac.agrees;
    run.jacobians.push_back(jac);
  }
  run.check = gradcheck(example, options, op->name);
  run.passed = agree && !run.gradients.empty() && run.check.passed;
  return run;
}

std::string format_trace(const OpTraceRun& run) {
  std::string s = fmt::format("{}: its worked example ({}, seed {}), every value in float64\n", run.op,
                              run.shapes_given ? "at " + run.case_name : "'" + run.case_name + "'", run.seed);
  s += "\ninputs\n";
  for (const auto& [name, value] : run.inputs)
    s += fmt::format("  {}, shape {} =\n    {}\n", name, value.shape(), indented(numbers(value), 4));
  s += fmt::format("  ȳ, the cotangent of the output, drawn from the seed, shape {} =\n    {}\n", run.ybar.shape(),
                   indented(numbers(run.ybar), 4));
  std::string part;
  for (const TracedLine& line : run.lines) {
    if (line.part != part) s += fmt::format("\n{}\n", part = line.part);
    s += fmt::format("  {}   — shape {}\n    {}\n", line.formula, line.value.shape(), indented(numbers(line.value), 4));
  }
  s += "\nthe node's Jacobian J, built by forward mode: column k is its JVP at the tangent e_k, entry [j, k] is\n"
       "∂y_j/∂x_k with the elements of y and x in row-major order; and the VJP as its transpose, x̄ = Jᵀȳ\n";
  for (const TracedJacobian& j : run.jacobians) {
    const std::string bar = gradient_name(j.input);
    if (j.value.defined())
      s += fmt::format("  ∂y/∂{} ({} × {}) =\n    {}\n", j.input, j.rows, j.cols, indented(numbers(j.value), 4));
    else
      s += fmt::format("  ∂y/∂{}: {} × {}, not printed (at most {} entries are; --shape gives a smaller example)\n",
                       j.input, j.rows, j.cols, kTracePrintedJacobian);
    s += fmt::format("  Jᵀȳ against the lines' {}: max |difference| = {:.2e}: {}\n", bar, j.max_abs_diff,
                     j.agrees ? "the same" : "DIFFERENT");
  }
  s += "\nthese lines against the node's own VJP at the same ȳ:\n";
  for (const TracedGradient& g : run.gradients)
    s += fmt::format("  {0}: max |lines − node| = {1:.2e} (largest |{0}| {2:.3g}): {3}\n", gradient_name(g.input),
                     g.max_abs_diff, g.scale, g.agrees ? "the same" : "DIFFERENT");
  s += "\nthe node's gradcheck at these inputs:\n" + run.check.str();
  return s;
}

nlohmann::json trace_json(const OpTraceRun& run) {
  auto values = [](const Tensor& t) {
    std::vector<int64_t> dims;
    for (int a = 0; a < t.rank(); ++a) dims.push_back(t.shape()[a]);
    return nlohmann::json{{"shape", dims}, {"values", t.to_vector()}};
  };
  nlohmann::json j{{"op", run.op},
                   {"case", run.case_name},
                   {"seed", run.seed},
                   {"shapes_given", run.shapes_given},
                   {"passed", run.passed}};
  for (const auto& [name, value] : run.inputs) j["inputs"].push_back({{"name", name}, {"value", values(value)}});
  j["ybar"] = values(run.ybar);
  for (const TracedLine& l : run.lines)
    j["lines"].push_back({{"part", l.part}, {"formula", l.formula}, {"value", values(l.value)}});
  for (const TracedJacobian& jac : run.jacobians) {
    nlohmann::json one{{"input", jac.input},
                       {"rows", jac.rows},
                       {"cols", jac.cols},
                       {"max_abs_diff", jac.max_abs_diff},
                       {"agrees", jac.agrees}};
    if (jac.value.defined()) one["value"] = values(jac.value);
    j["jacobians"].push_back(one);
  }
  for (const TracedGradient& g : run.gradients)
    j["gradients"].push_back(
        {{"input", g.input}, {"max_abs_diff", g.max_abs_diff}, {"scale", g.scale}, {"agrees", g.agrees}});
  j["gradcheck_passed"] = static_cast<bool>(run.check.passed);
  return j;
}

}  // namespace tapegrad
