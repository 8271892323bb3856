// The kind of finding "not finite": the analytic derivative holds NaN or ±∞: a division by zero or an overflow in the
// rule.
#include <cmath>

#include <fmt/format.h>

#include "checker/finding_sheet.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad {

namespace {

using namespace gradcheck_detail;

// A failing element where the rule's value is not finite: the search ends there.
bool rule_not_finite(JacobianSearch& s) {
  const JacobianView& v = s.v;
  for (auto [j, k] : s.bad) {
    const double a = v.a[static_cast<size_t>(j * v.cols + k)];
    if (!std::isfinite(a)) {
      s.found.push_back({Finding::not_finite, v.input, v.check,
                         fmt::format("the {} gives {} at {}: a division by zero or an overflow in the rule",
                                     rule_name(v.check), a, element_str(v, j, k))});
      return true;
    }
  }
  return false;
}

}  // namespace

FindingSheet not_finite_finding() {
  return {
      .kind = Finding::not_finite,
      .title = "not finite",
      .meaning = "the analytic derivative holds NaN or ±∞: a division by zero or an overflow in the rule",
      .found_by = "its pass over a failing full Jacobian, in this file",
      .section = "docs/gradchecking.md#zero-not-finite",
      .passes = {{10, rule_not_finite}},
      .explains = true,
  };
}

}  // namespace tapegrad
