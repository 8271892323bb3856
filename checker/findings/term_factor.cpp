// The kind of finding "term with a wrong factor": e = α·(one edge's term), α ≠ 0, ±1: that term carries a wrong
// factor (1 + α).
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet term_factor_finding() {
  return {
      .kind = Finding::term_factor,
      .title = "term with a wrong factor",
      .meaning = "e = α·(one edge's term), α ≠ 0, ±1: that term carries a wrong factor (1 + α)",
      .found_by =
          "`python/tapegrad/_forward.py`: the error e = x̄ − x̄_true fitted as α times the term of one edge "
          "of a Function's forward; for formulas, `checker/formulas/derivative_edits.hpp`: an element-wise "
          "call's derivative edited into the rule",
      .section =
          "docs/gradchecking.md#dropped-term-term-counted-twice-term-with-a-wrong-factor-term-from-the-wrong-value",
  };
}

}  // namespace tapegrad
