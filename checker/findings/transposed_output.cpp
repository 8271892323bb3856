// The kind of finding "transposed output": A = N with two equal-size axes of y swapped: ȳ read (or ẏ given)
// transposed.
#include <fmt/format.h>

#include "checker/finding_sheet.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad {

namespace {

using namespace gradcheck_detail;

// A = N with two equal-size axes of y swapped (up to a factor). The search ends.
bool transposed_y(JacobianSearch& s) {
  const JacobianView& v = s.v;
  const auto swap = swapped_axes(v, false);
  if (!swap) return false;
  s.found.push_back({Finding::transposed_output, v.input, v.check,
                     fmt::format("analytic = numeric with axes {} and {} of {} {} swapped{}: the {} {} (a transpose "
                                 "slip: a product taken in the wrong order, or a matrix used where its transpose "
                                 "belongs)",
                                 swap->p, swap->q, v.y_name, v.yshape, and_a_factor(swap->c), rule_name(v.check),
                                 v.check == "vjp" ? "reads ȳ transposed" : "gives ẏ transposed")});
  return true;
}

}  // namespace

FindingSheet transposed_output_finding() {
  return {
      .kind = Finding::transposed_output,
      .title = "transposed output",
      .meaning = "A = N with two equal-size axes of y swapped: ȳ read (or ẏ given) transposed",
      .found_by = "its pass over a failing full Jacobian, in this file",
      .section = "docs/gradchecking.md#transposes",
      .passes = {{61, transposed_y}},
      .explains = true,
  };
}

}  // namespace tapegrad
