// The kind of finding "radial": the JVP is right along ẋ = x and wrong across it.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet radial_finding() {
  return {
      .kind = Finding::radial,
      .title = "radial",
      .meaning = "the JVP is right along ẋ = x and wrong across it",
      .found_by = "`checker/gradcheck.cpp` (the JVP along x)",
      .section = "docs/gradchecking.md#radial",
  };
}

}  // namespace tapegrad
