// The expression language's evaluator: a parsed formula recorded on a tape with the engine's ops.
#include "checker/formulas/expression.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "checker/formulas/expression_tree.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

using namespace expression_detail;

namespace {

// The number c as a 0-d constant of like's dtype, on like's tape.
Var scalar_constant(double c, const Var& like) {
  Tensor t = Tensor::empty(like.dtype(), Shape{});
  if (like.dtype() == DType::f64) t.data<double>()[0] = c;
  else t.data<float>()[0] = static_cast<float>(c);
  return like.tape().constant(t);
}

// A value while evaluating: a number (folded where both sides are numbers) or a Var.
struct Value {
  bool is_number = false;
  double number = 0;
  Var var;
};

// tril's mask: 1 where j ≤ i + offset over the last two axes (i, j) of x, else 0; x's shape and dtype.
Tensor lower_triangle(const Var& x, int offset) {
  if (x.rank() < 2) fail("tril: needs rank ≥ 2 (its last two axes are the matrix), got {}", x.shape());
  Tensor m = Tensor::zeros(x.dtype(), x.shape());
  const int64_t rows = x.shape()[x.rank() - 2], cols = x.shape().back();
  for (int64_t e = 0; e < m.numel(); ++e) {
    const int64_t i = e / cols % rows, j = e % cols;
    if (j > i + offset) continue;
    if (x.dtype() == DType::f64) m.data<double>()[e] = 1;
    else m.data<float>()[e] = 1;
  }
  return m;
}

// x without its axis `axis` (negative from the end), which must have size 1: torch's x.squeeze(axis), and with a
// sum over that axis, a sum that does not keep it.
Var squeezed(const Var& x, int axis) {
  const int a = axis < 0 ? axis + x.rank() : axis;
  if (a < 0 || a >= x.rank()) fail("squeeze: axis {} out of range for {}", axis, x.shape());
  if (x.shape()[a] != 1) fail("squeeze: axis {} of {} has size {}, not 1", axis, x.shape(), x.shape()[a]);
  std::vector<int64_t> dims;
  for (int d = 0; d < x.rank(); ++d)
    if (d != a) dims.push_back(x.shape()[d]);
  return reshape(x, Shape(std::span<const int64_t>(dims)));
}

// x with a new axis of size 1 at `axis` of the result (negative from the end of the result): torch's
// x.unsqueeze(axis).
Var unsqueezed(const Var& x, int axis) {
  const int a = axis < 0 ? axis + x.rank() + 1 : axis;
  if (a < 0 || a > x.rank()) fail("unsqueeze: axis {} out of range for {}", axis, x.shape());
  std::vector<int64_t> dims;
  for (int d = 0; d < x.rank(); ++d) dims.push_back(x.shape()[d]);
  dims.insert(dims.begin() + a, 1);
  return reshape(x, Shape(std::span<const int64_t>(dims)));
}

// Evaluates the tree on the tape of `values`; an op's Error becomes an ExpressionError at the node that called it.
class Evaluator {
 public:
  Evaluator(const std::string& text, const std::string& label, const std::map<std::string, Var>& values)
      : text_(text), label_(label), values_(values) {}

  Value eval(const ExpressionNode& n) {
    switch (n.kind) {
      case Kind::number: return {true, n.number, {}};
      case Kind::name: {
        auto it = values_.find(n.name);
        if (it == values_.end()) {
          std::string known;
          for (const auto& [k, v] : values_) known += (known.empty() ? "" : ", ") + k;
          error(n.offset,
                fmt::format("unknown name '{}'; the names here are {}", n.name, known.empty() ? "none" : known));
        }
        return {false, 0, it->second};
      }
      case Kind::negate: {
        Value v = eval(*n.args[0]);
        if (v.is_number) return {true, -v.number, {}};
        return at(n, [&] { return neg(v.var); });
      }
      case Kind::binary: {
        Value left = eval(*n.args[0]);  // left first: the first unknown name in reading order is reported
        Value right = eval(*n.args[1]);
        return arithmetic(n, n.op, std::move(left), std::move(right));
      }
      case Kind::call: return call(n);
    }
    return {};
  }

