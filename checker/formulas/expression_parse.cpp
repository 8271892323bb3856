// The expression language's parser: recursive descent over the grammar of expression.hpp, with the column of
// every error.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "checker/formulas/expression_tree.hpp"

namespace tapegrad {

namespace {

// Display column of a byte offset: UTF-8 continuation bytes take no column.
size_t column_of(std::string_view text, size_t offset) {
  size_t col = 0;
  for (size_t i = 0; i < std::min(offset, text.size()); ++i)
    col += (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80;
  return col;
}

// "label: message", the text (a window of it around the fault when it is long), and a caret under the fault;
// control bytes escaped in all three (escape_controls), the caret counting the escapes' width.
std::string with_caret(const std::string& label, const std::string& text, size_t offset, const std::string& message) {
  constexpr size_t kWidth = 100;
  size_t begin = 0, end = text.size();
  if (text.size() > kWidth) {
    begin = offset > kWidth / 2 ? offset - kWidth / 2 : 0;
    while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;  // whole characters
    end = std::min(text.size(), begin + kWidth);
    while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
  }
  const std::string before = begin > 0 ? "…" : "", after = end < text.size() ? "…" : "";
  const std::string_view shown = std::string_view(text).substr(begin, end - begin);
  const std::string up_to = escape_controls(shown.substr(0, std::min(offset - begin, shown.size())));
  return fmt::format("{}: {}\n  {}{}{}\n  {}^", escape_controls(label), escape_controls(message), before,
                     escape_controls(shown), after,
                     std::string(column_of(up_to, up_to.size()) + (begin > 0 ? 1 : 0), ' '));
}

}  // namespace

std::string escape_controls(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  return out;
}

ExpressionError::ExpressionError(std::string label_, std::string text_, size_t offset_, std::string message_)
    : Error(with_caret(label_, text_, offset_, message_)),
      label(std::move(label_)),
      text(std::move(text_)),
      offset(offset_),
      message(std::move(message_)) {}

namespace expression_detail {

namespace {

std::shared_ptr<ExpressionNode> node(Kind kind, size_t offset) {
  auto n = std::make_shared<ExpressionNode>();
  n->kind = kind;
  n->offset = n->begin = offset;
  return n;
}

const std::vector<FunctionSpec>& functions() {
  static const std::vector<FunctionSpec> table = {
      {"exp", 1, 1, {}},      {"log", 1, 1, {}},           {"tanh", 1, 1, {}},          {"relu", 1, 1, {}},
      {"gelu", 1, 1, {}},     {"gelu_erf", 1, 1, {}},      {"elu", 1, 1, {}},           {"neg", 1, 1, {}},
      {"softmax", 1, 1, {}},  {"log_softmax", 1, 1, {}},   {"row_normalize", 1, 1, {}}, {"add", 2, 2, {}},
      {"sub", 2, 2, {}},      {"mul", 2, 2, {}},           {"div", 2, 2, {}},           {"matmul", 2, 2, {}},
      {"linear", 2, 3, {}},   {"layer_norm", 3, 3, {}},    {"sum", 1, 2, {1}},          {"mean", 1, 2, {1}},
      {"norm", 2, 2, {1}},    {"transpose", 1, 3, {1, 2}}, {"where", 3, 3, {}},         {"tril", 1, 2, {1}},
      {"squeeze", 2, 2, {1}}, {"unsqueeze", 2, 2, {1}},    {"sigmoid", 1, 1, {}},
  };
  return table;
}

std::string function_names() {
  std::string s;
  for (const auto& f : functions()) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
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

  // Nesting (parentheses, calls, unary minus) deeper than this is refused rather than overflowing the parser's
  // stack. The tree itself is bounded too: a chain a + b + c + ... is parsed by a loop but makes a tree one level
  // deeper per operator, which the evaluator walks recursively, so no node may sit more than kMaxHeight levels
  // above its deepest leaf.
  static constexpr int kMaxDepth = 200;
  static constexpr int kMaxHeight = 1000;
  // Sets n's height from its arguments; refuses a tree deeper than kMaxHeight, at n's column.
  NodePtr measured(std::shared_ptr<ExpressionNode> n) {
    int h = 0;
    for (const auto& a : n->args) h = std::max(h, a->height);
    n->height = h + 1;
    if (n->height > kMaxHeight)
      error(n->offset, fmt::format("the formula is more than {} levels deep here (each operator of a chain such as "
                                   "a + b + c counts one level); split it with let",
                                   kMaxHeight));
    return n;
  }
  struct Deeper {
    Parser& p;
    explicit Deeper(Parser& parser, size_t at) : p(parser) {
      if (++p.depth_ > kMaxDepth) p.error(at, fmt::format("the formula nests deeper than {} levels", kMaxDepth));
    }
    ~Deeper() { --p.depth_; }
  };

  NodePtr expression() {
    Deeper deeper(*this, pos_);
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
      Deeper deeper(*this, at);
      auto n = node(Kind::negate, at);
      n->args.push_back(unary());
      n->end = n->args[0]->end;
      return measured(std::move(n));
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
      if (!accept(')'))
        error(pos_, fmt::format("expected ')' to close the '(' at column {}, found {}", column_of(text_, at) + 1,
                                quoted_token()));
      // The parentheses belong to the expression's span: a product (a) * (b + c) spans both, so that an edit that
      // puts it inside a call, or cuts it out, keeps the text whole.
      auto spanned = std::make_shared<ExpressionNode>(*e);
      spanned->begin = at;
      spanned->end = pos_;
      return spanned;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') return number();
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') return name_or_call();
    error(at, fmt::format("expected a number, a name or '(', found {}", quoted_token()));
  }
  std::string quoted_token() const {
    return pos_ >= text_.size() ? "the end of the text" : fmt::format("'{}'", token_text());
  }

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
    n->end = end;
    return n;
  }

