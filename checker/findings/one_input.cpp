// The kind of finding "one input": only one input's derivatives fail: the slip is in that input's term.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet one_input_finding() {
  return {
      .kind = Finding::one_input,
      .title = "one input",
      .meaning = "only one input's derivatives fail: the slip is in that input's term",
      .found_by = "`checker/diagnose.cpp` (which_rule_and_input: over the whole case)",
      .section = "docs/gradchecking.md#one-input",
  };
}

}  // namespace tapegrad
