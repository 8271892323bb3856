// The kind of finding "dropped term": e = −(one edge's term): the backward leaves out the term of one op of the
// forward.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet term_dropped_finding() {
  return {
      .kind = Finding::term_dropped,
      .title = "dropped term",
      .meaning = "e = −(one edge's term): the backward leaves out the term of one op of the forward",
      .found_by =
          "`python/tapegrad/_forward.py`: the error e = x̄ − x̄_true fitted as α times the term of one edge "
          "of a Function's forward",
      .section =
          "docs/gradchecking.md#dropped-term-term-counted-twice-term-with-a-wrong-factor-term-from-the-wrong-value",
  };
}

}  // namespace tapegrad
