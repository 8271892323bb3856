#include "checker/formulas/claim.hpp"

#include <algorithm>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "checker/explain.hpp"
#include "checker/second_order.hpp"
#include "checker/formulas/edits.hpp"
#include "checker/formulas/expression.hpp"

namespace tapegrad {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::vector<FileLine> joined_lines(std::string_view text) {
  std::vector<FileLine> lines;
  int number = 0;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    std::string_view raw = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++number;
    const std::string_view t = trim(raw);
    if (t.empty() || t.front() == '#') continue;
    const bool continued = std::isspace(static_cast<unsigned char>(raw.front()));
    if (continued && !lines.empty()) lines.back().text += fmt::format(" {}", t);
    else lines.push_back({number, std::string(t)});
  }
  return lines;
}

namespace {

bool is_identifier(std::string_view s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

// The parsed claim: formulas ready to evaluate, and the names each context gives them.
struct Parsed {
  struct Named {
    std::string name;
    Formula formula;
  };
  std::vector<InputSpec> inputs;
  std::vector<Named> lets;
  Formula forward;
  std::vector<std::optional<Formula>> vjp;  // per input
  std::optional<Formula> jvp;
  std::vector<std::optional<Formula>> hvp;  // per input
  bool has_hvp() const {
    return std::any_of(hvp.begin(), hvp.end(), [](const auto& f) { return f.has_value(); });
  }
};

// Evaluates, in order, the lets whose names are all in `values`, adding them there.
void define_lets(const std::vector<Parsed::Named>& lets, std::map<std::string, Var>& values) {
  for (const auto& l : lets) {
    const auto names = l.formula.names();
    if (std::all_of(names.begin(), names.end(), [&](const std::string& n) { return values.count(n) > 0; }))
      values.emplace(l.name, l.formula.evaluate(values));
  }
}

// The same over shapes; a let that fits no context is an error at the name it lacks (reported by check()).
void define_let_shapes(const std::vector<Parsed::Named>& lets, std::map<std::string, Shape>& shapes) {
  for (const auto& l : lets) {
    const auto names = l.formula.names();
    if (std::all_of(names.begin(), names.end(), [&](const std::string& n) { return shapes.count(n) > 0; }))
      shapes.emplace(l.name, l.formula.check(shapes));
  }
}

Parsed parse_formulas(const ClaimText& c) {
  if (c.inputs.empty())
    fail("claim '{}' ({}): no input (input NAME: D, D, ...)", escape_controls(c.name), escape_controls(c.where));
  if (c.forward.formula.empty())
    fail("claim '{}' ({}): no forward formula", escape_controls(c.name), escape_controls(c.where));
  if (c.vjp.empty() && !c.jvp && c.hvp.empty())
    fail("claim '{}' ({}): claims no VJP, JVP or HVP (a vjp, jvp or hvp line)", escape_controls(c.name),
         escape_controls(c.where));
  Parsed p;
  p.inputs = c.inputs;
  std::vector<std::string> taken = {"y", "g"};
  for (const auto& in : c.inputs) {
    if (!is_identifier(in.name))
      fail("claim '{}' ({}): '{}' is not a name", escape_controls(c.name), escape_controls(c.where),
           escape_controls(in.name));
    if (std::find(taken.begin(), taken.end(), in.name) != taken.end() || in.name.starts_with("t_"))
      fail("claim '{}' ({}): input '{}': y, g, t_NAME and names used twice are taken", c.name, c.where, in.name);
    taken.push_back(in.name);
    taken.push_back(fmt::format("t_{}", in.name));
  }
  for (const auto& l : c.lets) {
    if (!is_identifier(l.name)) fail("{}: '{}' is not a name", escape_controls(l.label), escape_controls(l.name));
    if (std::find(taken.begin(), taken.end(), l.name) != taken.end())
      fail("{}: let '{}': the name is taken (an input, y, g, t_NAME or an earlier let)", l.label, l.name);
    taken.push_back(l.name);
    p.lets.push_back({l.name, Formula::parse(l.formula, l.label)});
  }
  p.forward = Formula::parse(c.forward.formula, c.forward.label);
  // vjp and hvp lines: one formula per input, at most
  auto per_input = [&c](const std::vector<ClaimText::Line>& lines, const char* what) {
    std::vector<std::optional<Formula>> slots(c.inputs.size());
    for (const auto& v : lines) {
      auto it = std::find_if(c.inputs.begin(), c.inputs.end(), [&](const InputSpec& in) { return in.name == v.name; });
      if (it == c.inputs.end())
        fail("{}: {} names '{}', which is not an input", escape_controls(v.label), what, escape_controls(v.name));
      auto& slot = slots[static_cast<size_t>(it - c.inputs.begin())];
      if (slot) fail("{}: a second {} for '{}'", v.label, what, v.name);
      slot = Formula::parse(v.formula, v.label);
    }
    return slots;
  };
  p.vjp = per_input(c.vjp, "vjp");
  p.hvp = per_input(c.hvp, "hvp");
  if (c.jvp) p.jvp = Formula::parse(c.jvp->formula, c.jvp->label);
  return p;
}

// Whether `got` is `want` with axes of size 1 put in: a sum or mean that kept the axes it reduced.
bool kept_axes(const Shape& want, const Shape& got) {
  if (got.rank() <= want.rank()) return false;
  int w = 0;
  for (int d = 0; d < got.rank(); ++d) {
    if (w < want.rank() && got[d] == want[w]) ++w;
    else if (got[d] != 1) return false;
  }
  return w == want.rank();
}

[[noreturn]] void wrong_shape(const Formula& f, std::string_view what, const Shape& want, const Shape& got) {
  const std::string hint = kept_axes(want, got) ? " (sum(e, a) and mean(e, a) keep axis a with size 1; "
                                                  "sum(e, axis=a) and mean(e, axis=a) drop it)"
                                                : "";
  throw ExpressionError(f.label(), f.text(), 0,
                        fmt::format("{} must have the shape {}; this formula gives {}{}", what, want, got, hint));
}

// Names and shapes of every formula in its context, before anything is evaluated.
void check_shapes(const Parsed& p) {
  std::map<std::string, Shape> forward;
  for (const auto& in : p.inputs) forward.emplace(in.name, in.shape);
  std::map<std::string, Shape> base = forward;
  define_let_shapes(p.lets, forward);
  const Shape y = p.forward.check(forward);
  base.emplace("y", y);
  std::map<std::string, Shape> reverse = base, tangent = base;
  reverse.emplace("g", y);
  for (const auto& in : p.inputs) tangent.emplace(fmt::format("t_{}", in.name), in.shape);
  std::map<std::string, Shape> second = reverse;  // an hvp reads g and the tangents
  second.insert(tangent.begin(), tangent.end());
  define_let_shapes(p.lets, reverse);
  define_let_shapes(p.lets, tangent);
  define_let_shapes(p.lets, second);
  for (const auto& l : p.lets)  // a let no rule can evaluate: the name it lacks, with a caret
    if (!reverse.count(l.name) && !tangent.count(l.name) && !(p.has_hvp() && second.count(l.name))) {
      std::map<std::string, Shape> all = reverse;
      all.insert(tangent.begin(), tangent.end());
      l.formula.check(all);
      throw ExpressionError(l.formula.label(), l.formula.text(), 0,
                            "this let reads g and a tangent t_NAME together: g belongs to the VJP, t_NAME to the JVP "
                            "(both to an hvp line, which this claim does not have)");
    }
  for (size_t i = 0; i < p.inputs.size(); ++i)
    if (p.vjp[i]) {
      const Shape s = p.vjp[i]->check(reverse);
      if (!(s == p.inputs[i].shape))
        wrong_shape(*p.vjp[i], fmt::format("x̄ of {}", p.inputs[i].name), p.inputs[i].shape, s);
    }
  if (p.jvp) {
    const Shape s = p.jvp->check(tangent);
    if (!(s == y)) wrong_shape(*p.jvp, "ẏ", y, s);
  }
  for (size_t i = 0; i < p.inputs.size(); ++i)
    if (p.hvp[i]) {
      const Shape s = p.hvp[i]->check(second);
      if (!(s == p.inputs[i].shape))
        wrong_shape(*p.hvp[i], fmt::format("(H·t) of {}", p.inputs[i].name), p.inputs[i].shape, s);
    }
}

Fill parse_fill(std::string_view option, std::string_view text, std::string_view fill) {
  if (fill == "normal") return Fill::normal;
  if (fill == "positive") return Fill::positive;
  if (fill == "away_from_zero") return Fill::away_from_zero;
  fail("{}: '{}' in '{}' is not a fill (normal, positive or away_from_zero)", escape_controls(option),
       escape_controls(fill), escape_controls(text));
}

}  // namespace

InputSpec parse_claim_input(std::string_view option, std::string_view text) {
  std::string compact;
  for (char ch : text)
    if (!std::isspace(static_cast<unsigned char>(ch))) compact += ch;
  const auto colon = compact.find(':');
  if (colon == std::string::npos || colon == 0)
    fail("{}: expected NAME:D,D,... (an input's name and its dimensions), got '{}'", escape_controls(option),
         escape_controls(text));
  std::string dims = compact.substr(colon + 1);
  Fill fill = Fill::normal;
  if (const auto second = dims.find(':'); second != std::string::npos) {
    fill = parse_fill(option, text, std::string_view(dims).substr(second + 1));
    dims.resize(second);
  }
  auto [name, shape] = parse_named_shape(option, fmt::format("{}={}", compact.substr(0, colon), dims));
  return {name, shape, fill};
}

std::optional<std::pair<std::string, std::string>> split_named_formula(std::string_view text) {
  const auto eq = text.find('=');
  if (eq == std::string_view::npos) return std::nullopt;
  const std::string_view name = trim(text.substr(0, eq));
  if (!is_identifier(name)) return std::nullopt;
  return std::pair<std::string, std::string>(name, trim(text.substr(eq + 1)));
}

std::vector<ClaimText> parse_claims(std::string_view text, std::string_view path) {
  const std::vector<FileLine> lines = joined_lines(text);
  std::vector<ClaimText> claims;
  auto current = [&](int line) -> ClaimText& {
    if (claims.empty()) {
      claims.emplace_back();
      claims.back().where = fmt::format("{}:{}", path, line);
    }
    return claims.back();
  };
  for (const FileLine& numbered : lines) {
    const int line = numbered.number;
    const std::string& t = numbered.text;
    const auto space = t.find_first_of(" \t");
    const std::string key = t.substr(0, space);
    const std::string rest(space == std::string::npos ? std::string_view{} : trim(std::string_view(t).substr(space)));
    const std::string where = fmt::format("{}:{}", path, line);
    auto named = [&](std::string_view what) {
      auto split = split_named_formula(rest);
      if (!split) fail("{}: expected '{} NAME = FORMULA', got '{}'", escape_controls(where), what, escape_controls(t));
      return *split;
    };
    if (key == "claim") {
      if (!is_identifier(rest))
        fail("{}: expected 'claim NAME' (letters, digits, _), got '{}'", escape_controls(where), escape_controls(t));
      claims.emplace_back();
      claims.back().name = rest;
      claims.back().where = where;
    } else if (key == "input") {
      current(line).inputs.push_back(parse_claim_input(where, rest));
    } else if (key == "let") {
      auto [name, f] = named("let");
      current(line).lets.push_back({name, f, fmt::format("{} (let {})", where, name)});
    } else if (key == "forward") {
      ClaimText& c = current(line);
      if (!c.forward.formula.empty()) fail("{}: a second forward in claim '{}'", where, c.name);
      c.forward = {"", rest, fmt::format("{} (forward)", where)};
    } else if (key == "vjp") {
      auto [name, f] = named("vjp");
      current(line).vjp.push_back({name, f, fmt::format("{} (vjp {})", where, name)});
    } else if (key == "hvp") {
      auto [name, f] = named("hvp");
      current(line).hvp.push_back({name, f, fmt::format("{} (hvp {})", where, name)});
    } else if (key == "jvp") {
      ClaimText& c = current(line);
      if (c.jvp) fail("{}: a second jvp in claim '{}'", where, c.name);
      c.jvp = ClaimText::Line{"", rest, fmt::format("{} (jvp)", where)};
    } else {
      fail("{}: '{}' is not a claim line (claim, input, let, forward, vjp, jvp, hvp; # starts a comment)",
           escape_controls(where), escape_controls(key));
    }
  }
  if (claims.empty()) fail("{}: no claim", escape_controls(path));
  return claims;
}

void validate_claim(const ClaimText& claim) { check_shapes(parse_formulas(claim)); }

GradcheckReport check_claim(const ClaimText& text, const GradcheckOptions& opt, const UndefinedEdges* edges) {
  auto p = std::make_shared<const Parsed>(parse_formulas(text));
  check_shapes(*p);
  auto bind_inputs = [p](std::span<const Var> x) {
    std::map<std::string, Var> values;
    for (size_t i = 0; i < p->inputs.size(); ++i) values.emplace(p->inputs[i].name, x[i]);
    return values;
  };
  Function forward = [p, bind_inputs](Tape&, std::span<const Var> x) {
    std::map<std::string, Var> values = bind_inputs(x);
    define_lets(p->lets, values);
    return p->forward.evaluate(values);
  };
  // The context of a rule: the point (x, y) as constants on a private tape, and g or the tangents.
  auto point = [p](Tape& tape, const ClaimPoint& at) {
    std::map<std::string, Var> values;
    for (size_t i = 0; i < p->inputs.size(); ++i) values.emplace(p->inputs[i].name, tape.constant(at.inputs[i]));
    values.emplace("y", tape.constant(at.output));
    return values;
  };
  Claim claim{text.name, forward, {}, {}};
  if (std::any_of(p->vjp.begin(), p->vjp.end(), [](const auto& f) { return f.has_value(); }))
    claim.vjp = [p, point, forward](const ClaimPoint& at, const Tensor& g, std::span<Tensor> gin) {
      Tape tape;
      std::map<std::string, Var> values = point(tape, at);
      values.emplace("g", tape.constant(g));
      define_lets(p->lets, values);
      std::vector<Tensor> own;  // the forward's own VJP, for inputs the claim says nothing about
      for (size_t i = 0; i < gin.size(); ++i) {
        if (!gin[i].defined()) continue;
        if (p->vjp[i]) {
          gin[i].accumulate(p->vjp[i]->evaluate(values).value());
        } else {
          if (own.empty()) own = vjp(forward, at.inputs, g);
          gin[i].accumulate(own[i]);
        }
      }
    };
  if (p->jvp)
    claim.jvp = [p, point](const ClaimPoint& at, std::span<const Tensor> tin, Tensor& tout) {
      Tape tape;
      std::map<std::string, Var> values = point(tape, at);
      for (size_t i = 0; i < p->inputs.size(); ++i)
        values.emplace(fmt::format("t_{}", p->inputs[i].name),
                       tape.constant(tin[i].defined() ? tin[i] : Tensor::zeros(DType::f64, at.inputs[i].shape())));
      define_lets(p->lets, values);
      tout.accumulate(p->jvp->evaluate(values).value());
    };
  if (p->has_hvp())
    claim.hvp = [p, point, forward](const ClaimPoint& at, const Tensor& g, std::span<const Tensor> tin,
                                    std::span<Tensor> gin_dot) {
      Tape tape;
      std::map<std::string, Var> values = point(tape, at);
      values.emplace("g", tape.constant(g));
      for (size_t i = 0; i < p->inputs.size(); ++i)
        values.emplace(fmt::format("t_{}", p->inputs[i].name),
                       tape.constant(tin[i].defined() ? tin[i] : Tensor::zeros(DType::f64, at.inputs[i].shape())));
      define_lets(p->lets, values);
      std::vector<Tensor> own;  // the forward's own H·t, for inputs the claim says nothing about
      for (size_t i = 0; i < gin_dot.size(); ++i) {
        if (!gin_dot[i].defined()) continue;
        if (p->hvp[i]) {
          gin_dot[i].accumulate(p->hvp[i]->evaluate(values).value());
        } else {
          if (own.empty()) own = hvp(forward, at.inputs, g, tin);
          gin_dot[i].accumulate(own[i]);
        }
      }
    };
  const GradcheckCase c{text.name, p->inputs, claimed(std::move(claim))};
  GradcheckReport report = gradcheck(c, opt);
  if (opt.diagnose && !report.passed) {  // a slip inside the formulas: try editing them (checker/formulas/edits.hpp)
    std::vector<std::string> names;
    for (const auto& in : text.inputs) names.push_back(in.name);
    VjpFormulas formulas{text.lets, {}, {}, text.forward};
    for (const auto& in : text.inputs) {
      auto line =
          std::find_if(text.vjp.begin(), text.vjp.end(), [&](const ClaimText::Line& l) { return l.name == in.name; });
      formulas.vjp.push_back(line == text.vjp.end() ? std::nullopt : std::optional(*line));
    }
    const std::vector<Tensor> x = make_inputs(c.inputs, DType::f64, opt.seed);
    diagnose_by_edits(report, {c.build, x, names, opt},
                      [&](std::span<const Tensor>, const Tensor&) { return std::optional(formulas); });
  }
  if (edges) {
    const CaseInputs in = case_inputs(c, opt);
    probe_edges(report, c.build, in.values, in.names, in.options.seed, *edges);
  }
  if (p->has_hvp()) {
    const GradcheckReport second = gradcheck_second_order(c, opt, text.name);
    report.checks.insert(report.checks.end(), second.checks.begin(), second.checks.end());
    report.diagnoses.insert(report.diagnoses.end(), second.diagnoses.begin(), second.diagnoses.end());
    report.conclude();
  }
  return report;
}

}  // namespace tapegrad
