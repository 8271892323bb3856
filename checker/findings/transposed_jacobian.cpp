// The kind of finding "transposed Jacobian": A = Nᵀ: J applied where Jᵀ belongs (or the reverse).
#include <cmath>

#include <fmt/format.h>

#include "checker/finding_sheet.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad {

namespace {

using namespace gradcheck_detail;

// A square Jacobian whose analytic side is the numeric one transposed (up to a factor). The search ends.
bool transposed_whole(JacobianSearch& s) {
  const JacobianView& v = s.v;
  if (v.m != v.cols) return false;
  std::vector<int64_t> map(v.a.size());
  for (int64_t j = 0; j < v.m; ++j)
    for (int64_t k = 0; k < v.cols; ++k) map[static_cast<size_t>(j * v.cols + k)] = k * v.cols + j;
  const auto c = common_factor(v.a, v.n, map, v.tol);
  if (!c) return false;
  const bool is_vjp = v.check == "vjp";
  s.found.push_back({Finding::transposed_jacobian, v.input, v.check,
                     fmt::format("analytic = the transposed Jacobian Jᵀ{}: the {} applies {} where {} belongs "
                                 "(a transpose slip)",
                                 and_a_factor(*c), rule_name(v.check), is_vjp ? "J" : "Jᵀ", is_vjp ? "Jᵀ" : "J")});
  return true;
}

}  // namespace

FindingSheet transposed_jacobian_finding() {
  return {
      .kind = Finding::transposed_jacobian,
      .title = "transposed Jacobian",
      .meaning = "A = Nᵀ: J applied where Jᵀ belongs (or the reverse)",
      .found_by = "its pass over a failing full Jacobian, in this file",
      .section = "docs/gradchecking.md#transposes",
      .passes = {{50, transposed_whole}},
      .explains = true,
  };
}

}  // namespace tapegrad
