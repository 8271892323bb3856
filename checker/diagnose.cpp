// The diagnosis of a failing VJP or JVP from its full Jacobian: the checks that end the search (not finite, kinks,
// nothing written, one whole-Jacobian pattern), then the patterns of where the errors sit; and the findings over
// the whole case (which rule, which input).
#include <algorithm>

#include <fmt/format.h>

#include "checker/jacobian.hpp"

namespace tapegrad::gradcheck_detail {

// Everything the full Jacobians say about a failing VJP or JVP, most telling first. *all_kinks: every failing
// element sits at a kink (the failure says nothing about the rule).
std::vector<Diagnosis> diagnose_jacobian(const JacobianView& v, bool* all_kinks) {
  std::vector<Diagnosis> out;
  *all_kinks = false;
  const bool is_vjp = v.check == "vjp";
  const char* rule = rule_name(v.check);
  const auto bad = failing_elements(v);
  if (bad.empty()) return out;

  for (auto [j, k] : bad)
    if (!std::isfinite(v.a[static_cast<size_t>(j * v.cols + k)])) {
      out.push_back({Finding::not_finite, v.input, v.check,
                     fmt::format("the {} gives {} at {}: a division by zero or an overflow in the rule", rule,
                                 v.a[static_cast<size_t>(j * v.cols + k)], element_str(v, j, k))});
      return out;
    }
  // Kinks: every failing element has one-sided slopes that differ by more than its error.
  if (!v.plus.empty()) {
    int kinks = 0;
    double fw = 0, bw = 0, f0 = 0, b0 = 0;
    std::pair<int64_t, int64_t> first{-1, -1};
    for (auto [j, k] : bad)
      if (kink_at(v, j, k, &fw, &bw)) {
        if (kinks++ == 0) first = {j, k}, f0 = fw, b0 = bw;
      }
    if (kinks > 0) {
      const double a = v.a[static_cast<size_t>(first.first * v.cols + first.second)];
      const char* side = std::abs(a - f0) <= std::abs(a - b0) ? "the right-hand" : "the left-hand";
      out.push_back({Finding::kink, v.input, v.check,
                     fmt::format("{} of {} failing elements sit at a kink: at {} the slope is {:.6g} to the right "
                                 "and {:.6g} to the left, the central difference averages them and the {} gives {:.6g} "
                                 "({} slope). The point is not differentiable: check away from it "
                                 "(Fill::away_from_zero)",
                                 kinks, bad.size(), element_str(v, first.first, first.second), f0, b0, rule, a,
                                 side)});
      if (kinks == static_cast<int>(bad.size())) {
        *all_kinks = true;
        return out;
      }
    }
  }

  if (std::all_of(v.a.begin(), v.a.end(), [](double e) { return e == 0; })) {
    out.push_back({Finding::zero, v.input, v.check,
                   v.check == "hvp"
                       ? fmt::format("H·t is 0 in {} for every direction of {}: the second-order term is missing (a "
                                     "rule that adds nothing, or linear_in_inputs for an op whose VJP moves with {})",
                                     v.y_name, v.input, v.input)
                   : is_vjp ? fmt::format("the VJP leaves x̄ of {} at 0 everywhere while y depends on it: it never "
                                        "writes that input's gradient",
                                        v.input)
                          : fmt::format("the JVP leaves ẏ at 0 for every tangent of {}: it never adds that input's "
                                        "term (an op without a forward-mode rule records no_jvp(name) instead)",
                                        v.input)});
    return out;
  }

  if (auto d = whole_jacobian_pattern(v)) {
    out.push_back(*d);
    return out;
  }

  if (auto d = per_row_factor(v)) {
    out.push_back(*d);
    return out;
  }
  if (auto d = elementwise_error(v)) {
    out.push_back(*d);
    return out;
  }
  confined_patterns(v, bad, out);
  if (auto d = per_row_term(v, bad)) out.push_back(*d);
  return out;
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
      summary.push_back({Finding::adjoint, o.name, "adjoint",
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
        summary.push_back({Finding::one_input, o.name, "",
                           fmt::format("only {}'s derivatives fail; {} agree: the slip is in {}'s term", o.name,
                                       outcomes.size() == 2 ? std::string("the other input's")
                                                            : fmt::format("those of the other {} inputs",
                                                                          outcomes.size() - 1),
                                       o.name)});
  if (!no_jvp_op.empty())
    summary.push_back({Finding::no_jvp, "", "",
                       fmt::format("op '{}' was recorded with no_jvp: forward mode and the adjoint identity are not "
                                   "checked (a note, not a failure)",
                                   no_jvp_op)});
  return summary;
}

}  // namespace tapegrad::gradcheck_detail
