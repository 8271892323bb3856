// The kind of finding "adjoint": VJP and JVP each pass but ⟨J t, u⟩ ≠ ⟨t, Jᵀu⟩: they are not transposes of each
// other.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet adjoint_finding() {
  return {
      .kind = Finding::adjoint,
      .title = "adjoint",
      .meaning = "VJP and JVP each pass but ⟨J t, u⟩ ≠ ⟨t, Jᵀu⟩: they are not transposes of each other",
      .found_by = "`checker/diagnose.cpp` (which_rule_and_input)",
      .section = "docs/gradchecking.md#adjoint-each-rule-within-tolerance-not-adjoint-to-each-other",
  };
}

}  // namespace tapegrad
