// The kind of finding "precision defect": the error exceeds what rounding explains but shrinks with the precision: an
// intermediate kept or summed at the low precision where the reference keeps more bits, not a slip.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet precision_defect_finding() {
  return {
      .kind = Finding::precision_defect,
      .title = "precision defect",
      .meaning =
          "the error exceeds what rounding explains but shrinks with the precision: an intermediate kept "
          "or summed at the low precision where the reference keeps more bits, not a slip",
      .found_by =
          "`checker/precision.cpp` and `python/tapegrad/_precision_names.py` (an op run at bf16, fp16 or "
          "float32 against float64)",
      .section = "docs/gradchecking.md#precision-defect-rounds-inside-not-a-function",
  };
}

}  // namespace tapegrad
