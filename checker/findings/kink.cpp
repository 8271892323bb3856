// The kind of finding "kink": one-sided differences disagree: the point is not differentiable, and the failure says
// nothing of the rule.
#include <cmath>

#include <fmt/format.h>

#include "checker/finding_sheet.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad {

namespace {

using namespace gradcheck_detail;

// Kinks: failing elements whose one-sided slopes differ by more than their error. When every failing element is one,
// the search ends: the failure says nothing about the rule.
bool failing_at_kinks(JacobianSearch& s) {
  const JacobianView& v = s.v;
  if (v.plus.empty()) return false;  // the fast mode keeps no one-sided differences
  int kinks = 0;
  double fw = 0, bw = 0, f0 = 0, b0 = 0;
  std::pair<int64_t, int64_t> first{-1, -1};
  for (auto [j, k] : s.bad)
    if (kink_at(v, j, k, &fw, &bw)) {
      if (kinks++ == 0) first = {j, k}, f0 = fw, b0 = bw;
    }
  if (kinks == 0) return false;
  const double a = v.a[static_cast<size_t>(first.first * v.cols + first.second)];
  const char* side = std::abs(a - f0) <= std::abs(a - b0) ? "the right-hand" : "the left-hand";
  s.found.push_back({Finding::kink, v.input, v.check,
                     fmt::format("{} of {} failing elements sit at a kink: at {} the slope is {:.6g} to the right "
                                 "and {:.6g} to the left, the central difference averages them and the {} gives {:.6g} "
                                 "({} slope). The point is not differentiable: check away from it "
                                 "(Fill::away_from_zero)",
                                 kinks, s.bad.size(), element_str(v, first.first, first.second), f0, b0,
                                 rule_name(v.check), a, side)});
  s.all_kinks = kinks == static_cast<int>(s.bad.size());
  return s.all_kinks;
}

}  // namespace

FindingSheet kink_finding() {
  return {
      .kind = Finding::kink,
      .title = "kink",
      .meaning =
          "one-sided differences disagree: the point is not differentiable, and the failure says nothing "
          "of the rule",
      .found_by =
          "its pass over a failing full Jacobian, in this file; in fast mode, from the projections' "
          "one-sided differences (`checker/gradcheck.cpp`)",
      .section = "docs/gradchecking.md#kink",
      .passes = {{20, failing_at_kinks}},
      .explains = true,
  };
}

}  // namespace tapegrad
