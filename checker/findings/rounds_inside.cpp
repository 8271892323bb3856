// The kind of finding "rounds inside": a float64 forward that rounds at fp16 or bf16 inside: finite differences in
// float64 read its steps; check it at that precision instead (a refusal).
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet rounds_inside_finding() {
  return {
      .kind = Finding::rounds_inside,
      .title = "rounds inside",
      .meaning =
          "a float64 forward that rounds at fp16 or bf16 inside: finite differences in float64 read its "
          "steps; check it at that precision instead (a refusal)",
      .found_by = "`python/tapegrad/_rounds_inside.py`",
      .section = "docs/gradchecking.md#precision-defect-rounds-inside-not-a-function",
  };
}

}  // namespace tapegrad
