// The report: findings by name, the table, the verdict.
#include <algorithm>
#include <array>
#include <iterator>
#include <ostream>

#include <fmt/format.h>

#include "checker/gradcheck.hpp"

namespace tapegrad {

namespace {

// Each kind of finding, in the enum's order: the enumerator's name (for programs) and the name the report prints.
struct FindingNames {
  Finding kind;
  std::string_view key, title;
};
constexpr FindingNames kFindingNames[] = {
    {Finding::not_finite, "not_finite", "not finite"},
    {Finding::zero, "zero", "zero"},
    {Finding::nonlinear, "nonlinear", "nonlinear"},
    {Finding::sign, "sign", "sign"},
    {Finding::scale, "scale", "scale"},
    {Finding::transposed_jacobian, "transposed_jacobian", "transposed Jacobian"},
    {Finding::transposed_input, "transposed_input", "transposed input"},
    {Finding::transposed_output, "transposed_output", "transposed output"},
    {Finding::transposed_term, "transposed_term", "transposed term"},
    {Finding::term_sign, "term_sign", "sign of a term"},
    {Finding::wrong_axis, "wrong_axis", "wrong axis"},
    {Finding::masked_positions, "masked_positions", "masked positions"},
    {Finding::diagonal, "diagonal", "diagonal"},
    {Finding::one_row, "one_row", "one row"},
    {Finding::per_row_term, "per_row_term", "per-row term"},
    {Finding::unexplained, "unexplained", "no known kind"},
    {Finding::radial, "radial", "radial"},
    {Finding::kink, "kink", "kink"},
    {Finding::tolerance, "tolerance", "tolerance"},
    {Finding::one_input, "one_input", "one input"},
    {Finding::jvp_only, "jvp_only", "JVP only"},
    {Finding::vjp_only, "vjp_only", "VJP only"},
    {Finding::adjoint, "adjoint", "adjoint"},
    {Finding::consistent, "consistent", "consistent"},
    {Finding::overwrites, "overwrites", "overwrites"},
    {Finding::no_jvp, "no_jvp", "no JVP"},
    {Finding::term_dropped, "term_dropped", "dropped term"},
    {Finding::term_added, "term_added", "term counted twice"},
    {Finding::term_factor, "term_factor", "term with a wrong factor"},
    {Finding::wrong_value, "wrong_value", "term from the wrong value"},
    {Finding::ignores_cotangent, "ignores_cotangent", "ignores ȳ"},
    {Finding::per_row_factor, "per_row_factor", "per-row factor"},
    {Finding::elementwise, "elementwise", "element-wise"},
    {Finding::first_order, "first_order", "first order"},
    {Finding::hessian_block, "hessian_block", "Hessian block"},
    {Finding::asymmetric, "asymmetric", "asymmetric"},
    {Finding::saved_in_forward, "saved_in_forward", "saved in forward"},
    {Finding::precision_defect, "precision_defect", "precision defect"},
    {Finding::not_a_function, "not_a_function", "not a function"},
    {Finding::rounds_inside, "rounds_inside", "rounds inside"},
};
constexpr bool in_enum_order() {
  for (size_t i = 0; i < std::size(kFindingNames); ++i)
    if (static_cast<size_t>(kFindingNames[i].kind) != i) return false;
  return std::size(kFindingNames) == static_cast<size_t>(Finding::rounds_inside) + 1;
}
static_assert(in_enum_order(), "kFindingNames: one row per Finding, in the enum's order");

const FindingNames& names_of(Finding f) { return kFindingNames[static_cast<size_t>(f)]; }

}  // namespace

std::string_view finding_name(Finding f) { return names_of(f).title; }
std::string_view finding_key(Finding f) { return names_of(f).key; }

std::span<const Finding> all_findings() {
  static const auto kinds = [] {
    std::array<Finding, std::size(kFindingNames)> k{};
    for (size_t i = 0; i < k.size(); ++i) k[i] = kFindingNames[i].kind;
    return k;
  }();
  return kinds;
}

std::string Diagnosis::str() const {
  std::string where = input.empty() ? "" : check.empty() ? input + ": " : input + ", " + check + ": ";
  return fmt::format("[{}] {}{}", finding_name(kind), where, message);
}

std::ostream& operator<<(std::ostream& os, const Verdict& v) {
  return v.report.empty() ? os << (v.ok ? "passed" : "FAILED") : os << "\n" << v.report;
}

namespace {

// Why nothing was checked, when every check was skipped (or there are none); empty when something was compared.
std::string nothing_checked(const std::vector<CheckResult>& checks) {
  if (checks.empty()) return "no check was made";
  for (const auto& c : checks)
    if (!c.skipped) return "";
  const std::string& why = checks.front().worst;
  return "every check was skipped (" + (why.empty() ? std::string("no JVP") : why) + ")";
}

// The verdict of a report's checks: ok, or why nothing was checked (empty when something was).
struct Outcome {
  bool ok;
  std::string not_checked;
};
Outcome outcome_of(const std::vector<CheckResult>& checks) {
  std::string why_not = nothing_checked(checks);
  const bool ok = why_not.empty() &&
                  std::all_of(checks.begin(), checks.end(), [](const CheckResult& c) { return c.skipped || c.passed; });
  return {ok, std::move(why_not)};
}

}  // namespace

void GradcheckReport::conclude() {
  Outcome o = outcome_of(checks);
  passed.ok = o.ok;
  passed.not_checked = std::move(o.not_checked);
  passed.report = str();
}

const Diagnosis* find_diagnosis(std::span<const Diagnosis> diagnoses, Finding f, std::string_view input) {
  for (const auto& d : diagnoses)
    if (d.kind == f && (input.empty() || d.input == input)) return &d;
  return nullptr;
}

const Diagnosis* GradcheckReport::find(Finding f, std::string_view input) const {
  return find_diagnosis(diagnoses, f, input);
}

bool GradcheckReport::has(Finding f, std::string_view input) const { return find(f, input) != nullptr; }

std::string GradcheckReport::str() const {
  const auto [ok, why_not] = outcome_of(checks);
  std::string s = fmt::format("{}: {}\n", report_title(op, case_name),
                              ok ? "passed" : why_not.empty() ? "FAILED" : "NOT CHECKED: " + why_not);
  s += fmt::format("  {:<8} {:<10} {:<5} {:>11} {:>11}  {:<24} {}\n", "input", "check", "mode", "max_abs_err",
                   "max_rel_err", "worst element", "result");
  for (const auto& c : checks) {
    if (c.skipped) {  // first order: no JVP; second order: the reason, in `worst`
      s += fmt::format("  {:<8} {:<10} {:<5} {:>11} {:>11}  {:<24} {}\n", c.input, c.check, c.mode, "", "", "",
                       c.worst.empty() ? std::string("skipped (no JVP)") : "skipped: " + c.worst);
      continue;
    }
    s += fmt::format("  {:<8} {:<10} {:<5} {:>11.2e} {:>11.2e}  {:<24} {}", c.input, c.check, c.mode,
                     c.max_abs_err, c.max_rel_err, c.worst, c.passed ? "ok" : "FAIL");
    if (!c.passed && c.compared > 0)
      s += fmt::format("  ({} {:.6g}, {} {:.6g})", c.analytic_is, c.analytic, c.numeric_is, c.numeric);
    s += "\n";
  }
  if (!diagnoses.empty()) {
    s += "  diagnosis:\n";
    for (const auto& d : diagnoses) s += fmt::format("    {}\n", d.str());
  }
  return s;
}

std::ostream& operator<<(std::ostream& os, const GradcheckReport& r) { return os << r.str(); }

}  // namespace tapegrad
