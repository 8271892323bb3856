// The kind of finding "first order": H·t fails because the first-order VJP already does.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet first_order_finding() {
  return {
      .kind = Finding::first_order,
      .title = "first order",
      .meaning = "H·t fails because the first-order VJP already does",
      .found_by = "`checker/diagnose_second_order.cpp`",
      .section = "docs/gradchecking.md#second-order-diagnoses",
  };
}

}  // namespace tapegrad
