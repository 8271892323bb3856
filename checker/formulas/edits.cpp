#include "checker/formulas/edits.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include <fmt/format.h>

#include "engine/rng.hpp"
#include "checker/formulas/derivative_edits.hpp"
#include "checker/formulas/expression.hpp"

namespace tapegrad {

namespace {

// The formulas parsed: the lets (name, formula) and x̄ per input.
struct Rule {
  std::vector<std::pair<std::string, Formula>> lets;
  std::vector<std::optional<Formula>> vjp;
  std::optional<Formula> forward;  // read for its element-wise calls, never edited
};

Rule parse_rule(const VjpFormulas& text) {
  Rule r;
  for (const auto& l : text.lets) r.lets.emplace_back(l.name, Formula::parse(l.formula, l.label));
  for (const auto& v : text.vjp)
    r.vjp.push_back(v ? std::optional(Formula::parse(v->formula, v->label)) : std::nullopt);
  if (text.forward) r.forward = Formula::parse(text.forward->formula, text.forward->label);
  return r;
}

// The point's values, as constants on `tape`: the inputs by name, y, g and the named constants.
std::map<std::string, Var> point_values(Tape& tape, std::span<const Tensor> x, std::span<const std::string> names,
                                        const Tensor& y, const Tensor& g, const VjpFormulas& text) {
  std::map<std::string, Var> values;
  for (size_t i = 0; i < x.size(); ++i) values.emplace(names[i], tape.constant(x[i]));
  values.emplace("y", tape.constant(y));
  values.emplace("g", tape.constant(g));
  for (const auto& [name, c] : text.constants) values.emplace(name, tape.constant(c));
  return values;
}

// Adds each let whose names are all defined (a let of a claim may read a tangent, which a VJP does not have).
void define_lets(const Rule& rule, std::map<std::string, Var>& values) {
  for (const auto& [name, f] : rule.lets) {
    const auto read = f.names();
    if (std::all_of(read.begin(), read.end(), [&](const std::string& n) { return values.count(n) > 0; }))
      values.insert_or_assign(name, f.evaluate(values));
  }
}

// The shape without its leading axes of size 1: a formula's sum over axis 0 keeps that axis, where torch's
// x.sum(0) drops it; either is x̄ of a bias of shape (n).
Shape without_leading_ones(const Shape& s) {
  int first = 0;
  while (first < s.rank() - 1 && s[first] == 1) ++first;
  std::vector<int64_t> dims;
  for (int d = first; d < s.rank(); ++d) dims.push_back(s[d]);
  return Shape(std::span<const int64_t>(dims));
}

// The values a rule reads, as constants on a tape.
using PointValues = std::function<std::map<std::string, Var>(Tape&)>;

// x̄ per input from the rule's formulas (undefined where it has none), on `tape`, cleared first, so that no
// evaluation keeps its intermediates past the next (one tape for the search: its memory is reused, not mapped again
// for every edit); nothing when an op refuses the shapes or an x̄ has the wrong shape (an edit can do both).
std::optional<std::vector<Tensor>> evaluate_rule(const Rule& rule, const PointValues& point, std::span<const Tensor> x,
                                                 Tape& tape) {
  try {
    tape.clear();
    NoGradGuard no_grad(tape);
    std::map<std::string, Var> values = point(tape);
    define_lets(rule, values);
    std::vector<Tensor> out(rule.vjp.size());
    for (size_t i = 0; i < rule.vjp.size(); ++i) {
      if (!rule.vjp[i]) continue;
      Tensor v = rule.vjp[i]->evaluate(values).value();
      if (!(without_leading_ones(v.shape()) == without_leading_ones(x[i].shape()))) return std::nullopt;
      out[i] = v.to(DType::f64).view(x[i].shape());
    }
    return out;
  } catch (const Error&) {
    return std::nullopt;
  }
}

// ⟨ȳ, y⟩ for y's elements in order.
double inner_product(const Tensor& g, const double* y) {
  double s = 0;
  for (int64_t k = 0; k < g.numel(); ++k) s += g.data<double>()[k] * y[k];
  return s;
}
// ⟨ȳ, f(x)⟩, for the central differences below.
double inner_product(const Function& f, std::span<const Tensor> x, const Tensor& g) {
  return inner_product(g, evaluate(f, x).to(DType::f64).data<double>());
}

// x̄_i = Σ_j ȳ_j ∂y_j/∂x_i by central differences of ⟨ȳ, f(x)⟩, element by element of x_i: 2·n_i evaluations, in one
// block where blocks are given (at the checker's points x_i + (±ε)·e_k, which it may have evaluated already).
Tensor differences(const Function& f, std::span<const Tensor> x, size_t i, const Tensor& g, double eps,
                   RuleBlocks* blocks) {
  Tensor out = Tensor::zeros(DType::f64, x[i].shape());
  if (blocks) {
    const int64_t n = x[i].numel(), m = g.numel();
    std::vector<double> plus(static_cast<size_t>(n * m)), minus(plus.size());
    blocks->unit_steps(x, i, eps, g.shape(), plus, minus);
    for (int64_t k = 0; k < n; ++k)
      out.data<double>()[k] =
          (inner_product(g, &plus[static_cast<size_t>(k * m)]) - inner_product(g, &minus[static_cast<size_t>(k * m)])) /
          (2 * eps);
    return out;
  }
  std::vector<Tensor> at(x.begin(), x.end());
  at[i] = x[i].clone();
  double* p = at[i].data<double>();
  for (int64_t k = 0; k < x[i].numel(); ++k) {
    const double keep = p[k];
    p[k] = keep + eps;
    const double up = inner_product(f, at, g);
    p[k] = keep - eps;
    const double down = inner_product(f, at, g);
    p[k] = keep;
    out.data<double>()[k] = (up - down) / (2 * eps);
  }
  return out;
}

// ⟨x̄_i, t⟩ = ∂/∂s ⟨ȳ, f(x + s·t)⟩ by central differences along t (in slot i): 2 evaluations.
double projected_difference(const Function& f, std::span<const Tensor> x, size_t i, const Tensor& t, const Tensor& g,
                            double eps) {
  std::vector<Tensor> at(x.begin(), x.end());
  auto moved = [&](double s) {
    Tensor m = x[i].clone();
    for (int64_t k = 0; k < m.numel(); ++k) m.data<double>()[k] += s * t.data<double>()[k];
    at[i] = m;
    return inner_product(f, at, g);
  };
  return (moved(eps) - moved(-eps)) / (2 * eps);
}

// The largest |a − n| over the elements, and whether every one is within atol + rtol·|n|.
struct Agreement {
  bool ok = true;
  double worst = 0;
};
Agreement agreement(const Tensor& a, const Tensor& n, double atol, double rtol) {
  Agreement r;
  for (int64_t k = 0; k < a.numel(); ++k) {
    const double av = a.data<double>()[k], nv = n.data<double>()[k], e = std::abs(av - nv);
    if (!(e <= atol + rtol * std::abs(nv))) r.ok = false;
    r.worst = std::max(r.worst, std::isfinite(e) ? e : INFINITY);
  }
  return r;
}

struct Edit {
  size_t line;          // index into lets, then vjp (lets.size() + i)
  Finding kind;         // transposed_term, term_sign, wrong_axis, term_factor
  std::string edited;   // the formula after the edit
  std::string what;     // "`Omega` (5, 5) is transposed where ... reads it", "the sign of `b` is flipped at ..."
  size_t replaced = 0;  // the length of the part of the formula it edits
};

// A central difference of ⟨ȳ, f⟩ along a random direction t of one input: what an edited x̄ must give along t.
struct Probe {
  Tensor t;
  double difference;
};

// The search of diagnose_by_edits over one report: what the rule is held to (set up once), then every edit of every
// line tried in turn, then the one named.
class EditSearch {
 public:
  EditSearch(GradcheckReport& report, const CheckedPoint& at)
      : report_(report), at_(at), rng_(at.opt.seed ^ 0x65646974ULL) {}  // "edit": apart from the checks' draws

