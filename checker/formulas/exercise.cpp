#include "checker/formulas/exercise.hpp"

#include <algorithm>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checker/formulas/expression_tree.hpp"

namespace tapegrad {

namespace {

// "vjp x = F" → ("vjp", "x", "F"); "jvp F" → ("jvp", "", "F"); none for anything else.
struct Rule {
  std::string kind, input, formula;
};
std::optional<Rule> read_rule(std::string_view line) {
  line = trim(line);
  const auto space = line.find_first_of(" \t");
  if (space == std::string_view::npos) return std::nullopt;
  const std::string_view key = line.substr(0, space), rest = trim(line.substr(space));
  if (key == "jvp") return Rule{"jvp", "", std::string(rest)};
  if (key != "vjp") return std::nullopt;
  const auto named = split_named_formula(rest);
  if (!named) return std::nullopt;
  return Rule{"vjp", named->first, named->second};
}

bool same_rule(const Rule& a, const Rule& b) { return a.kind == b.kind && a.input == b.input; }

// ---- where a rule departs from the answer ---------------------------------------------------------------------

using expression_detail::Kind;
using Node = ExpressionNode;

bool same_head(const Node& a, const Node& b) {
  return a.kind == b.kind && a.name == b.name && a.op == b.op && a.number == b.number &&
         a.axis_keyword == b.axis_keyword && a.args.size() == b.args.size();
}
bool same_tree(const Node& a, const Node& b) {
  if (!same_head(a, b)) return false;
  for (size_t i = 0; i < a.args.size(); ++i)
    if (!same_tree(*a.args[i], *b.args[i])) return false;
  return true;
}

// The learner's subexpression where their tree departs from the answer's, and the answer's at that place: below
// nodes alike whose arguments differ in one place only.
struct Departure {
  const Node *mine, *answer;
};
std::optional<Departure> depart(const Node& mine, const Node& answer) {
  if (same_head(mine, answer)) {
    const Node *m = nullptr, *a = nullptr;
    int differing = 0;
    for (size_t i = 0; i < mine.args.size(); ++i)
      if (!same_tree(*mine.args[i], *answer.args[i])) ++differing, m = mine.args[i].get(), a = answer.args[i].get();
    if (differing == 0) return std::nullopt;
    if (differing == 1) return depart(*m, *a);
  }
  return Departure{&mine, &answer};
}

bool has_arg(const Node& n, const Node& arg, std::initializer_list<char> ops) {
  if (n.kind != Kind::binary || std::find(ops.begin(), ops.end(), n.op) == ops.end()) return false;
  return same_tree(*n.args[0], arg) || (n.op != '/' && n.op != '-' && same_tree(*n.args[1], arg)) ||
         (n.op == '-' && same_tree(*n.args[1], arg));
}

// What changes from the learner's part to the answer's, in words that do not give the answer away.
std::string what_changes(const Node& mine, const Node& answer) {
  auto wraps = [](const Node& outer, const Node& inner, std::initializer_list<std::string_view> names) {
    return outer.kind == Kind::call && std::find(names.begin(), names.end(), outer.name) != names.end() &&
           !outer.args.empty() && same_tree(*outer.args[0], inner);
  };
  if (wraps(answer, mine, {"transpose"})) return "a transpose is missing there";
  if (wraps(mine, answer, {"transpose"})) return "a transpose there does not belong";
  if (wraps(answer, mine, {"sum", "mean"})) return "a sum over an axis is missing there";
  if (wraps(mine, answer, {"sum", "mean"})) return "a sum there does not belong";
  if (has_arg(answer, mine, {'*'})) return "a factor is missing there";
  if (answer.kind == Kind::binary && answer.op == '/' && same_tree(*answer.args[0], mine))
    return "a division is missing there";
  if (has_arg(answer, mine, {'+', '-'})) return "a term is missing there";
  if (has_arg(mine, answer, {'*'})) return "a factor there does not belong";
  if (mine.kind == Kind::binary && mine.op == '/' && same_tree(*mine.args[0], answer))
    return "a division there does not belong";
  if (has_arg(mine, answer, {'+', '-'})) return "a term there does not belong";
  if ((answer.kind == Kind::negate && same_tree(*answer.args[0], mine)) ||
      (mine.kind == Kind::negate && same_tree(*mine.args[0], answer)) ||
      (mine.kind == Kind::binary && answer.kind == Kind::binary && mine.op == '-' && answer.op == '-' &&
       same_tree(*mine.args[0], *answer.args[1]) && same_tree(*mine.args[1], *answer.args[0])))
    return "its sign is the other one";
  if (mine.kind == Kind::name && answer.kind == Kind::name) return "another value belongs there";
  if (mine.kind == Kind::number && answer.kind == Kind::number) return "another number belongs there";
  if (mine.kind == Kind::call && answer.kind == Kind::call && mine.name != answer.name)
    return "another function belongs there";
  if (mine.kind == Kind::call && answer.kind == Kind::call) return "an argument of it is not the one it needs";
  return "that part is not what the rule needs";
}

// A node's text in its formula: [begin, end), widened over parentheses the span leaves open (a binary node's end is
// its right operand's, inside that operand's own parentheses).
std::pair<size_t, size_t> span_of(const std::string& formula, const Node& n) {
  size_t begin = n.begin, end = n.end;
  auto open = [&] {
    const std::string_view t = std::string_view(formula).substr(begin, end - begin);
    return std::count(t.begin(), t.end(), '(') - std::count(t.begin(), t.end(), ')');
  };
  while (open() > 0 && end < formula.size()) ++end;
  while (open() < 0 && begin > 0) --begin;
  return {begin, end};
}

// The learner's rule made right at one place, where that is all it takes: the diagnosis saying where, or none.
std::optional<Diagnosis> against_the_answer(const Exercise& e, std::span<const std::string> rules, size_t which,
                                            const Rule& mine, const Rule& answer, const GradcheckOptions& opt) {
  const auto mine_tree = expression_detail::parse_tree(mine.formula, "yours");
  const auto answer_tree = expression_detail::parse_tree(answer.formula, "the answer");
  const std::optional<Departure> d = depart(*mine_tree, *answer_tree);
  if (!d) return std::nullopt;
  const auto [mb, me] = span_of(mine.formula, *d->mine);
  const auto [ab, ae] = span_of(answer.formula, *d->answer);
  const std::string part = mine.formula.substr(mb, me - mb);
  std::string mended = mine.formula;
  mended.replace(mb, me - mb, fmt::format("({})", std::string_view(answer.formula).substr(ab, ae - ab)));
  std::vector<std::string> tried(rules.begin(), rules.end());
  tried[which] = mine.kind == "jvp" ? fmt::format("jvp {}", mended) : fmt::format("vjp {} = {}", mine.input, mended);
  GradcheckOptions quiet = opt;
  quiet.diagnose = false;
  if (!check_claim(exercise_claim(e, tried), quiet).passed) return std::nullopt;
  return Diagnosis{Finding::against_the_answer, mine.input, mine.kind,
                   fmt::format("the slip is in `{}` (column {} of your {}): {}; the rule holds once that part is "
                               "right (`tapegrad exercise {} --solution` shows the answer)",
                               part, mb + 1, mine.kind == "jvp" ? "jvp" : "vjp " + mine.input,
                               what_changes(*d->mine, *d->answer), e.name)};
}

}  // namespace

std::vector<Exercise> parse_exercises(std::string_view text, std::string_view path) {
  const std::vector<FileLine> lines = joined_lines(text);
  std::vector<Exercise> out;
  for (const FileLine& l : lines) {
    const std::string where = fmt::format("{}:{}", path, l.number);
    const auto space = l.text.find_first_of(" \t");
    const std::string key = l.text.substr(0, space);
    const std::string rest(space == std::string::npos ? std::string_view{} : trim(l.text.substr(space)));
    if (key == "exercise") {
      out.emplace_back();
      out.back().name = rest, out.back().where = where;
      out.back().given.name = rest;
      std::replace(out.back().given.name.begin(), out.back().given.name.end(), '-', '_');
      out.back().given.where = where;
      continue;
    }
    if (out.empty()) fail("{}: expected 'exercise NAME' before '{}'", where, key);
    Exercise& e = out.back();
    if (key == "chapter") {
      e.chapter = rest;
    } else if (key == "task") {
      e.task = rest;
    } else if (key == "input") {
      e.given.inputs.push_back(parse_claim_input(where, rest));
    } else if (key == "let") {
      const auto named = split_named_formula(rest);
      if (!named) fail("{}: expected 'let NAME = FORMULA', got '{}'", where, l.text);
      e.given.lets.push_back({named->first, named->second, fmt::format("{} (let {})", where, named->first)});
    } else if (key == "forward") {
      e.given.forward = {"", rest, fmt::format("{} (forward)", where)};
    } else if (key == "answer") {
      if (!read_rule(rest)) fail("{}: expected 'answer vjp NAME = FORMULA' or 'answer jvp FORMULA'", where);
      e.answer.push_back(rest);
    } else if (key == "slip") {
      const auto colon = rest.find(':');
      if (colon == std::string::npos || !read_rule(rest.substr(colon + 1)))
        fail("{}: expected 'slip KIND: vjp NAME = FORMULA' or 'slip KIND: jvp FORMULA'", where);
      e.slips.push_back({std::string(trim(rest.substr(0, colon))), std::string(trim(rest.substr(colon + 1)))});
    } else {
      fail("{}: unknown line '{}' (exercise, chapter, task, input, let, forward, answer, slip)", where, key);
    }
  }
  for (const Exercise& e : out)
    if (e.chapter.empty() || e.given.forward.formula.empty() || e.answer.empty())
      fail("{}: exercise '{}' needs a chapter, a forward and an answer", e.where, e.name);
  return out;
}

ClaimText exercise_claim(const Exercise& e, std::span<const std::string> rules) {
  ClaimText c = e.given;
  for (const std::string& line : rules) {
    const std::optional<Rule> r = read_rule(line);
    if (!r) fail("exercise {}: expected a rule 'vjp NAME = FORMULA' or 'jvp FORMULA', got '{}'", e.name, line);
    if (r->kind == "jvp") {
      c.jvp = ClaimText::Line{"", r->formula, "your jvp"};
      continue;
    }
    std::vector<std::string> names;
    for (const InputSpec& in : c.inputs) names.push_back(in.name);
    if (std::find(names.begin(), names.end(), r->input) == names.end())
      fail("exercise {}: it has no input '{}' (its inputs: {})", e.name, r->input, fmt::join(names, ", "));
    c.vjp.push_back({r->input, r->formula, fmt::format("your vjp {}", r->input)});
  }
  return c;
}

GradcheckReport check_exercise(const Exercise& e, std::span<const std::string> rules, const GradcheckOptions& opt) {
  GradcheckReport report = check_claim(exercise_claim(e, rules), opt);
  if (report.passed || !opt.diagnose) return report;
  for (Diagnosis& d : report.diagnoses)  // a hint, not the answer: the rule as an edit puts it right is left out
    if (const size_t at = d.fix.empty() ? std::string::npos : d.message.find(d.fix); at != std::string::npos)
      d.message.erase(at, d.fix.size());
  for (size_t i = 0; i < rules.size(); ++i) {
    const Rule mine = *read_rule(rules[i]);
    // only a rule whose own check failed is held against the answer (a right one may be written otherwise)
    const bool failed = std::any_of(report.checks.begin(), report.checks.end(), [&](const CheckResult& c) {
      return !c.passed && c.check == mine.kind && (mine.kind == "jvp" || c.input == mine.input);
    });
    if (!failed) continue;
    for (const std::string& line : e.answer) {
      const Rule answer = *read_rule(line);
      if (!same_rule(mine, answer)) continue;
      const std::optional<Diagnosis> d = against_the_answer(e, rules, i, mine, answer, opt);
      if (!d) continue;
      std::erase_if(report.diagnoses, [&](const Diagnosis& x) {
        return x.kind == Finding::unexplained && (x.input.empty() || x.input == mine.input);
      });
      report.diagnoses.push_back(*d);
    }
  }
  report.conclude();
  return report;
}

}  // namespace tapegrad
