// The report: findings by name, the table, the verdict.
#include <algorithm>
#include <ostream>

#include <fmt/format.h>

#include "engine/gradcheck/gradcheck.hpp"

namespace tapegrad {

std::string_view finding_name(Finding f) {
  switch (f) {
    case Finding::not_finite: return "not finite";
    case Finding::zero: return "zero";
    case Finding::nonlinear: return "nonlinear";
    case Finding::sign: return "sign";
    case Finding::scale: return "scale";
    case Finding::transposed_jacobian: return "transposed Jacobian";
    case Finding::transposed_input: return "transposed input";
    case Finding::transposed_output: return "transposed output";
    case Finding::masked_positions: return "masked positions";
    case Finding::diagonal: return "diagonal";
    case Finding::one_row: return "one row";
    case Finding::per_row_term: return "per-row term";
    case Finding::unexplained: return "no known kind";
    case Finding::radial: return "radial";
    case Finding::kink: return "kink";
    case Finding::tolerance: return "tolerance";
    case Finding::one_input: return "one input";
    case Finding::jvp_only: return "JVP only";
    case Finding::vjp_only: return "VJP only";
    case Finding::adjoint: return "adjoint";
    case Finding::consistent: return "consistent";
    case Finding::overwrites: return "overwrites";
    case Finding::no_jvp: return "no JVP";
    case Finding::first_order: return "first order";
    case Finding::hessian_block: return "Hessian block";
    case Finding::asymmetric: return "asymmetric";
  }
  return "?";
}

std::string_view finding_key(Finding f) {
  switch (f) {
    case Finding::not_finite: return "not_finite";
    case Finding::zero: return "zero";
    case Finding::nonlinear: return "nonlinear";
    case Finding::sign: return "sign";
    case Finding::scale: return "scale";
    case Finding::transposed_jacobian: return "transposed_jacobian";
    case Finding::transposed_input: return "transposed_input";
    case Finding::transposed_output: return "transposed_output";
    case Finding::masked_positions: return "masked_positions";
    case Finding::diagonal: return "diagonal";
    case Finding::one_row: return "one_row";
    case Finding::per_row_term: return "per_row_term";
    case Finding::unexplained: return "unexplained";
    case Finding::radial: return "radial";
    case Finding::kink: return "kink";
    case Finding::tolerance: return "tolerance";
    case Finding::one_input: return "one_input";
    case Finding::jvp_only: return "jvp_only";
    case Finding::vjp_only: return "vjp_only";
    case Finding::adjoint: return "adjoint";
    case Finding::consistent: return "consistent";
    case Finding::overwrites: return "overwrites";
    case Finding::no_jvp: return "no_jvp";
    case Finding::first_order: return "first_order";
    case Finding::hessian_block: return "hessian_block";
    case Finding::asymmetric: return "asymmetric";
  }
  return "?";
}

std::string Diagnosis::str() const {
  std::string where = input.empty() ? "" : check.empty() ? input + ": " : input + ", " + check + ": ";
  return fmt::format("[{}] {}{}", finding_name(kind), where, message);
}

std::ostream& operator<<(std::ostream& os, const Verdict& v) {
  return v.report.empty() ? os << (v.ok ? "passed" : "FAILED") : os << "\n" << v.report;
}

void GradcheckReport::conclude() {
  passed.ok = std::all_of(checks.begin(), checks.end(), [](const CheckResult& c) { return c.passed; });
  passed.report = str();
}

const Diagnosis* GradcheckReport::find(Finding f, std::string_view input) const {
  for (const auto& d : diagnoses)
    if (d.kind == f && (input.empty() || d.input == input)) return &d;
  return nullptr;
}

bool GradcheckReport::has(Finding f, std::string_view input) const { return find(f, input) != nullptr; }

std::string GradcheckReport::str() const {
  const bool ok = std::all_of(checks.begin(), checks.end(), [](const CheckResult& c) { return c.passed; });
  std::string title = op.empty() ? (case_name.empty() ? "gradcheck" : case_name)
                                  : (case_name.empty() ? op : fmt::format("{} / {}", op, case_name));
  std::string s = fmt::format("{}: {}\n", title, ok ? "passed" : "FAILED");
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
    if (!c.passed) s += fmt::format("  (analytic {:.6g}, numeric {:.6g})", c.analytic, c.numeric);
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
