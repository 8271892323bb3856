// The kind of finding "sign": A = −N: the whole rule has the wrong sign.
#include <cmath>

#include <fmt/format.h>

#include "checker/finding_sheet.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad {

namespace {

using namespace gradcheck_detail;

// A = −N at every entry. The search ends.
bool whole_sign(JacobianSearch& s) {
  const JacobianView& v = s.v;
  const std::optional<double>& c = s.whole_factor();
  if (!c || std::abs(*c + 1) > kSignSlack) return false;
  s.found.push_back({Finding::sign, v.input, v.check,
                     fmt::format("analytic = −1 × numeric at every one of {} elements: the {} has the wrong sign "
                                 "(a sign slip)",
                                 v.a.size(), rule_name(v.check))});
  return true;
}

}  // namespace

FindingSheet sign_finding() {
  return {
      .kind = Finding::sign,
      .title = "sign",
      .meaning = "A = −N: the whole rule has the wrong sign",
      .found_by =
          "its pass over a failing full Jacobian, in this file; in fast mode, from the projections "
          "(`checker/diagnose.cpp`)",
      .section = "docs/gradchecking.md#sign-and-scale",
      .passes = {{40, whole_sign}},
      .explains = true,
  };
}

}  // namespace tapegrad
