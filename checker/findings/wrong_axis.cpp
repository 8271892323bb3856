// The kind of finding "wrong axis": a reduction or broadcast taken along the wrong axis, or a layout call's entries
// moved back along the wrong axes: the rule agrees once one call's axis becomes another.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet wrong_axis_finding() {
  return {
      .kind = Finding::wrong_axis,
      .title = "wrong axis",
      .meaning =
          "a reduction, broadcast or permutation taken along the wrong axis: the rule agrees once one call's "
          "axis becomes another",
      .found_by =
          "`checker/formulas/edits.cpp`; from Python, `python/tapegrad/_forward_axis.py` and "
          "`python/tapegrad/_forward_term.py`",
      .section = "docs/gradchecking.md#wrong-axis",
      .explains = true,
  };
}

}  // namespace tapegrad
