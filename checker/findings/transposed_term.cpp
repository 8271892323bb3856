// The kind of finding "transposed term": a square value inside the rule used where its transpose belongs: the
// formulas agree once transpose() is put around it or taken from it.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet transposed_term_finding() {
  return {
      .kind = Finding::transposed_term,
      .title = "transposed term",
      .meaning =
          "a square value inside the rule used where its transpose belongs: the formulas agree once "
          "transpose() is put around it or taken from it",
      .found_by = "`checker/formulas/edits.cpp` (edits of a rule written as formulas)",
      .section = "docs/gradchecking.md#transposed-term",
      .explains = true,
  };
}

}  // namespace tapegrad
