#include "engine/gradcheck/expression.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <functional>

#include <fmt/format.h>

#include "ops/ops.hpp"

namespace tapegrad {

namespace {

// Display column of a byte offset: UTF-8 continuation bytes take no column.
size_t column_of(std::string_view text, size_t offset) {
  size_t col = 0;
  for (size_t i = 0; i < std::min(offset, text.size()); ++i) col += (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80;
  return col;
}

}  // namespace

ExpressionError::ExpressionError(std::string label_, std::string text_, size_t offset_, std::string message_)
    : Error(fmt::format("{}: {}\n  {}\n  {}^", label_, message_, text_, std::string(column_of(text_, offset_), ' '))),
      label(std::move(label_)),
      text(std::move(text_)),
      offset(offset_),
      message(std::move(message_)) {}

struct ExpressionNode {
  enum class Kind { number, name, call, binary, negate } kind = Kind::number;
  size_t offset = 0;   // where the node starts (a binary node: its operator)
  double number = 0;   // number
  std::string name;    // name, call
  char op = 0;         // binary: + - * /
  std::vector<std::shared_ptr<const ExpressionNode>> args;  // call, binary (2), negate (1)
};

namespace {

using NodePtr = std::shared_ptr<const ExpressionNode>;
using Kind = ExpressionNode::Kind;

std::shared_ptr<ExpressionNode> node(Kind kind, size_t offset) {
  auto n = std::make_shared<ExpressionNode>();
  n->kind = kind;
  n->offset = offset;
  return n;
}

// A call's arity; the arguments at `axes` are whole numbers written in the call.
struct FunctionSpec {
  std::string_view name;
  size_t min_args, max_args;
  std::vector<size_t> axes;
};

const std::vector<FunctionSpec>& functions() {
  static const std::vector<FunctionSpec> table = {
      {"exp", 1, 1, {}},         {"log", 1, 1, {}},         {"tanh", 1, 1, {}},
      {"relu", 1, 1, {}},        {"gelu", 1, 1, {}},        {"elu", 1, 1, {}},
      {"neg", 1, 1, {}},         {"softmax", 1, 1, {}},     {"log_softmax", 1, 1, {}},
      {"row_normalize", 1, 1, {}}, {"add", 2, 2, {}},       {"sub", 2, 2, {}},
      {"mul", 2, 2, {}},         {"div", 2, 2, {}},         {"matmul", 2, 2, {}},
      {"linear", 2, 3, {}},      {"layer_norm", 3, 3, {}},  {"sum", 1, 2, {1}},
      {"mean", 1, 2, {1}},       {"norm", 2, 2, {1}},       {"transpose", 1, 3, {1, 2}},
      {"where", 3, 3, {}},       {"tril", 1, 2, {1}},
  };
  return table;
}

const FunctionSpec* find_function(std::string_view name) {
  for (const auto& f : functions())
    if (f.name == name) return &f;
  return nullptr;
}

std::string function_names() {
  std::string s;
  for (const auto& f : functions()) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

// A whole number written in the text: 2, -1.
std::optional<int> literal_int(const ExpressionNode& n) {
  if (n.kind == Kind::negate) {
    auto v = literal_int(*n.args[0]);
    return v ? std::optional<int>(-*v) : std::nullopt;
  }
  if (n.kind != Kind::number || n.number != std::floor(n.number) || std::abs(n.number) > 64) return std::nullopt;
  return static_cast<int>(n.number);
}

// Recursive descent over the grammar of expression.hpp.
class Parser {
 public:
  Parser(std::string_view text, const std::string& label) : text_(text), label_(label) {}

  NodePtr parse() {
    NodePtr e = expression();
    skip_space();
    if (pos_ < text_.size()) error(pos_, fmt::format("unexpected '{}' after the expression", token_text()));
    return e;
  }

 private:
  [[noreturn]] void error(size_t at, std::string message) const {
    throw ExpressionError(label_, std::string(text_), at, std::move(message));
  }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool accept(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) return ++pos_, true;
    return false;
  }
  // The token at pos_, for messages.
  std::string token_text() const {
    if (pos_ >= text_.size()) return "end of text";
    size_t end = pos_ + 1;
    if (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')
      while (end < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[end])) || text_[end] == '_')) ++end;
    else
      while (end < text_.size() && (static_cast<unsigned char>(text_[end]) & 0xC0) == 0x80) ++end;
    return std::string(text_.substr(pos_, end - pos_));
  }

