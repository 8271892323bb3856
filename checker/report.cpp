// The report: the table, the verdict.
#include <algorithm>
#include <ostream>

#include <fmt/format.h>

#include "checker/gradcheck.hpp"

namespace tapegrad {

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

std::string GradcheckReport::str(Order order) const {
  const auto [ok, why_not] = outcome_of(checks);
  std::string title = fmt::format("{}: {}\n", report_title(op, case_name),
                                  ok                ? "passed"
                                  : why_not.empty() ? "FAILED"
                                                    : "NOT CHECKED: " + why_not);
  for (const auto& note : notes) title += fmt::format("  {}\n", note);
  std::string diagnosis;
  if (!diagnoses.empty()) {
    diagnosis = "  diagnosis:\n";
    for (const auto& d : diagnoses) diagnosis += fmt::format("    {}\n", d.str());
  }
  std::string table = fmt::format("  {:<8} {:<10} {:<5} {:>11} {:>11}  {:<24} {}\n", "input", "check", "mode",
                                  "max_abs_err", "max_rel_err", "worst element", "result");
  for (const auto& c : checks) {
    if (c.skipped) {  // first order: no JVP; second order: the reason, in `worst`
      table += fmt::format("  {:<8} {:<10} {:<5} {:>11} {:>11}  {:<24} {}\n", c.input, c.check, c.mode, "", "", "",
                           c.worst.empty() ? std::string("skipped (no JVP)") : "skipped: " + c.worst);
      continue;
    }
    table += fmt::format("  {:<8} {:<10} {:<5} {:>11.2e} {:>11.2e}  {:<24} {}", c.input, c.check, c.mode, c.max_abs_err,
                         c.max_rel_err, c.worst, c.passed ? "ok" : "FAIL");
    if (!c.passed && c.compared > 0)
      table += fmt::format("  ({} {:.6g}, {} {:.6g})", c.analytic_is, c.analytic, c.numeric_is, c.numeric);
    table += "\n";
  }
  return order == Order::diagnosis_first ? title + diagnosis + table : title + table + diagnosis;
}

std::ostream& operator<<(std::ostream& os, const GradcheckReport& r) { return os << r.str(); }

}  // namespace tapegrad