 private:
  [[noreturn]] void error(size_t offset, std::string message) const {
    throw ExpressionError(label_, text_, offset, std::move(message));
  }
  template <class F>
  Value at(const ExpressionNode& n, F&& op) {
    try {
      return {false, 0, op()};
    } catch (const ExpressionError&) {
      throw;
    } catch (const Error& e) {
      error(n.offset, e.what());
    }
  }
  Value arithmetic(const ExpressionNode& n, char op, Value a, Value b) {
    if (a.is_number && b.is_number) {
      switch (op) {
        case '+': return {true, a.number + b.number, {}};
        case '-': return {true, a.number - b.number, {}};
        case '*': return {true, a.number * b.number, {}};
        default: return {true, a.number / b.number, {}};
      }
    }
    if (!a.is_number && !b.is_number) operands_broadcast(n, op, a.var.shape(), b.var.shape());
    return at(n, [&]() -> Var {
      if (op == '*' && b.is_number) return scale(a.var, b.number);
      if (op == '*' && a.is_number) return scale(b.var, a.number);
      if (op == '/' && b.is_number) return scale(a.var, 1 / b.number);
      const Var l = a.is_number ? scalar_constant(a.number, b.var) : a.var;
      const Var r = b.is_number ? scalar_constant(b.number, a.var) : b.var;
      switch (op) {
        case '+': return add(l, r);
        case '-': return sub(l, r);
        case '*': return mul(l, r);
        default: return div(l, r);
      }
    });
  }
  // NumPy's rule, which the arithmetic ops follow: the shapes aligned from the right, each pair of axes equal or one
  // of them 1 (a missing axis counts as 1). Where they are not, the error names both operands as written, their
  // shapes and the first axis from the right that differs, at the operator.
  void operands_broadcast(const ExpressionNode& n, char op, const Shape& a, const Shape& b) const {
    const int ra = a.rank(), rb = b.rank();
    for (int d = 1; d <= std::max(ra, rb); ++d) {
      const int64_t sa = d <= ra ? a[ra - d] : 1, sb = d <= rb ? b[rb - d] : 1;
      if (sa == sb || sa == 1 || sb == 1) continue;
      auto written = [&](size_t i) { return text_.substr(n.args[i]->begin, n.args[i]->end - n.args[i]->begin); };
      error(n.offset, fmt::format("`{}` {} {} `{}` {}: the shapes do not broadcast; aligned from the right, axis {} "
                                  "has {} against {}, and NumPy's rule wants the two equal or one of them 1 (a (T, "
                                  "Tk) bias adds to (B, T, Tk) scores, a (C) weight multiplies (N, C) rows)",
                                  written(0), a, op, written(1), b, -d, sa, sb));
    }
  }
  Var tensor_argument(const ExpressionNode& call, size_t i, const Value& v) {
    if (v.is_number)
      error(call.args[i]->offset, fmt::format("argument {} of {} must be a tensor, not a number", i + 1, call.name));
    return v.var;
  }

