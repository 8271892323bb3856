// The kind of finding "nonlinear": the VJP is not linear in ȳ (or the JVP in ẋ).
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet nonlinear_finding() {
  return {
      .kind = Finding::nonlinear,
      .title = "nonlinear",
      .meaning = "the VJP is not linear in ȳ (or the JVP in ẋ)",
      .found_by =
          "`checker/gradcheck.cpp` (the rule at ȳ and at 2ȳ, and at ȳ = 0 from Python: "
          "`python/tapegrad/_gradcheck.py`)",
      .section = "docs/gradchecking.md#nonlinear",
      .explains = true,
  };
}

}  // namespace tapegrad