  void run(const VjpFormulasAt& formulas) {
    if (!set_up(formulas)) return;
    read_shapes();
    find_calls();
    for (size_t line = 0; line < rule_.lets.size() + rule_.vjp.size(); ++line)
      if (const Formula* formula = formula_at(line)) try_edits_of(line, *formula);
    if (!found_.empty()) name_the_edit();
  }

 private:
  // The input's "no known kind" (or unnamed per-row term) of its VJP, which a named edit takes the place of.
  std::vector<Diagnosis>::iterator unexplained_vjp(size_t i) {
    return std::find_if(report_.diagnoses.begin(), report_.diagnoses.end(), [&](const Diagnosis& d) {
      return (d.kind == Finding::unexplained || (d.kind == Finding::per_row_term && d.unnamed)) &&
             d.input == at_.names[i] && d.check == "vjp";
    });
  }
  bool is_failing(size_t i) const { return std::find(failing_.begin(), failing_.end(), i) != failing_.end(); }

  // The inputs to put right, the rule parsed and evaluated unedited, and what an edited rule must give: false where
  // no search is made (see diagnose_by_edits in edits.hpp for when).
  bool set_up(const VjpFormulasAt& formulas) {
    for (size_t i = 0; i < at_.x.size(); ++i)
      if (unexplained_vjp(i) != report_.diagnoses.end()) failing_.push_back(i);
    int64_t elements = 0;
    for (const Tensor& xi : at_.x) elements += xi.numel();
    if (failing_.empty() || elements > kEditSearchElements) return false;

    y_ = evaluate(at_.f, at_.x).to(DType::f64);
    g_ = Tensor::randn(DType::f64, y_.shape(), rng_);
    text_ = formulas(at_.x, g_);
    if (!text_ || text_->vjp.size() != at_.x.size()) return false;
    try {
      rule_ = parse_rule(*text_);
    } catch (const Error&) {  // formulas that do not parse (a trace that wrote something the language lacks)
      return false;
    }
    for (size_t i : failing_)
      if (!rule_.vjp[i]) return false;  // a failing x̄ the formulas do not write: no edit of them can put it right

    values_ = [this](Tape& tape) { return point_values(tape, at_.x, at_.names, y_, g_, *text_); };
    const auto unedited = evaluate_rule(rule_, values_, at_.x, scratch_);
    if (!unedited) return false;
    unedited_ = *unedited;
    const std::vector<Tensor> own = vjp(at_.f, at_.x, g_);  // the rule that was checked
    for (size_t i = 0; i < at_.x.size(); ++i)
      if (rule_.vjp[i] && own[i].defined() && !agreement(unedited_[i], own[i].to(DType::f64), 1e-9, 1e-7).ok)
        return false;
    // What an edited rule must give. An input whose VJP passed keeps its own x̄ (the edit must not spoil it). A
    // failing input must match central differences: first along kProjections random directions (2 evaluations of
    // f each), which sort out almost every edit, then, for an edit that passes those, element by element (2·n_i
    // evaluations, made once).
    constexpr int kProjections = 4;
    probes_.resize(at_.x.size());
    for (size_t i : failing_)
      for (int j = 0; j < kProjections; ++j) {
        Tensor t = Tensor::randn(DType::f64, at_.x[i].shape(), rng_);
        probes_[i].push_back({t, projected_difference(at_.f, at_.x, i, t, g_, at_.opt.eps)});
      }
    numeric_.resize(at_.x.size());
    return !along_probes(unedited_);  // agreeing for this ȳ, the rule fails elsewhere
  }

