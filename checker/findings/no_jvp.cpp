// The kind of finding "no JVP": the op was recorded without a JVP: forward mode is not checked (a note, not a
// failure).
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet no_jvp_finding() {
  return {
      .kind = Finding::no_jvp,
      .title = "no JVP",
      .meaning = "the op was recorded without a JVP: forward mode is not checked (a note, not a failure)",
      .found_by = "`checker/diagnose.cpp` (which_rule_and_input)",
      .section = "docs/gradchecking.md#no-jvp",
  };
}

}  // namespace tapegrad