  Value call(const ExpressionNode& n) {
    const std::string& f = n.name;
    const FunctionSpec& spec = *find_function(f);
    auto is_axis = [&](size_t i) { return std::find(spec.axes.begin(), spec.axes.end(), i) != spec.axes.end(); };
    std::vector<Value> args;
    for (size_t i = 0; i < n.args.size(); ++i) args.push_back(is_axis(i) ? Value{true, 0, {}} : eval(*n.args[i]));
    auto axis = [&](size_t i) { return *literal_int(*n.args[i]); };
    if (f == "add" || f == "sub" || f == "mul" || f == "div")
      return arithmetic(n, f == "add" ? '+' : f == "sub" ? '-' : f == "mul" ? '*' : '/', args[0], args[1]);
    if (f == "where") return where(n, args);
    // Numbers fold through the plain functions of one variable.
    if (args.size() == 1 && args[0].is_number) {
      const double v = args[0].number;
      if (f == "exp") return {true, std::exp(v), {}};
      if (f == "log") return {true, std::log(v), {}};
      if (f == "tanh") return {true, std::tanh(v), {}};
      if (f == "sigmoid") return {true, 1 / (1 + std::exp(-v)), {}};
      if (f == "relu") return {true, std::max(v, 0.0), {}};
      if (f == "neg") return {true, -v, {}};
    }
    std::vector<Var> x;
    for (size_t i = 0; i < args.size(); ++i)
      if (!is_axis(i)) x.push_back(tensor_argument(n, i, args[i]));
    return at(n, [&]() -> Var {
      if (f == "exp") return exp(x[0]);
      if (f == "log") return log(x[0]);
      if (f == "tanh") return tanh(x[0]);
      if (f == "sigmoid") return sigmoid(x[0]);
      if (f == "relu") return relu(x[0]);
      if (f == "gelu") return gelu(x[0]);
      if (f == "gelu_erf") return gelu_erf(x[0]);
      if (f == "elu") return elu(x[0]);
      if (f == "neg") return neg(x[0]);
      if (f == "softmax") return softmax(x[0]);
      if (f == "log_softmax") return log_softmax(x[0]);
      if (f == "row_normalize") return row_normalize(x[0]);
      if (f == "matmul") return matmul(x[0], x[1]);
      if (f == "linear") return linear(x[0], x[1], x.size() > 2 ? x[2] : Var{});
      if (f == "layer_norm") return layer_norm(x[0], x[1], x[2]);
      if (f == "sum") return n.args.size() == 1 ? sum(x[0]) : sum(x[0], axis(1), !n.axis_keyword);
      if (f == "mean") return n.args.size() == 1 ? mean(x[0]) : mean(x[0], axis(1), !n.axis_keyword);
      if (f == "norm") return exp(scale(log(sum(mul(x[0], x[0]), axis(1), true)), 0.5));
      if (f == "tril") return mul(x[0], x[0].tape().constant(lower_triangle(x[0], n.args.size() > 1 ? axis(1) : 0)));
      if (f == "transpose") return n.args.size() == 1 ? transpose(x[0]) : transpose(x[0], axis(1), axis(2));
      if (f == "squeeze") return squeezed(x[0], axis(1));
      if (f == "unsqueeze") return unsqueezed(x[0], axis(1));
      fail("{}: not an op of the expression language", f);
    });
  }

  // where(cond, a, b) = a·m + b·(1 − m), m = [cond ≠ 0] a constant of cond's shape.
  Value where(const ExpressionNode& n, const std::vector<Value>& args) {
    const Var cond = tensor_argument(n, 0, args[0]);
    const Var like = !args[1].is_number ? args[1].var : !args[2].is_number ? args[2].var : cond;
    return at(n, [&]() -> Var {
      const Tensor c = cond.value();  // a handle: the tape's records move as constants are added below
      Tensor mask = Tensor::empty(like.dtype(), c.shape()), rest = Tensor::empty(like.dtype(), c.shape());
      for (int64_t k = 0; k < c.numel(); ++k) {
        const bool on = c.item(k) != 0;
        if (like.dtype() == DType::f64) mask.data<double>()[k] = on, rest.data<double>()[k] = !on;
        else mask.data<float>()[k] = on, rest.data<float>()[k] = !on;
      }
      Tape& tape = like.tape();
      // A number is written where its side holds and 0 elsewhere, not scaled from the mask: −inf·0 would be NaN.
      auto side = [&](const Value& v, const Tensor& m) {
        if (!v.is_number) return mul(v.var, tape.constant(m));
        Tensor filled = Tensor::zeros(like.dtype(), c.shape());
        for (int64_t k = 0; k < c.numel(); ++k) {
          if (m.item(k) == 0) continue;
          if (like.dtype() == DType::f64) filled.data<double>()[k] = v.number;
          else filled.data<float>()[k] = static_cast<float>(v.number);
        }
        return tape.constant(filled);
      };
      return add(side(args[1], mask), side(args[2], rest));
    });
  }