  // |⟨a, t⟩ − d| ≤ atol·‖t‖₁ + rtol·Σ|a_k t_k| along every probe of every failing input.
  bool along_probes(const std::vector<Tensor>& a) const {
    for (size_t i : failing_)
      for (const Probe& p : probes_[i]) {
        double dot = 0, t1 = 0, scale = 0;
        for (int64_t k = 0; k < a[i].numel(); ++k) {
          const double ak = a[i].data<double>()[k], tk = p.t.data<double>()[k];
          dot += ak * tk, t1 += std::abs(tk), scale += std::abs(ak * tk);
        }
        if (!(std::abs(dot - p.difference) <= at_.opt.atol * t1 + at_.opt.rtol * scale)) return false;
      }
    return true;
  }
  // An edited rule's x̄: the passing inputs' unchanged, the failing ones' along the probes, then element by element.
  bool agrees(const std::vector<Tensor>& a) {
    for (size_t i = 0; i < at_.x.size(); ++i)
      if (rule_.vjp[i] && !is_failing(i) && !agreement(a[i], unedited_[i], 1e-9, 1e-7).ok) return false;
    if (!along_probes(a)) return false;
    for (size_t i : failing_) {
      if (!numeric_[i].defined()) numeric_[i] = differences(at_.f, at_.x, i, g_, at_.opt.eps, at_.blocks);
      if (!agreement(a[i], numeric_[i], at_.opt.atol, at_.opt.rtol).ok) return false;
    }
    return true;
  }

