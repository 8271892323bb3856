// The kind of finding "one row": all errors in one row (last axis) of y or of x: a term of that row alone wrong.
#include <cmath>

#include <fmt/format.h>

#include "checker/finding_sheet.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad {

namespace {

using namespace gradcheck_detail;

// Every failing element in one row (along the last axis) of y, of x, or of both.
bool in_one_row(JacobianSearch& s) {
  const JacobianView& v = s.v;
  std::string rows;
  for (bool on_x : {false, true}) {
    const Shape& shape = on_x ? v.xshape : v.yshape;
    if (shape.rank() < 2) continue;
    const int64_t len = shape.back();
    if (shape.numel() / len < 2) continue;
    const int64_t row = (on_x ? s.bad[0].second : s.bad[0].first) / len;
    if (confined(v, s.bad, [&](int64_t j, int64_t k) { return (on_x ? k : j) / len == row; }))
      rows += fmt::format("{}{}", rows.empty() ? "" : " and ", row_name(shape, on_x ? v.input : v.y_name, row));
  }
  if (!rows.empty())
    s.found.push_back({Finding::one_row, v.input, v.check,
                       fmt::format("all {} failing elements are in one row, {}; the other rows agree: a term of that "
                                   "row alone (its normalizer, a boundary or special case, a loop bound) is wrong",
                                   s.bad.size(), rows)});
  return false;
}

}  // namespace

FindingSheet one_row_finding() {
  return {
      .kind = Finding::one_row,
      .title = "one row",
      .meaning = "all errors in one row (last axis) of y or of x: a term of that row alone wrong",
      .found_by = "its pass over a failing full Jacobian, in this file",
      .section = "docs/gradchecking.md#one-row",
      .passes = {{110, in_one_row}},
  };
}

}  // namespace tapegrad