  NodePtr expression() {
    NodePtr left = term();
    for (;;) {
      skip_space();
      const size_t at = pos_;
      if (!accept('+') && !accept('-')) return left;
      left = binary(text_[at], at, left, term());
    }
  }
  NodePtr term() {
    NodePtr left = unary();
    for (;;) {
      skip_space();
      const size_t at = pos_;
      if (!accept('*') && !accept('/')) return left;
      left = binary(text_[at], at, left, unary());
    }
  }
  NodePtr unary() {
    skip_space();
    const size_t at = pos_;
    if (accept('-')) {
      auto n = node(Kind::negate, at);
      n->args.push_back(unary());
      return n;
    }
    return primary();
  }
  NodePtr primary() {
    skip_space();
    const size_t at = pos_;
    if (pos_ >= text_.size()) error(at, "expected an expression, found the end of the text");
    const char c = text_[pos_];
    if (accept('(')) {
      NodePtr e = expression();
      skip_space();
      if (!accept(')')) error(pos_, fmt::format("expected ')' to close the '(' at column {}, found {}",
                                                column_of(text_, at) + 1, quoted_token()));
      return e;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') return number();
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') return name_or_call();
    error(at, fmt::format("expected a number, a name or '(', found {}", quoted_token()));
  }
  std::string quoted_token() const { return pos_ >= text_.size() ? "the end of the text" : fmt::format("'{}'", token_text()); }

  NodePtr number() {
    const size_t at = pos_;
    size_t end = pos_;
    while (end < text_.size() && (std::isdigit(static_cast<unsigned char>(text_[end])) || text_[end] == '.')) ++end;
    if (end < text_.size() && (text_[end] == 'e' || text_[end] == 'E')) {
      size_t e = end + 1;
      if (e < text_.size() && (text_[e] == '+' || text_[e] == '-')) ++e;
      if (e < text_.size() && std::isdigit(static_cast<unsigned char>(text_[e]))) {
        end = e;
        while (end < text_.size() && std::isdigit(static_cast<unsigned char>(text_[end]))) ++end;
      }
    }
    double v = 0;
    auto [p, ec] = std::from_chars(text_.data() + at, text_.data() + end, v);
    if (ec != std::errc() || p != text_.data() + end || !std::isfinite(v))
      error(at, fmt::format("'{}' is not a number", text_.substr(at, end - at)));
    pos_ = end;
    auto n = node(Kind::number, at);
    n->number = v;
    return n;
  }

  NodePtr name_or_call() {
    const size_t at = pos_;
    while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_'))
      ++pos_;
    std::string name(text_.substr(at, pos_ - at));
    skip_space();
    if (!accept('(')) {
      auto n = node(Kind::name, at);
      n->name = name;
      return n;
    }
    const FunctionSpec* f = find_function(name);
    if (!f) error(at, fmt::format("unknown function '{}'; the functions are {}", name, function_names()));
    auto n = node(Kind::call, at);
    n->name = name;
    skip_space();
    if (!accept(')')) {
      do n->args.push_back(expression());
      while (accept(','));
      skip_space();
      if (!accept(')')) error(pos_, fmt::format("expected ',' or ')' in the arguments of {}, found {}", name,
                                                quoted_token()));
    }
    const size_t count = n->args.size();
    const bool transpose_two = f->name == "transpose" && count == 2;
    if (count < f->min_args || count > f->max_args || transpose_two) {
      std::string takes = f->name == "transpose"                ? "1 or 3 arguments (e, or e, a, b)"
                          : f->min_args == f->max_args          ? fmt::format("{} argument{}", f->min_args,
                                                                              f->min_args == 1 ? "" : "s")
                                                                : fmt::format("{} to {} arguments", f->min_args,
                                                                              f->max_args);
      error(at, fmt::format("{} takes {}, got {}", name, takes, count));
    }
    for (size_t a : f->axes)
      if (a < count && !literal_int(*n->args[a]))
        error(n->args[a]->offset, fmt::format("argument {} of {} is an axis: a whole number written here, as -1",
                                              a + 1, name));
    return n;
  }

  NodePtr binary(char op, size_t at, NodePtr left, NodePtr right) {
    auto n = node(Kind::binary, at);
    n->op = op;
    n->args = {std::move(left), std::move(right)};
    return n;
  }

  std::string_view text_;
  const std::string& label_;
  size_t pos_ = 0;
};

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
          error(n.offset, fmt::format("unknown name '{}'; the names here are {}", n.name,
                                      known.empty() ? "none" : known));
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
  Var constant(double c, const Var& like) {
    Tensor t = Tensor::empty(like.dtype(), Shape{});
    if (like.dtype() == DType::f64) t.data<double>()[0] = c;
    else t.data<float>()[0] = static_cast<float>(c);
    return like.tape().constant(t);
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
    return at(n, [&]() -> Var {
      if (op == '*' && b.is_number) return scale(a.var, b.number);
      if (op == '*' && a.is_number) return scale(b.var, a.number);
      if (op == '/' && b.is_number) return scale(a.var, 1 / b.number);
      const Var l = a.is_number ? constant(a.number, b.var) : a.var;
      const Var r = b.is_number ? constant(b.number, a.var) : b.var;
      switch (op) {
        case '+': return add(l, r);
        case '-': return sub(l, r);
        case '*': return mul(l, r);
        default: return div(l, r);
      }
    });
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
      if (f == "relu") return relu(x[0]);
      if (f == "gelu") return gelu(x[0]);
      if (f == "elu") return elu(x[0]);
      if (f == "neg") return neg(x[0]);
      if (f == "softmax") return softmax(x[0]);
      if (f == "log_softmax") return log_softmax(x[0]);
      if (f == "row_normalize") return row_normalize(x[0]);
      if (f == "matmul") return matmul(x[0], x[1]);
      if (f == "linear") return linear(x[0], x[1], x.size() > 2 ? x[2] : Var{});
      if (f == "layer_norm") return layer_norm(x[0], x[1], x[2]);
      if (f == "sum") return n.args.size() == 1 ? sum(x[0]) : sum(x[0], axis(1), true);
      if (f == "mean") return n.args.size() == 1 ? mean(x[0]) : mean(x[0], axis(1), true);
      if (f == "norm") return exp(scale(log(sum(mul(x[0], x[0]), axis(1), true)), 0.5));
      if (f == "tril") return mul(x[0], x[0].tape().constant(lower_triangle(x[0], n.args.size() > 1 ? axis(1) : 0)));
      if (f == "transpose") return n.args.size() == 1 ? transpose(x[0]) : transpose(x[0], axis(1), axis(2));
      fail("{}: not an op of the expression language", f);
    });
  }

  // where(cond, a, b) = a·m + b·(1 − m), m = [cond ≠ 0] a constant of cond's shape.
  Value where(const ExpressionNode& n, const std::vector<Value>& args) {
    const Var cond = tensor_argument(n, 0, args[0]);
    const Var like = !args[1].is_number ? args[1].var : !args[2].is_number ? args[2].var : cond;
    return at(n, [&]() -> Var {
      const Tensor& c = cond.value();
      Tensor mask = Tensor::empty(like.dtype(), c.shape()), rest = Tensor::empty(like.dtype(), c.shape());
      for (int64_t k = 0; k < c.numel(); ++k) {
        const bool on = c.item(k) != 0;
        if (like.dtype() == DType::f64) mask.data<double>()[k] = on, rest.data<double>()[k] = !on;
        else mask.data<float>()[k] = on, rest.data<float>()[k] = !on;
      }
      Tape& tape = like.tape();
      auto side = [&](const Value& v, const Tensor& m) {
        return v.is_number ? scale(tape.constant(m), v.number) : mul(v.var, tape.constant(m));
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

}  // namespace

Formula Formula::parse(std::string_view text, std::string label) {
  Formula f;
  f.text_ = std::string(text);
  f.label_ = std::move(label);
  f.root_ = Parser(f.text_, f.label_).parse();
  return f;
}

std::vector<std::string> Formula::names() const {
  std::vector<std::string> out;
  collect_names(*root_, out);
  return out;
}

Shape Formula::check(const std::map<std::string, Shape>& shapes) const {
  Tape tape;
  std::map<std::string, Var> zeros;
  for (const auto& [name, shape] : shapes) zeros.emplace(name, tape.constant(Tensor::zeros(DType::f64, shape)));
  NoGradGuard no_grad(tape);
  return evaluate(zeros).shape();
}

Var Formula::evaluate(const std::map<std::string, Var>& values) const {
  Evaluator ev(text_, label_, values);
  Value v = ev.eval(*root_);
  if (!v.is_number) return v.var;
  if (values.empty()) throw ExpressionError(label_, text_, 0, "the formula is a number and names no tensor");
  const Var& like = values.begin()->second;
  Tensor t = Tensor::empty(like.dtype(), Shape{});
  if (like.dtype() == DType::f64) t.data<double>()[0] = v.number;
  else t.data<float>()[0] = static_cast<float>(v.number);
  return like.tape().constant(t);
}

Var formula(std::string_view text, const std::map<std::string, Var>& values) {
  return Formula::parse(text).evaluate(values);
}

}  // namespace tapegrad