  // The shapes of the values the formulas read, the lets' included, to read the shape of a part.
  void read_shapes() {
    Tape tape;
    NoGradGuard no_grad(tape);
    std::map<std::string, Var> with_lets = values_(tape);
    define_lets(rule_, with_lets);
    for (const auto& [name, v] : with_lets) shapes_.emplace(name, v.shape());
  }
  std::optional<Shape> shape_of(const std::string& part) const {
    try {
      return Formula::parse(part).check(shapes_);
    } catch (const Error&) {
      return std::nullopt;
    }
  }
  // ", made at LABEL," for a part that is the name of a let defined before line `before`.
  std::string made_at(const std::string& part, size_t before) const {
    for (size_t l = std::min(before, rule_.lets.size()); l-- > 0;)
      if (rule_.lets[l].first == part)
        return text_->lets[l].label.empty() ? "" : fmt::format(", made at {},", text_->lets[l].label);
    return "";
  }
  const Formula* formula_at(size_t line) const {
    if (line < rule_.lets.size()) return &rule_.lets[line].second;
    const auto& v = rule_.vjp[line - rule_.lets.size()];
    return v ? &*v : nullptr;
  }
  const ClaimText::Line& text_at(size_t line) const {
    return line < rule_.lets.size() ? text_->lets[line] : *text_->vjp[line - rule_.lets.size()];
  }
  // Where a line was written: its label, else what it defines.
  std::string where_written(size_t line) const {
    const ClaimText::Line& l = text_at(line);
    if (!l.label.empty()) return l.label;
    return line < rule_.lets.size() ? fmt::format("let {}", l.name)
                                    : fmt::format("x̄ of {}", at_.names[line - rule_.lets.size()]);
  }

