// The diagnosis of a failing VJP or JVP from its full Jacobian: the passes of the kinds of finding
// (checker/findings/), run in their order; the fast mode's reading of projections; and the findings over the whole
// case (which rule, which input).
#include <algorithm>

#include <fmt/format.h>

#include "checker/finding_sheet.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad::gradcheck_detail {

namespace {

// Every built-in kind's passes over a failing full Jacobian, lowest rank first.
const std::vector<RankedPass>& jacobian_passes() {
  static const std::vector<RankedPass> passes = [] {
    std::vector<RankedPass> all;
    for (const FindingSheet& sheet : builtin_findings())
      for (const RankedPass& pass : sheet.passes) all.push_back(pass);
    std::sort(all.begin(), all.end(), [](const RankedPass& a, const RankedPass& b) { return a.rank < b.rank; });
    return all;
  }();
  return passes;
}

}  // namespace

// Everything the full Jacobians say about a failing VJP or JVP, most telling first: each kind's pass in the order of
// the ranks their sheets give them, until one explains the failure as a whole.
std::vector<Diagnosis> diagnose_jacobian(const JacobianView& v, bool* all_kinks) {
  const Elements bad = failing_elements(v);
  JacobianSearch search(v, bad);
  if (!bad.empty())
    for (const RankedPass& pass : jacobian_passes())
      if (pass.run(search)) break;
  *all_kinks = search.all_kinks;
  return std::move(search.found);
}

// The fast mode keeps only projections: A = c·N over them is all it can tell.
std::optional<Diagnosis> diagnose_values(const std::string& input, const std::string& check, std::span<const double> a,
                                         std::span<const double> n, Tolerance tol) {
  const char* rule = rule_name(check);
  if (std::all_of(a.begin(), a.end(), [](double e) { return e == 0; }) &&
      std::any_of(n.begin(), n.end(), [&](double e) { return std::abs(e) > tol.atol; }))
    return Diagnosis{Finding::zero, input, check,
                     fmt::format("the {} gives 0 for every projection of {}", rule, input)};
  if (auto c = common_factor(a, n, {}, tol)) {
    if (std::abs(*c + 1) <= kSignSlack)
      return Diagnosis{
          Finding::sign, input, check,
          fmt::format("analytic = −1 × numeric for every random projection: the {} has the wrong sign", rule)};
    return Diagnosis{Finding::scale,
                     input,
                     check,
                     fmt::format("analytic = c × numeric for every random projection, c = {}: the {} is off by a "
                                 "constant factor",
                                 describe_factor(*c), rule),
                     false,
                     *c};
  }
  return std::nullopt;
}

// Which rule, and which input, is at fault: the findings over the whole case, from each input's outcome.
std::vector<Diagnosis> which_rule_and_input(std::span<const InputOutcome> outcomes, const std::string& no_jvp_op) {
  std::vector<Diagnosis> summary;
  int failing_inputs = 0;
  for (const auto& o : outcomes) failing_inputs += !(o.vjp_ok && o.jvp_ok) && !o.explained;
  for (const auto& o : outcomes) {
    if (o.explained) continue;
    if (o.vjp_ok && !o.jvp_ok)
      summary.push_back({Finding::jvp_only, o.name, "",
                         fmt::format("the VJP agrees with the finite differences and the JVP does not{}: the slip is "
                                     "in the forward-mode rule",
                                     o.adjoint_ok ? "" : " (so the adjoint identity ⟨J t, u⟩ = ⟨t, Jᵀu⟩ fails too)")});
    else if (!o.vjp_ok && o.jvp_ok && !o.jvp_skipped)
      summary.push_back({Finding::vjp_only, o.name, "",
                         fmt::format("the JVP agrees with the finite differences and the VJP does not{}: the slip is "
                                     "in backward",
                                     o.adjoint_ok ? "" : " (so the adjoint identity ⟨J t, u⟩ = ⟨t, Jᵀu⟩ fails too)")});
    else if (o.vjp_ok && o.jvp_ok && !o.adjoint_ok)
      summary.push_back(
          {Finding::adjoint, o.name, "adjoint",
           "VJP and JVP each pass their checks, but ⟨J t, u⟩ ≠ ⟨t, Jᵀu⟩: they are not transposes of "
           "each other (an error below the finite-difference tolerance, one the projections miss, or a rule that "
           "is not linear and passes on one-hot cotangents)"});
    else if (!o.vjp_ok && !o.jvp_ok && o.adjoint_ok)
      summary.push_back({Finding::consistent, o.name, "",
                         "VJP and JVP both disagree with the finite differences but agree with each other (the "
                         "adjoint identity holds): the derivation they share is wrong, or the forward computes "
                         "something else than what they differentiate"});
  }
  if (failing_inputs == 1 && outcomes.size() >= 2)
    for (const auto& o : outcomes)
      if (!(o.vjp_ok && o.jvp_ok) && !o.explained)
        summary.push_back(
            {Finding::one_input, o.name, "",
             fmt::format("only {}'s derivatives fail; {} agree: the slip is in {}'s term", o.name,
                         outcomes.size() == 2 ? std::string("the other input's")
                                              : fmt::format("those of the other {} inputs", outcomes.size() - 1),
                         o.name)});
  if (!no_jvp_op.empty())
    summary.push_back({Finding::no_jvp, "", "",
                       fmt::format("op '{}' was recorded with no_jvp: forward mode and the adjoint identity are not "
                                   "checked (a note, not a failure)",
                                   no_jvp_op)});
  return summary;
}

}  // namespace tapegrad::gradcheck_detail
