// The kind of finding "masked positions": all errors where y does not depend on x (N = 0), or where A = 0 but N ≠ 0,
// or in one structured set of entries (a triangle, a band, a window).
#include <fmt/format.h>

#include "checker/finding_sheet.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad {

namespace {

using namespace gradcheck_detail;

// Every failing element where N = 0 (a mask missing in the rule) or where A = 0 (a mask the forward lacks).
bool at_masked_positions(JacobianSearch& s) {
  const JacobianView& v = s.v;
  const bool lets_through = s.failing_where_n_is_zero();
  if (!lets_through && !s.failing_where_a_is_zero()) return false;
  const std::string in_structure = s.structure() ? fmt::format("; they fill {}", *s.structure()) : "";
  if (lets_through)
    s.found.push_back({Finding::masked_positions, v.input, v.check,
                       fmt::format("all {} failing elements are where y does not depend on {} (numeric derivative 0, "
                                   "analytic not), e.g. {}{}; elsewhere the {} agrees: it lets a masked position "
                                   "through (a mask missing in the rule)",
                                   s.bad.size(), v.input, examples_str(v, s.bad), in_structure, rule_name(v.check))});
  else
    s.found.push_back({Finding::masked_positions, v.input, v.check,
                       fmt::format("all {} failing elements are where the {} gives 0 but y does depend on {}, e.g. "
                                   "{}{}: the rule masks positions the forward does not",
                                   s.bad.size(), rule_name(v.check), v.input, examples_str(v, s.bad), in_structure)});
  return false;
}

// Wrong values (both Jacobians nonzero) confined to a structured set that no pass before named as masked positions,
// the diagonal or one row.
bool in_a_structured_set(JacobianSearch& s) {
  if (s.found_any({Finding::masked_positions, Finding::diagonal, Finding::one_row}) || !s.structure()) return false;
  const JacobianView& v = s.v;
  s.found.push_back({Finding::masked_positions, v.input, v.check,
                     fmt::format("all {} failing elements lie in {}, e.g. {}; elsewhere the {} agrees: the rule "
                                 "treats that set of entries (a mask, a window, a boundary) differently from the "
                                 "forward",
                                 s.bad.size(), *s.structure(), examples_str(v, s.bad), rule_name(v.check))});
  return false;
}

}  // namespace

FindingSheet masked_positions_finding() {
  return {
      .kind = Finding::masked_positions,
      .title = "masked positions",
      .meaning =
          "all errors where y does not depend on x (N = 0), or where A = 0 but N ≠ 0, or in one structured "
          "set of entries (a triangle, a band, a window)",
      .found_by = "its passes over a failing full Jacobian, in this file",
      .section = "docs/gradchecking.md#masked-positions",
      .passes = {{90, at_masked_positions}, {115, in_a_structured_set}},
      .before_a_named_slip = BeforeANamedSlip::follows,
  };
}

}  // namespace tapegrad