  // Every edit of one line's formula, each kept (with the x̄ it gives) where it puts the rule right.
  void try_edits_of(size_t line, const Formula& formula) {
    const std::vector<Formula::Part> parts = formula.parts();
    auto is_transposed_argument = [&](const Formula::Part& p) {  // e in transpose(e): the removal covers it
      return std::any_of(parts.begin(), parts.end(), [&](const Formula::Part& call) {
        return call.argument && call.argument->first == p.begin && call.argument->second == p.end;
      });
    };
    for (const Formula::Part& part : parts) {
      if (is_transposed_argument(part)) continue;
      std::vector<Edit> candidates;
      transpose_edit(line, formula.text(), part, candidates);
      sign_edit(line, formula.text(), part, candidates);
      axis_edits(line, formula.text(), part, candidates);
      softmax_axis_edits(line, formula.text(), part, candidates);
      if (backward_[line]) derivative_edits(line, formula.text(), part, candidates);
      for (Edit& edit : candidates) {
        edit.replaced = part.end - part.begin;
        Rule edited = rule_;
        try {
          if (line < rule_.lets.size()) edited.lets[line].second = Formula::parse(edit.edited, formula.label());
          else edited.vjp[line - rule_.lets.size()] = Formula::parse(edit.edited, formula.label());
        } catch (const Error&) {
          continue;
        }
        const auto result = evaluate_rule(edited, values_, at_.x, scratch_);
        if (!result || !agrees(*result)) continue;
        found_.push_back(std::move(edit));
        fixed_.push_back(*result);
      }
    }
  }
  // transpose(e) → e (putting another transpose around it would do the same), or e → transpose(e) for a square e.
  void transpose_edit(size_t line, const std::string& t, const Formula::Part& part, std::vector<Edit>& out) const {
    const std::string inside = t.substr(part.begin, part.end - part.begin);
    if (part.argument) {
      const auto [b, e] = *part.argument;
      out.push_back({line, Finding::transposed_term, t.substr(0, part.begin) + t.substr(b, e - b) + t.substr(part.end),
                     fmt::format("the transpose is taken from `{}` where {} reads it", inside, where_written(line))});
    } else if (const auto shape = shape_of(inside); shape && shape->rank() >= 2 &&
                                                    (*shape)[shape->rank() - 1] == (*shape)[shape->rank() - 2] &&
                                                    shape->back() >= 2) {
      out.push_back({line, Finding::transposed_term,
                     t.substr(0, part.begin) + "transpose(" + inside + ")" + t.substr(part.end),
                     fmt::format("`{}` {}{} is transposed where {} reads it", inside, *shape, made_at(inside, line),
                                 where_written(line))});
    }
  }
  // −u → u, or a + b ↔ a − b.
  void sign_edit(size_t line, const std::string& t, const Formula::Part& part, std::vector<Edit>& out) const {
    if (!part.sign) return;
    const size_t at = *part.sign;
    const std::string inside = t.substr(part.begin, part.end - part.begin);
    const std::string term = t.substr(part.term.first, part.term.second - part.term.first);
    if (at == part.begin)
      out.push_back({line, Finding::term_sign, t.substr(0, at) + t.substr(at + 1),
                     fmt::format("the minus is taken from `{}` at {}", inside, where_written(line))});
    else
      out.push_back({line, Finding::term_sign, t.substr(0, at) + (t[at] == '+' ? '-' : '+') + t.substr(at + 1),
                     fmt::format("the sign of `{}` is flipped at {}", term, where_written(line))});
  }
  // sum(e, a), mean(e, a), unsqueeze(e, a): a → any other axis. Moved to an axis of another size, a reduction's
  // result changes shape; the edit is kept only where the edited rule still broadcasts to x̄'s shape (the row term
  // of softmax(xᵀ), (6, 4), summed along its axis -2 where -1 belongs).
  void axis_edits(size_t line, const std::string& t, const Formula::Part& part, std::vector<Edit>& out) const {
    if (!part.axis) return;
    const auto [ab, ae] = *part.axis;
    auto of = shape_of(t.substr(part.term.first, part.term.second - part.term.first));
    const bool inserts = t.compare(part.begin, 9, "unsqueeze") == 0;  // its axis is one of the result's
    int written = 0;
    try {
      written = std::stoi(t.substr(ab, ae - ab));
    } catch (const std::exception&) {
      of.reset();
    }
    if (!of || of->rank() == 0) return;
    const std::string inside = t.substr(part.begin, part.end - part.begin);
    const int rank = static_cast<int>(of->rank()) + (inserts ? 1 : 0);
    const int at = written < 0 ? written : written - rank;  // axes counted from the end, as the trace writes
    for (int other = -rank; other < 0; ++other) {
      if (other == at || at < -rank) continue;
      const char* how = inserts ? "broadcasts along" : "reduces over";
      // squeeze(sum(e, a), a), torch's sum that drops its axis: the squeeze follows the sum's axis.
      const std::string dropped = ", " + t.substr(ab, ae - ab) + ")";
      const bool squeezed = !inserts && part.begin >= 8 && t.compare(part.begin - 8, 8, "squeeze(") == 0 &&
                            t.compare(part.end, dropped.size(), dropped) == 0;
      std::string edited = t.substr(0, ab) + std::to_string(other) + t.substr(ae, part.end - ae);
      edited +=
          squeezed ? ", " + std::to_string(other) + ")" + t.substr(part.end + dropped.size()) : t.substr(part.end);
      out.push_back({line, Finding::wrong_axis, edited,
                     fmt::format("`{}` at {} {} axis {}, not {}", inside, where_written(line), how, other, at)});
    }
  }

