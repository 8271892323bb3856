// Errors confined to a set of the Jacobian's entries: masked positions, the diagonal, one row.
#include <algorithm>

#include <fmt/ranges.h>

#include "checker/jacobian.hpp"

namespace tapegrad::gradcheck_detail {

void confined_patterns(const JacobianView& v, const Elements& bad, std::vector<Diagnosis>& out) {
  const char* rule = rule_name(v.check);
  const double zero_tol = 1e-12 * std::max(1.0, *std::max_element(v.n.begin(), v.n.end(), [](double p, double q) {
    return std::abs(p) < std::abs(q);
  }));
  auto numeric_zero = [&](int64_t j, int64_t k) { return std::abs(v.n[static_cast<size_t>(j * v.cols + k)]) <= zero_tol; };
  auto analytic_zero = [&](int64_t j, int64_t k) { return v.a[static_cast<size_t>(j * v.cols + k)] == 0; };
  const auto structure = structured_set(v, bad, zero_tol);
  const std::string in_structure = structure ? fmt::format("; they fill {}", *structure) : "";
  const size_t before = out.size();
  if (confined(v, bad, numeric_zero))
    out.push_back({Finding::masked_positions, v.input, v.check,
                   fmt::format("all {} failing elements are where y does not depend on {} (numeric derivative 0, "
                               "analytic not), e.g. {}{}; elsewhere the {} agrees: it lets a masked position through "
                               "(a mask missing in the rule)",
                               bad.size(), v.input, examples_str(v, bad), in_structure, rule)});
  else if (confined(v, bad, analytic_zero))
    out.push_back({Finding::masked_positions, v.input, v.check,
                   fmt::format("all {} failing elements are where the {} gives 0 but y does depend on {}, e.g. {}{}: "
                               "the rule masks positions the forward does not",
                               bad.size(), rule, v.input, examples_str(v, bad), in_structure)});

  if (v.m == v.cols && confined(v, bad, [](int64_t j, int64_t k) { return j == k; }))
    out.push_back({Finding::diagonal, v.input, v.check,
                   fmt::format("all {} failing elements are on the Jacobian's diagonal ∂y[k]/∂{}[k]; the "
                               "off-diagonal entries agree: a δ_jk term (the part of the derivative that acts "
                               "element by element) is missing or wrong",
                               bad.size(), v.input)});
  else {
    for (bool on_x : {true, false}) {
      const Shape& s = on_x ? v.xshape : v.yshape;
      if (s.rank() < 2 || s[s.rank() - 1] != s[s.rank() - 2]) continue;
      auto on_diagonal = [&](int64_t j, int64_t k) {
        auto idx = unravel(s, on_x ? k : j);
        return idx[idx.size() - 1] == idx[idx.size() - 2];
      };
      if (confined(v, bad, on_diagonal)) {
        out.push_back({Finding::diagonal, v.input, v.check,
                       fmt::format("all {} failing elements are on the diagonal of {}'s last two axes ({}[..., i, "
                                   "i]), e.g. {}; elsewhere the {} agrees: the i = j entries (a mask boundary j ≤ i, "
                                   "a self term) are handled wrong",
                                   bad.size(), on_x ? v.input.c_str() : v.y_name.c_str(), on_x ? v.input.c_str() : v.y_name.c_str(),
                                   examples_str(v, bad), rule)});
        break;
      }
    }
  }

  // One row (the last axis) of y, of x, or of both.
  std::string rows_msg;
  for (bool on_x : {false, true}) {
    const Shape& s = on_x ? v.xshape : v.yshape;
    if (s.rank() < 2) continue;
    const int64_t len = s.back();
    if (s.numel() / len < 2) continue;
    const int64_t row = (on_x ? bad[0].second : bad[0].first) / len;
    if (confined(v, bad, [&](int64_t j, int64_t k) { return (on_x ? k : j) / len == row; })) {
      rows_msg += fmt::format("{}{}", rows_msg.empty() ? "" : " and ", row_name(s, on_x ? v.input : v.y_name, row));
    }
  }
  if (!rows_msg.empty())
    out.push_back({Finding::one_row, v.input, v.check,
                   fmt::format("all {} failing elements are in one row, {}; the other rows agree: a term of that "
                               "row alone (its normalizer, a boundary or special case, a loop bound) is wrong",
                               bad.size(), rows_msg)});
  // Wrong values (both Jacobians nonzero) confined to a structured set no finding above names.
  if (out.size() == before && structure)
    out.push_back({Finding::masked_positions, v.input, v.check,
                   fmt::format("all {} failing elements lie in {}, e.g. {}; elsewhere the {} agrees: the rule "
                               "treats that set of entries (a mask, a window, a boundary) differently from the "
                               "forward",
                               bad.size(), *structure, examples_str(v, bad), rule)});
}

}  // namespace tapegrad::gradcheck_detail
