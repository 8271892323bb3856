// The kind of finding "JVP only": the VJP passes, the JVP fails: the slip is in the forward-mode rule.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet jvp_only_finding() {
  return {
      .kind = Finding::jvp_only,
      .title = "JVP only",
      .meaning = "the VJP passes, the JVP fails: the slip is in the forward-mode rule",
      .found_by = "`checker/diagnose.cpp` (which_rule_and_input)",
      .section = "docs/gradchecking.md#vjp-only-jvp-only",
  };
}

}  // namespace tapegrad