  // softmax(e) (or log_softmax) along axis a → along any other axis of e: f(e) along the last, else
  // transpose(f(transpose(e, b, -1)), b, -1), as the trace writes a softmax along axis b.
  void softmax_axis_edits(size_t line, const std::string& t, const Formula::Part& part, std::vector<Edit>& out) const {
    if (!part.softmax) return;
    const auto& s = *part.softmax;
    const std::string e = t.substr(s.begin, s.end - s.begin), f = s.log ? "log_softmax" : "softmax";
    const auto shape = shape_of(e);
    if (!shape || shape->rank() < 2) return;
    const int rank = static_cast<int>(shape->rank()), written = s.along >= 0 ? s.along - rank : s.along;
    for (int other = -rank; other < 0; ++other) {
      if (other == written || written < -rank) continue;
      const std::string along = other == -1
                                    ? fmt::format("{}({})", f, e)
                                    : fmt::format("transpose({}(transpose({}, {}, -1)), {}, -1)", f, e, other, other);
      out.push_back({line, Finding::wrong_axis, t.substr(0, part.begin) + along + t.substr(part.end),
                     fmt::format("`{}` at {} takes its {} along axis {}, not {}",
                                 t.substr(part.begin, part.end - part.begin), where_written(line), f, other, written)});
    }
  }

  // The element-wise calls the formulas make, and which lines are the backward's: the x̄ formulas, and each let
  // that reads g or a let that does (a let of the forward is no place for a derivative).
  void find_calls() {
    std::vector<const Formula*> formulas;
    for (const auto& v : rule_.vjp)
      if (v) formulas.push_back(&*v);
    if (rule_.forward) formulas.push_back(&*rule_.forward);
    calls_ = edits_detail::elementwise_calls(rule_.lets, formulas);
    for (const edits_detail::ElementwiseCall& c : calls_) call_shapes_.push_back(shape_of(c.value));
    std::vector<std::string> reading_g{"g"};
    backward_.assign(rule_.lets.size() + rule_.vjp.size(), true);
    for (size_t l = 0; l < rule_.lets.size(); ++l) {
      const std::vector<std::string> read = rule_.lets[l].second.names();
      backward_[l] = std::any_of(read.begin(), read.end(), [&](const std::string& n) {
        return std::find(reading_g.begin(), reading_g.end(), n) != reading_g.end();
      });
      if (backward_[l]) reading_g.push_back(rule_.lets[l].first);
    }
  }
  // The value of an element-wise call → its derivative (f′ written f); a part of the call's shape → that part times
  // the derivative (f′ left out).
  void derivative_edits(size_t line, const std::string& t, const Formula::Part& part, std::vector<Edit>& out) const {
    if (calls_.empty()) return;
    const std::string inside = t.substr(part.begin, part.end - part.begin);
    const std::optional<Shape> shape = shape_of(inside);
    for (size_t k = 0; k < calls_.size(); ++k) {
      const edits_detail::ElementwiseCall& c = calls_[k];
      const std::string derivative = edits_detail::derivative_formula(c);
      const std::string named =
          c.value == c.call ? fmt::format("`{}`", c.call) : fmt::format("`{}` (let {})", c.call, c.value);
      if (inside == c.value) {
        out.push_back({line, Finding::term_factor,
                       t.substr(0, part.begin) + "(" + derivative + ")" + t.substr(part.end),
                       fmt::format("the derivative of {} is written `{}` at {} where {} belongs", named, inside,
                                   where_written(line), edits_detail::derivative_words(c))});
      } else if (shape && shape == call_shapes_[k]) {
        out.push_back({line, Finding::term_factor,
                       t.substr(0, part.begin) + "(" + inside + ") * (" + derivative + ")" + t.substr(part.end),
                       fmt::format("`{}` at {} is multiplied by the derivative of {}, {}, which it leaves out", inside,
                                   where_written(line), named, edits_detail::derivative_words(c))});
      }
    }
  }

