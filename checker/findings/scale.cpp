// The kind of finding "scale": A = c·N, c ≠ 1: a missing or wrong constant factor.
#include <fmt/format.h>

#include "checker/finding_sheet.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad {

namespace {

using namespace gradcheck_detail;

// A = c·N at every entry, c ≠ −1 (that is the sign's pass, before this one). The search ends.
bool whole_scale(JacobianSearch& s) {
  const JacobianView& v = s.v;
  const std::optional<double>& c = s.whole_factor();
  if (!c) return false;
  s.found.push_back({Finding::scale, v.input, v.check,
                     fmt::format("analytic = c × numeric at every one of {} elements, c = {}: the {} is off by a "
                                 "constant factor (a missing or wrong scale; divide by c to fix it)",
                                 v.a.size(), describe_factor(*c), rule_name(v.check)),
                     false, *c});
  return true;
}

}  // namespace

FindingSheet scale_finding() {
  return {
      .kind = Finding::scale,
      .title = "scale",
      .meaning = "A = c·N, c ≠ 1: a missing or wrong constant factor",
      .found_by =
          "its pass over a failing full Jacobian, in this file; in fast mode, from the projections "
          "(`checker/diagnose.cpp`)",
      .section = "docs/gradchecking.md#sign-and-scale",
      .passes = {{41, whole_scale}},
      .explains = true,
  };
}

}  // namespace tapegrad
