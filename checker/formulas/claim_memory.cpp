// The memory a claim's check takes, weighed over shapes before any value is computed: every formula walked as the
// evaluator would record it (checker/formulas/expression.cpp), counting the elements of each tensor it makes, with
// the shapes NumPy's broadcasting and each call give. `a * b` of a (5000, 1) and a (1, 5000) makes 25 million
// elements from 10 thousand: the inputs alone do not say what the check holds.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "checker/formulas/claim.hpp"
#include "checker/formulas/expression_tree.hpp"
#include "inspect/process_memory.hpp"

namespace tapegrad {

namespace {

using expression_detail::find_function;
using expression_detail::Kind;
using expression_detail::literal_int;
using Dims = std::vector<int64_t>;

double count(const Dims& d) {
  double n = 1;
  for (int64_t v : d) n *= static_cast<double>(v);
  return n;
}

// Shapes that do not fit: the formula's own check reports it, with its caret; the walk only stops.
struct DoesNotFit {};

// A subexpression over shapes: a number, or a tensor of `dims`.
struct ShapeValue {
  bool number = false;
  Dims dims;
};

// One formula in one context: the shape of its result, and `elements`, the sum of every tensor it records.
struct ShapeWalk {
  const std::map<std::string, Dims>& names;
  double elements = 0;

  Dims record(Dims d, double copies = 1) {
    elements += copies * count(d);
    return d;
  }

  static Dims broadcast(const Dims& a, const Dims& b) {
    Dims out(std::max(a.size(), b.size()), 1);
    for (size_t k = 1; k <= out.size(); ++k) {
      const int64_t x = k <= a.size() ? a[a.size() - k] : 1, y = k <= b.size() ? b[b.size() - k] : 1;
      if (x != y && x != 1 && y != 1) throw DoesNotFit{};
      out[out.size() - k] = std::max(x, y);
    }
    return out;
  }

  static size_t axis_of(int axis, size_t rank) {
    const int r = static_cast<int>(rank), a = axis < 0 ? axis + r : axis;
    if (a < 0 || a >= r) throw DoesNotFit{};
    return static_cast<size_t>(a);
  }

  // + - * / (as operators or calls): a number with a tensor records scale (* /) or a constant and the op (+ -).
  ShapeValue arithmetic(char op, const ShapeValue& a, const ShapeValue& b) {
    if (a.number && b.number) return {true, {}};
    if (a.number || b.number) {
      const Dims& d = a.number ? b.dims : a.dims;
      return {false, record(d, (op == '*' || (op == '/' && b.number)) ? 1 : 2)};
    }
    return {false, record(broadcast(a.dims, b.dims))};
  }

  // Recursive, one frame per level of the tree (up to the parser's bound of 1000 levels): the frame stays small
  // because every case but the operators is a call that is never inlined, whose locals live only while it runs.
  ShapeValue eval(const ExpressionNode& n) {
    switch (n.kind) {
      case Kind::number: return {true, {}};
      case Kind::name: {
        const auto at = names.find(n.name);
        if (at == names.end()) throw DoesNotFit{};
        return {false, at->second};
      }
      case Kind::negate: {
        const ShapeValue v = eval(*n.args[0]);
        return v.number ? v : ShapeValue{false, record(v.dims)};
      }
      case Kind::binary: return arithmetic(n.op, eval(*n.args[0]), eval(*n.args[1]));
      case Kind::call: return call(n);
    }
    throw DoesNotFit{};
  }

