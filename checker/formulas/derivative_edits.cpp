#include "checker/formulas/derivative_edits.hpp"

#include <algorithm>
#include <array>
#include <cctype>

#include <fmt/format.h>

namespace tapegrad::edits_detail {

namespace {

// The functions whose derivative the search writes: its formula from the value v and the argument u, and in words.
struct Derivative {
  const char* function;
  const char* formula;  // {0}: v, {1}: u
  const char* words;
};
constexpr std::array<Derivative, 3> kDerivatives{{
    {"sigmoid", "{0} * (1 - {0})", "sigmoid′ = {0}·(1 − {0})"},
    {"tanh", "(1 - {0} * {0})", "tanh′ = 1 − {0}·{0}"},
    {"log", "1 / ({1})", "log′ = 1/({1})"},
}};

const Derivative* derivative_of(const std::string& function) {
  const auto it = std::find_if(kDerivatives.begin(), kDerivatives.end(),
                               [&](const Derivative& d) { return function == d.function; });
  return it == kDerivatives.end() ? nullptr : &*it;
}

// A name is written bare in a product; a longer value gets parentheses.
std::string operand(const std::string& value) {
  const bool bare = std::all_of(value.begin(), value.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || (static_cast<unsigned char>(c) & 0x80);
  });
  Formula::Part whole{};
  whole.end = value.size();
  return bare || elementwise_call(value, whole) ? value : "(" + value + ")";
}

}  // namespace

std::optional<ElementwiseCall> elementwise_call(const std::string& text, const Formula::Part& part) {
  const std::string t = text.substr(part.begin, part.end - part.begin);
  const size_t open = t.find('(');
  if (open == std::string::npos || t.back() != ')' || !derivative_of(t.substr(0, open))) return std::nullopt;
  int depth = 0;
  for (size_t k = open; k < t.size(); ++k) {  // the '(' after the name closes at the end, with no ',' at its level
    depth += t[k] == '(' ? 1 : t[k] == ')' ? -1 : 0;
    if (depth == 0 && k + 1 != t.size()) return std::nullopt;
    if (depth == 1 && t[k] == ',') return std::nullopt;
  }
  return ElementwiseCall{t, t, t.substr(0, open), t.substr(open + 1, t.size() - open - 2)};
}

std::vector<ElementwiseCall> elementwise_calls(const std::vector<std::pair<std::string, Formula>>& lets,
                                               const std::vector<const Formula*>& formulas) {
  std::vector<ElementwiseCall> out;
  auto add = [&](ElementwiseCall c) {
    if (std::none_of(out.begin(), out.end(), [&](const ElementwiseCall& o) { return o.value == c.value; }))
      out.push_back(std::move(c));
  };
  for (const auto& [name, f] : lets) {
    Formula::Part whole{};
    whole.end = f.text().size();
    if (auto c = elementwise_call(f.text(), whole)) {
      c->value = name;
      add(*c);
    }
  }
  std::vector<const Formula*> all = formulas;
  for (const auto& let : lets) all.push_back(&let.second);
  for (const Formula* f : all)
    for (const Formula::Part& part : f->parts())
      if (auto c = elementwise_call(f->text(), part)) add(*c);
  return out;
}

std::string derivative_formula(const ElementwiseCall& c) {
  const Derivative& d = *derivative_of(c.function);
  return fmt::format(fmt::runtime(d.formula), operand(c.value), c.argument);
}

std::string derivative_words(const ElementwiseCall& c) {
  const Derivative& d = *derivative_of(c.function);
  return fmt::format(fmt::runtime(d.words), operand(c.value), c.argument);
}

}  // namespace tapegrad::edits_detail
