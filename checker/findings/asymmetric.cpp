// The kind of finding "asymmetric": H is not symmetric: ∂x̄_a/∂x_b ≠ (∂x̄_b/∂x_a)ᵀ, or ⟨w, H v⟩ ≠ ⟨v, H w⟩ with H·t
// passing.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet asymmetric_finding() {
  return {
      .kind = Finding::asymmetric,
      .title = "asymmetric",
      .meaning = "H is not symmetric: ∂x̄_a/∂x_b ≠ (∂x̄_b/∂x_a)ᵀ, or ⟨w, H v⟩ ≠ ⟨v, H w⟩ with H·t passing",
      .found_by = "`checker/diagnose_second_order.cpp` and `checker/second_order.cpp`",
      .section = "docs/gradchecking.md#second-order-diagnoses",
  };
}

}  // namespace tapegrad
