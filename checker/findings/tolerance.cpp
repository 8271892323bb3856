// The kind of finding "tolerance": the errors are the finite differences' own: the tolerance is tighter than they
// resolve.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet tolerance_finding() {
  return {
      .kind = Finding::tolerance,
      .title = "tolerance",
      .meaning = "the errors are the finite differences' own: the tolerance is tighter than they resolve",
      .found_by = "`checker/gradcheck.cpp` (the check again at other steps ε)",
      .section = "docs/gradchecking.md#tolerance",
      .explains = true,
  };
}

}  // namespace tapegrad
