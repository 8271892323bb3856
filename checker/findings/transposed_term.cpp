// The kind of finding "transposed term": a value inside the rule used with its entries moved where the value as the
// forward has it belongs: transposed (a square value, or two axes of one size), or reversed (a kernel not turned by
// 180°): the formulas agree once transpose() is put around it or taken from it, or the forward's rule once that one
// value of one call's term is moved back.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet transposed_term_finding() {
  return {
      .kind = Finding::transposed_term,
      .title = "transposed term",
      .meaning =
          "a value inside the rule used transposed (or reversed) where the value as it is belongs: the rule "
          "agrees once that one value is moved back",
      .found_by =
          "`checker/formulas/edits.cpp` (edits of a rule written as formulas); from Python, "
          "`python/tapegrad/_forward_term.py`",
      .section = "docs/gradchecking.md#transposed-term",
      .explains = true,
  };
}

}  // namespace tapegrad