  [[gnu::noinline]] ShapeValue call(const ExpressionNode& n) {
    const std::string& f = n.name;
    const auto* spec = find_function(f);
    if (!spec) throw DoesNotFit{};
    std::vector<ShapeValue> args;
    for (size_t i = 0; i < n.args.size(); ++i)
      if (std::find(spec->axes.begin(), spec->axes.end(), i) == spec->axes.end()) args.push_back(eval(*n.args[i]));
    auto axis = [&](size_t i) {
      const std::optional<int> a = literal_int(*n.args[i]);
      if (!a) throw DoesNotFit{};
      return *a;
    };
    if (f == "add" || f == "sub" || f == "mul" || f == "div")
      return arithmetic(f == "add" ? '+' : f == "sub" ? '-' : f == "mul" ? '*' : '/', args[0], args[1]);
    if (f == "where") {  // a mask and its complement of cond's shape, each side masked, their sum
      const Dims& c = args[0].dims;
      record(c, 2);
      auto side = [&](const ShapeValue& v) { return v.number ? record(c) : record(broadcast(v.dims, c)); };
      return {false, record(broadcast(side(args[1]), side(args[2])))};
    }
    if (args.size() == 1 && args[0].number) return {true, {}};  // a number folded through exp, log, ...
    for (const ShapeValue& v : args)
      if (v.number) throw DoesNotFit{};
    const Dims& x = args[0].dims;
    if (f == "matmul") return {false, record(matmul(x, args[1].dims))};
    if (f == "linear") {  // x·Wᵀ + b, W (out, in)
      const Dims& w = args[1].dims;
      if (x.empty() || w.size() != 2 || w[1] != x.back()) throw DoesNotFit{};
      Dims out = x;
      out.back() = w[0];
      return {false, record(out)};
    }
    if (f == "sum" || f == "mean") {
      if (n.args.size() == 1) return {false, record({})};
      Dims out = x;
      const size_t a = axis_of(axis(1), x.size());
      if (n.axis_keyword) out.erase(out.begin() + static_cast<std::ptrdiff_t>(a));
      else out[a] = 1;
      return {false, record(out)};
    }
    if (f == "norm") {  // exp(½·log Σ e²): the square at e's size, then four at the reduced size
      Dims out = x;
      out[axis_of(axis(1), x.size())] = 1;
      record(x);
      return {false, record(out, 4)};
    }
    if (f == "transpose") {
      if (x.size() < 2) throw DoesNotFit{};
      Dims out = x;
      const size_t a = n.args.size() > 1 ? axis_of(axis(1), x.size()) : x.size() - 2;
      const size_t b = n.args.size() > 1 ? axis_of(axis(2), x.size()) : x.size() - 1;
      std::swap(out[a], out[b]);
      return {false, record(out)};
    }
    if (f == "squeeze" || f == "unsqueeze") {
      Dims out = x;
      if (f == "squeeze") out.erase(out.begin() + static_cast<std::ptrdiff_t>(axis_of(axis(1), x.size())));
      else out.insert(out.begin() + static_cast<std::ptrdiff_t>(axis_of(axis(1), x.size() + 1)), 1);
      return {false, record(out)};
    }
    if (f == "tril") return {false, record(x, 2)};  // the mask, then the product
    if (f == "layer_norm") {
      if (x.empty()) throw DoesNotFit{};
      elements += 2 * count(x) / static_cast<double>(std::max<int64_t>(x.back(), 1));  // μ and ρ per row
    }
    return {false, record(x)};  // exp, log, tanh, sigmoid, relu, gelu, elu, neg, softmax, log_softmax, row_normalize
  }

