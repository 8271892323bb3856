// The kind of finding "VJP only": the JVP passes, the VJP fails: the slip is in backward.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet vjp_only_finding() {
  return {
      .kind = Finding::vjp_only,
      .title = "VJP only",
      .meaning = "the JVP passes, the VJP fails: the slip is in backward",
      .found_by = "`checker/diagnose.cpp` (which_rule_and_input)",
      .section = "docs/gradchecking.md#vjp-only-jvp-only",
  };
}

}  // namespace tapegrad