  // An axis first, when one puts the rule right (a sum over the wrong axis of a square value is also that value
  // transposed, but one written number is the smaller edit), then a derivative, then a transpose; the other edits
  // of the same kind are counted. The named edit takes the place of each failing input's unexplained diagnosis.
  void name_the_edit() {
    auto any_of_kind = [&](Finding k) {
      return std::any_of(found_.begin(), found_.end(), [&](const Edit& e) { return e.kind == k; });
    };
    const Finding kind = any_of_kind(Finding::wrong_axis)        ? Finding::wrong_axis
                         : any_of_kind(Finding::term_factor)     ? Finding::term_factor
                         : any_of_kind(Finding::transposed_term) ? Finding::transposed_term
                                                                 : Finding::term_sign;
    // Of that kind, the edit of the smallest part, the first of those: `Omega` transposed where a line reads it
    // says more than the whole formula of the let Omega transposed, which puts the rule right as well.
    size_t chosen = found_.size();
    for (size_t e = 0; e < found_.size(); ++e)
      if (found_[e].kind == kind && (chosen == found_.size() || found_[e].replaced < found_[chosen].replaced))
        chosen = e;
    const Edit& first = found_[chosen];
    const auto same = std::count_if(found_.begin(), found_.end(), [&](const Edit& e) { return e.kind == kind; });
    const std::string others = same == 2  ? " (1 other edit of this kind does too)"
                               : same > 2 ? fmt::format(" ({} other edits of this kind do too)", same - 1)
                                          : std::string();
    const char* meaning =
        kind == Finding::wrong_axis ? "a reduction or broadcast of the rule is taken along the wrong axis"
        : kind == Finding::term_factor
            ? "a term of the chain rule carries a wrong factor: an element-wise function's derivative written as "
              "another function of it, or left out"
        : kind == Finding::transposed_term ? "a square value of the rule is used where its transpose belongs"
                                           : "a term of the rule has the wrong sign";
    for (size_t i : failing_) {
      const double before = agreement(unedited_[i], numeric_[i], at_.opt.atol, at_.opt.rtol).worst;
      const double after = agreement(fixed_[chosen][i], numeric_[i], at_.opt.atol, at_.opt.rtol).worst;
      const std::string fix = fmt::format(": {} → {}", text_at(first.line).formula, first.edited);
      Diagnosis d{kind, at_.names[i], "vjp",
                  fmt::format("x̄ agrees with the finite differences (max error {:.3g}, was {:.3g}) once {}{}{}; {}",
                              after, before, first.what, fix, others, meaning)};
      d.fix = fix;
      *unexplained_vjp(i) = std::move(d);  // failing_ holds only inputs with that diagnosis, and none is removed
    }
  }

  GradcheckReport& report_;
  const CheckedPoint& at_;
  Rng rng_;
  std::vector<size_t> failing_;  // the inputs whose VJP the search is to put right
  Tensor y_, g_;                 // f(x) and the cotangent ȳ drawn for the search
  std::optional<VjpFormulas> text_;
  Rule rule_;
  PointValues values_;
  Tape scratch_;                  // every evaluation of the rule, one after the other
  std::vector<Tensor> unedited_;  // x̄ of the rule as written
  std::vector<std::vector<Probe>> probes_;
  std::vector<Tensor> numeric_;  // central differences of x̄, element by element, made when first needed
  std::map<std::string, Shape> shapes_;
  std::vector<edits_detail::ElementwiseCall> calls_;  // the element-wise calls whose derivative an edit writes,
  std::vector<std::optional<Shape>> call_shapes_;     // and the shapes of their values
  std::vector<bool> backward_;                        // per line (lets, then x̄): a line of the backward
  std::vector<Edit> found_;                           // every edit that puts the rule right,
  std::vector<std::vector<Tensor>> fixed_;            // and the x̄ it then gives
};

}  // namespace

// The inputs whose failing VJP no kind of the Jacobian explains, or explains only by where the error lies (a per-row
// term α_r·u_r·v_rᵀ whose vectors are none the checker knows: Diagnosis::unnamed). Not the others: an edit that puts
// a rule right is not always the slip (taking a mask's transpose can zero a wrong term), so a structure the Jacobian
// shows (a mean's 1·1ᵀ, a normalizer's y_r·y_rᵀ) is the better name, and it spares the search. An unnamed per-row
// term is no such structure: a sign flipped on layer norm's x̂·mean(x̂ ⊙ ĝ) is one along x̂ and w ⊙ x̂, and whether
// the fit holds to the tolerance depends on the shape and the draw (that slip, with σ written without layer norm's
// ε, fit it at (4, 6) and not at (3, 5)), so without the search the same slip was a sign of a term at one shape and
// a per-row term at another. Where no edit puts the rule right, it stays.
void diagnose_by_edits(GradcheckReport& report, const CheckedPoint& at, const VjpFormulasAt& formulas) {
  EditSearch(report, at).run(formulas);
}

}  // namespace tapegrad
