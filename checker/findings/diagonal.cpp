// The kind of finding "diagonal": all errors on the Jacobian's diagonal ∂y_k/∂x_k, or on x's or y's matrix diagonal.
#include <cmath>

#include <fmt/format.h>

#include "checker/finding_sheet.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad {

namespace {

using namespace gradcheck_detail;

// Every failing element on the Jacobian's diagonal, or else on the diagonal of x's or y's last two axes.
bool on_a_diagonal(JacobianSearch& s) {
  const JacobianView& v = s.v;
  if (v.m == v.cols && confined(v, s.bad, [](int64_t j, int64_t k) { return j == k; })) {
    s.found.push_back({Finding::diagonal, v.input, v.check,
                       fmt::format("all {} failing elements are on the Jacobian's diagonal ∂y[k]/∂{}[k]; the "
                                   "off-diagonal entries agree: a δ_jk term (the part of the derivative that acts "
                                   "element by element) is missing or wrong",
                                   s.bad.size(), v.input)});
    return false;
  }
  for (bool on_x : {true, false}) {
    const Shape& shape = on_x ? v.xshape : v.yshape;
    if (shape.rank() < 2 || shape[shape.rank() - 1] != shape[shape.rank() - 2]) continue;
    auto on_diagonal = [&](int64_t j, int64_t k) {
      auto idx = unravel(shape, on_x ? k : j);
      return idx[idx.size() - 1] == idx[idx.size() - 2];
    };
    if (!confined(v, s.bad, on_diagonal)) continue;
    const std::string& name = on_x ? v.input : v.y_name;
    s.found.push_back({Finding::diagonal, v.input, v.check,
                       fmt::format("all {} failing elements are on the diagonal of {}'s last two axes ({}[..., i, "
                                   "i]), e.g. {}; elsewhere the {} agrees: the i = j entries (a mask boundary j ≤ i, "
                                   "a self term) are handled wrong",
                                   s.bad.size(), name, name, examples_str(v, s.bad), rule_name(v.check))});
    break;
  }
  return false;
}

}  // namespace

FindingSheet diagonal_finding() {
  return {
      .kind = Finding::diagonal,
      .title = "diagonal",
      .meaning = "all errors on the Jacobian's diagonal ∂y_k/∂x_k, or on x's or y's matrix diagonal",
      .found_by = "its pass over a failing full Jacobian, in this file",
      .section = "docs/gradchecking.md#diagonal",
      .passes = {{100, on_a_diagonal}},
  };
}

}  // namespace tapegrad
