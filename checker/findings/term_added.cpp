// The kind of finding "term counted twice": e = +(one edge's term): that term is counted twice.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet term_added_finding() {
  return {
      .kind = Finding::term_added,
      .title = "term counted twice",
      .meaning = "e = +(one edge's term): that term is counted twice",
      .found_by =
          "`python/tapegrad/_forward.py`: the error e = x̄ − x̄_true fitted as α times the term of one edge "
          "of a Function's forward",
      .section =
          "docs/gradchecking.md#dropped-term-term-counted-twice-term-with-a-wrong-factor-term-from-the-wrong-value",
  };
}

}  // namespace tapegrad
