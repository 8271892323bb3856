// The kind of finding "transposed input": A = N with two equal-size axes of x swapped: x̄ (or its use) transposed.
#include <fmt/format.h>

#include "checker/finding_sheet.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad {

namespace {

using namespace gradcheck_detail;

// A = N with two equal-size axes of x swapped (up to a factor). The search ends.
bool transposed_x(JacobianSearch& s) {
  const JacobianView& v = s.v;
  const auto swap = swapped_axes(v, true);
  if (!swap) return false;
  s.found.push_back({Finding::transposed_input, v.input, v.check,
                     fmt::format("analytic = numeric with axes {} and {} of {} {} swapped{}: the {} {} (a transpose "
                                 "slip: a product taken in the wrong order, or a matrix used where its transpose "
                                 "belongs)",
                                 swap->p, swap->q, v.input, v.xshape, and_a_factor(swap->c), rule_name(v.check),
                                 v.check == "vjp" ? fmt::format("gives the gradient of {} transposed", v.input)
                                                  : fmt::format("reads the tangent of {} transposed", v.input))});
  return true;
}

}  // namespace

FindingSheet transposed_input_finding() {
  return {
      .kind = Finding::transposed_input,
      .title = "transposed input",
      .meaning = "A = N with two equal-size axes of x swapped: x̄ (or its use) transposed",
      .found_by = "its pass over a failing full Jacobian, in this file",
      .section = "docs/gradchecking.md#transposes",
      .passes = {{60, transposed_x}},
      .explains = true,
  };
}

}  // namespace tapegrad
