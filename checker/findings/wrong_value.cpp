// The kind of finding "term from the wrong value": x̄ is the right rule with one value of the forward replaced by
// another of its shape.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet wrong_value_finding() {
  return {
      .kind = Finding::wrong_value,
      .title = "term from the wrong value",
      .meaning = "x̄ is the right rule with one value of the forward replaced by another of its shape",
      .found_by = "`python/tapegrad/_forward_rewrite.py` (the forward's rule with one value replaced)",
      .section =
          "docs/gradchecking.md#dropped-term-term-counted-twice-term-with-a-wrong-factor-term-from-the-wrong-value",
  };
}

}  // namespace tapegrad
