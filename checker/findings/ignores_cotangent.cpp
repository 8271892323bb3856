// The kind of finding "ignores ȳ": x̄ does not change with ȳ: the backward returns the gradient for ȳ = 1
// (grad_output unused).
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet ignores_cotangent_finding() {
  return {
      .kind = Finding::ignores_cotangent,
      .title = "ignores ȳ",
      .meaning = "x̄ does not change with ȳ: the backward returns the gradient for ȳ = 1 (grad_output unused)",
      .found_by = "`checker/gradcheck.cpp` (the VJP at random cotangents)",
      .section = "docs/gradchecking.md#ignores-ȳ",
      .explains = true,
  };
}

}  // namespace tapegrad
