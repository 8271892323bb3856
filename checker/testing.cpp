#include "testing.hpp"

#include "second_order.hpp"

namespace tapegrad::testing {

std::string gradient_failures(const OpSheet& op, int order, const GradcheckOptions& opt) {
  if (order != 1 && order != 2) throw Error("gradient_failures: order is 1 or 2, not " + std::to_string(order));
  if (op.cases.empty()) return op.name + ": no gradcheck case is registered, so nothing of it was checked\n";
  std::string failures;
  for (const GradcheckCase& c : op.cases) {
    const GradcheckReport first = gradcheck(c, opt, op.name);
    if (!first.passed) failures += first.str(GradcheckReport::Order::diagnosis_first);
    if (order == 2) {
      const GradcheckReport second = gradcheck_second_order(c, opt, op.name);
      if (!second.passed) failures += second.str(GradcheckReport::Order::diagnosis_first);
    }
  }
  return failures;
}

}  // namespace tapegrad::testing