  // (..., m, k) @ (..., k, n) → (..., m, n), the batch axes broadcast.
  static Dims matmul(const Dims& a, const Dims& b) {
    if (a.size() < 2 || b.size() < 2 || a.back() != b[b.size() - 2]) throw DoesNotFit{};
    Dims out = broadcast(Dims(a.begin(), a.end() - 2), Dims(b.begin(), b.end() - 2));
    out.push_back(a[a.size() - 2]);
    out.push_back(b.back());
    return out;
  }
};

// Elements recorded by `text` over `names`; nothing where its shapes do not fit.
std::optional<std::pair<double, Dims>> walk(const std::string& text, const std::map<std::string, Dims>& names) {
  try {
    ShapeWalk w{names};
    const ShapeValue v = w.eval(*expression_detail::parse_tree(text, "formula"));
    return std::pair(w.elements, v.number ? Dims{} : v.dims);
  } catch (const DoesNotFit&) {
    return std::nullopt;
  } catch (const Error&) {  // a formula that does not parse: validate_claim says where
    return std::nullopt;
  }
}

// The lets that fit `names` (all the names they read are there), in order, each added to it: what they record.
double define_lets(const ClaimText& c, std::map<std::string, Dims>& names) {
  double elements = 0;
  for (const auto& l : c.lets)
    if (auto r = walk(l.formula, names)) {
      elements += r->first;
      names.emplace(l.name, r->second);
    }
  return elements;
}

// The largest evaluation of `rules` (the vjp, jvp or hvp formulas) in the context `names`, the lets that fit it first.
double largest_rule(const ClaimText& c, std::map<std::string, Dims> names, const std::vector<std::string>& rules) {
  const double lets = define_lets(c, names);
  double largest = 0;
  for (const std::string& text : rules)
    if (auto r = walk(text, names)) largest = std::max(largest, r->first);
  return rules.empty() ? 0 : lets + largest;
}

}  // namespace

ClaimMemory estimate_claim_memory(const ClaimText& c) {
  ClaimMemory m;
  std::map<std::string, Dims> forward, tangents;
  for (const InputSpec& in : c.inputs) {
    const Dims d(in.shape.dims().begin(), in.shape.dims().end());
    forward.emplace(in.name, d);
    tangents.emplace(fmt::format("t_{}", in.name), d);
    m.input_elements += count(d);
  }
  std::map<std::string, Dims> base = forward;
  m.forward_elements = define_lets(c, forward);
  const auto y = walk(c.forward.formula, forward);
  if (!y) return m;  // shapes that do not fit: refused by validate_claim, before anything of size is made
  m.forward_elements += y->first;
  m.output_elements = count(y->second);
  base.emplace("y", y->second);
  std::map<std::string, Dims> reverse = base, tangent = base;
  reverse.emplace("g", y->second);
  tangent.insert(tangents.begin(), tangents.end());
  std::map<std::string, Dims> second = reverse;
  second.insert(tangents.begin(), tangents.end());
  auto formulas = [](const std::vector<ClaimText::Line>& lines) {
    std::vector<std::string> out;
    for (const auto& l : lines) out.push_back(l.formula);
    return out;
  };
  const std::vector<std::string> jvp = c.jvp ? std::vector{c.jvp->formula} : std::vector<std::string>{};
  m.rule_elements = std::max({largest_rule(c, reverse, formulas(c.vjp)), largest_rule(c, tangent, jvp),
                              largest_rule(c, second, formulas(c.hvp))});
  return m;
}

double ClaimMemory::bytes() const {
  // float64 throughout. The finite differences evaluate the forward on tapes of their own, f(x ± εv); a claimed
  // rule is evaluated on a private tape that holds the point (x, y, g or the tangents) beside what its formula
  // records. Of y's size: the fast mode keeps, per output element and projection (4), the JVP's analytic and
  // numeric values in vectors that grow as it goes (16 with their spare capacity), beside y, the cotangents and
  // the differences; 30 in all, measured (docs/claims/README.md). Of the inputs' size: their copies, the
  // perturbed ones and the directions.
  return 8 * (kForwardTapes * forward_elements + rule_elements + kOutputCopies * output_elements +
              kInputCopies * input_elements);
}

void require_claim_memory(const ClaimText& c) {
  const ClaimMemory m = estimate_claim_memory(c);
  require_memory(m.bytes(),
                 fmt::format("claim {} ({:.4g} input elements; its forward makes {:.4g}, its output {:.4g})", c.where,
                             m.input_elements, m.forward_elements, m.output_elements),
                 "check the formula on smaller inputs (a derivative that holds on a 4x6 input holds on larger "
                 "ones), or raise TAPEGRAD_MEMORY_LIMIT where more memory can be used");
}

}  // namespace tapegrad