  const std::string& text_;
  const std::string& label_;
  const std::map<std::string, Var>& values_;
};

void collect_names(const ExpressionNode& n, std::vector<std::string>& out) {
  if (n.kind == Kind::name && std::find(out.begin(), out.end(), n.name) == out.end()) out.push_back(n.name);
  for (const auto& a : n.args) collect_names(*a, out);
}

// The parts of n's subtree that may hold a tensor: every node but numbers (and -number), and no axis argument.
void collect_parts(const ExpressionNode& n, std::vector<Formula::Part>& out) {
  if (literal_int(n) || n.kind == Kind::number || (n.kind == Kind::negate && n.args[0]->kind == Kind::number)) return;
  Formula::Part part{n.begin, n.end, std::nullopt, std::nullopt, {0, 0}, std::nullopt, std::nullopt};
  if (n.kind == Kind::call && n.name == "transpose" && n.args.size() == 1)
    part.argument = std::pair(n.args[0]->begin, n.args[0]->end);
  if (n.kind == Kind::call && n.args.size() == 2 && (n.name == "sum" || n.name == "mean" || n.name == "unsqueeze")) {
    part.axis = std::pair(n.args[1]->begin, n.args[1]->end);
    part.term = {n.args[0]->begin, n.args[0]->end};
  }
  auto is_softmax = [](const ExpressionNode& f) {
    return f.kind == Kind::call && f.args.size() == 1 && (f.name == "softmax" || f.name == "log_softmax");
  };
  auto swap_with_last = [](const ExpressionNode& e) -> std::optional<int> {  // transpose(·, a, -1): a; transpose(·): -2
    if (e.kind != Kind::call || e.name != "transpose") return std::nullopt;
    if (e.args.size() == 1) return -2;
    return e.args.size() == 3 && literal_int(*e.args[2]) == -1 ? literal_int(*e.args[1]) : std::nullopt;
  };
  if (is_softmax(n)) part.softmax = Formula::Part::Softmax{n.args[0]->begin, n.args[0]->end, -1, n.name[0] == 'l'};
  if (const auto a = swap_with_last(n); a && is_softmax(*n.args[0]))
    if (const ExpressionNode& inner = *n.args[0]->args[0]; swap_with_last(inner) == a)
      part.softmax = Formula::Part::Softmax{inner.args[0]->begin, inner.args[0]->end, *a, n.args[0]->name[0] == 'l'};
  if ((n.kind == Kind::binary && (n.op == '+' || n.op == '-')) || n.kind == Kind::negate) {
    part.sign = n.offset;
    part.term = {n.args.back()->begin, n.args.back()->end};
  }
  out.push_back(part);
  const FunctionSpec* spec = n.kind == Kind::call ? find_function(n.name) : nullptr;
  for (size_t i = 0; i < n.args.size(); ++i)
    if (!spec || std::find(spec->axes.begin(), spec->axes.end(), i) == spec->axes.end()) collect_parts(*n.args[i], out);
}

}  // namespace

Formula Formula::parse(std::string_view text, std::string label) {
  Formula f;
  f.text_ = std::string(text);
  f.label_ = std::move(label);
  f.root_ = parse_tree(f.text_, f.label_);
  return f;
}

std::vector<std::string> Formula::names() const {
  std::vector<std::string> out;
  collect_names(*root_, out);
  return out;
}

std::vector<Formula::Part> Formula::parts() const {
  std::vector<Part> out;
  collect_parts(*root_, out);
  return out;
}

Shape Formula::check(const std::map<std::string, Shape>& shapes) const {
  Tape tape;
  std::map<std::string, Var> zeros;
  // Only the names it reads: a claim checks each --let against every name before it, and zeros for all of them
  // made a chain of n lets cost n² tensors.
  for (const std::string& name : names())
    if (const auto at = shapes.find(name); at != shapes.end())
      zeros.emplace(name, tape.constant(Tensor::zeros(DType::f64, at->second)));
  NoGradGuard no_grad(tape);
  return evaluate(zeros).shape();
}

Var Formula::evaluate(const std::map<std::string, Var>& values) const {
  Evaluator ev(text_, label_, values);
  Value v = ev.eval(*root_);
  if (!v.is_number) return v.var;
  if (values.empty()) throw ExpressionError(label_, text_, 0, "the formula is a number and names no tensor");
  return scalar_constant(v.number, values.begin()->second);
}

Var formula(std::string_view text, const std::map<std::string, Var>& values) {
  return Formula::parse(text).evaluate(values);
}

}  // namespace tapegrad
