// The kind of finding "saved in forward": a torch Function keeps a value computed from its inputs for backward: a
// constant to double backward, whose terms along the inputs are then lost.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet saved_in_forward_finding() {
  return {
      .kind = Finding::saved_in_forward,
      .title = "saved in forward",
      .meaning =
          "a torch Function keeps a value computed from its inputs for backward: a constant to double "
          "backward, whose terms along the inputs are then lost",
      .found_by = "`python/tapegrad/_gradcheck.py` (named from Python, with its line)",
      .section = "docs/python.md#1-a-pytorch-op",
  };
}

}  // namespace tapegrad