  NodePtr name_or_call() {
    const size_t at = pos_;
    while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) ++pos_;
    std::string name(text_.substr(at, pos_ - at));
    const size_t name_end = pos_;
    skip_space();
    if (!accept('(')) {
      if (name == "inf") {  // the one number not written with digits: a mask's −inf (where(mask, -inf, s))
        auto n = node(Kind::number, at);
        n->number = INFINITY;
        n->end = name_end;
        return n;
      }
      auto n = node(Kind::name, at);
      n->name = name;
      n->end = name_end;
      return n;
    }
    const FunctionSpec* f = find_function(name);
    if (!f) error(at, fmt::format("unknown function '{}'; the functions are {}", name, function_names()));
    auto n = node(Kind::call, at);
    n->name = name;
    skip_space();
    if (!accept(')')) {
      do {
        if (keyword_axis(*f, n->args.size())) n->axis_keyword = true;
        n->args.push_back(expression());
      } while (accept(','));
      skip_space();
      if (!accept(')'))
        error(pos_, fmt::format("expected ',' or ')' in the arguments of {}, found {}", name, quoted_token()));
    }
    n->end = pos_;
    const size_t count = n->args.size();
    const bool transpose_two = f->name == "transpose" && count == 2;
    if (count < f->min_args || count > f->max_args || transpose_two) {
      std::string takes = f->name == "transpose" ? "1 or 3 arguments (e, or e, a, b)"
                          : f->min_args == f->max_args
                              ? fmt::format("{} argument{}", f->min_args, f->min_args == 1 ? "" : "s")
                              : fmt::format("{} to {} arguments", f->min_args, f->max_args);
      error(at, fmt::format("{} takes {}, got {}", name, takes, count));
    }
    for (size_t a : f->axes)
      if (a < count && !literal_int(*n->args[a]))
        error(n->args[a]->offset,
              fmt::format("argument {} of {} is an axis: a whole number written here, as -1", a + 1, name));
    return measured(std::move(n));
  }

  // Takes `axis =` before argument `index` of f where it is written: sum(e, axis=a) and mean(e, axis=a) drop the
  // axis they reduce, as NumPy's do, where sum(e, a) keeps it with size 1. Any other `name =` is an error.
  bool keyword_axis(const FunctionSpec& f, size_t index) {
    skip_space();
    const size_t at = pos_;
    size_t end = pos_;
    while (end < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[end])) || text_[end] == '_')) ++end;
    size_t after = end;
    while (after < text_.size() && std::isspace(static_cast<unsigned char>(text_[after]))) ++after;
    if (end == at || after >= text_.size() || text_[after] != '=') return false;
    const std::string_view keyword = text_.substr(at, end - at);
    const bool reduces = f.name == "sum" || f.name == "mean";
    if (keyword == "axis" && reduces && index != 1)
      error(at, fmt::format("axis= is the second argument of {0}: {0}(e, axis=a)", f.name));
    if (keyword != "axis" || !reduces)
      error(at, fmt::format("'{}=' is not an argument of {} here; the one keyword is axis=, the second argument of "
                            "sum and mean: sum(e, axis=a) drops axis a, sum(e, a) keeps it with size 1",
                            keyword, f.name));
    pos_ = after + 1;
    return true;
  }

  NodePtr binary(char op, size_t at, NodePtr left, NodePtr right) {
    auto n = node(Kind::binary, at);
    n->op = op;
    n->begin = left->begin;
    n->end = right->end;
    n->args = {std::move(left), std::move(right)};
    return measured(std::move(n));
  }

  std::string_view text_;
  const std::string& label_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

const FunctionSpec* find_function(std::string_view name) {
  for (const auto& f : functions())
    if (f.name == name) return &f;
  return nullptr;
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

NodePtr parse_tree(std::string_view text, const std::string& label) { return Parser(text, label).parse(); }

}  // namespace expression_detail
}  // namespace tapegrad
