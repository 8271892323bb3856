// The kind of finding "Hessian block": which blocks ∂x̄_a/∂x_b of the Hessian fail: the terms of a rule along one
// input's tangent.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet hessian_block_finding() {
  return {
      .kind = Finding::hessian_block,
      .title = "Hessian block",
      .meaning = "which blocks ∂x̄_a/∂x_b of the Hessian fail: the terms of a rule along one input's tangent",
      .found_by = "`checker/diagnose_second_order.cpp`",
      .section = "docs/gradchecking.md#second-order-diagnoses",
  };
}

}  // namespace tapegrad
