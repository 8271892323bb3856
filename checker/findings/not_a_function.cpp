// The kind of finding "not a function": the forward returns different values at the same input: no derivative to
// compare, and no loosened check may pass it (a refusal).
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet not_a_function_finding() {
  return {
      .kind = Finding::not_a_function,
      .title = "not a function",
      .meaning =
          "the forward returns different values at the same input: no derivative to compare, and no "
          "loosened check may pass it (a refusal)",
      .found_by = "`python/tapegrad/_rounds_inside.py`",
      .section = "docs/gradchecking.md#precision-defect-rounds-inside-not-a-function",
  };
}

}  // namespace tapegrad
