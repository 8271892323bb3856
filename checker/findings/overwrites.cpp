// The kind of finding "overwrites": backward assigns into the gradient instead of adding to it.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet overwrites_finding() {
  return {
      .kind = Finding::overwrites,
      .title = "overwrites",
      .meaning = "backward assigns into the gradient instead of adding to it",
      .found_by = "`checker/gradcheck.cpp` (the accumulate check) and `checker/second_order.cpp`",
      .section = "docs/gradchecking.md#overwrites",
      .explains = true,
  };
}

}  // namespace tapegrad
