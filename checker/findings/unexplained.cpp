// When no known kind fits: where the error |A − N| concentrates, by rows of y, rows and columns of x, and entries.
#include <algorithm>
#include <numeric>

#include <fmt/ranges.h>

#include "checker/finding_sheet.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad::gradcheck_detail {

namespace {

// The share of the total error the named groups carry: the rest is left unnamed.
constexpr double kShownShare = 0.9;

// The groups (by `group_of` over (j, k)) that carry 90% of the total error, largest first, as "name (share)";
// "all N" when that takes every group that has any.
std::string concentration(const JacobianView& v, int64_t groups, auto&& group_of, auto&& name_of) {
  std::vector<double> mass(static_cast<size_t>(groups), 0.0);
  double total = 0;
  for (int64_t j = 0; j < v.m; ++j)
    for (int64_t k = 0; k < v.cols; ++k) {
      const size_t e = static_cast<size_t>(j * v.cols + k);
      const double err = std::abs(v.a[e] - v.n[e]);
      mass[static_cast<size_t>(group_of(j, k))] += err;
      total += err;
    }
  std::vector<int64_t> order(static_cast<size_t>(groups));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t p, int64_t q) { return mass[size_t(p)] > mass[size_t(q)]; });
  std::vector<std::string> parts;
  double covered = 0;
  for (int64_t g : order) {
    if (covered >= kShownShare * total || mass[static_cast<size_t>(g)] == 0) break;
    covered += mass[static_cast<size_t>(g)];
    parts.push_back(fmt::format("{} ({:.0f}%)", name_of(g), 100 * mass[static_cast<size_t>(g)] / total));
  }
  if (static_cast<int64_t>(parts.size()) == groups && groups > 1) return fmt::format("spread over all {}", groups);
  if (parts.size() > 6) {
    const size_t more = parts.size() - 6;
    parts.resize(6);
    parts.push_back(fmt::format("{} more", more));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

Diagnosis unexplained(const JacobianView& v, const Elements& bad) {
  const Shape &ys = v.yshape, &xs = v.xshape;
  std::vector<std::string> where;
  if (ys.rank() >= 1 && ys.rows() > 1)
    where.push_back("rows of y: " + concentration(
                                        v, ys.rows(), [&](int64_t j, int64_t) { return j / ys.back(); },
                                        [&](int64_t r) { return row_name(ys, v.y_name, r); }));
  if (xs.rank() >= 1 && xs.rows() > 1)
    where.push_back(fmt::format("rows of {}: ", v.input) + concentration(
                                                               v, xs.rows(),
                                                               [&](int64_t, int64_t k) { return k / xs.back(); },
                                                               [&](int64_t r) { return row_name(xs, v.input, r); }));
  if (xs.rank() >= 1 && xs.back() > 1)
    where.push_back(fmt::format("columns of {}: ", v.input) +
                    concentration(
                        v, xs.back(), [&](int64_t, int64_t k) { return k % xs.back(); },
                        [&](int64_t c) { return fmt::format("{}[..., {}]", v.input, c); }));
  // The largest entries.
  Elements worst = bad;
  auto err = [&](const std::pair<int64_t, int64_t>& p) {
    const size_t e = static_cast<size_t>(p.first * v.cols + p.second);
    return std::abs(v.a[e] - v.n[e]);
  };
  const size_t shown = std::min<size_t>(3, worst.size());
  std::partial_sort(worst.begin(), worst.begin() + static_cast<std::ptrdiff_t>(shown), worst.end(),
                    [&](const auto& p, const auto& q) { return err(p) > err(q); });
  std::vector<std::string> entries;
  for (size_t i = 0; i < shown; ++i) {
    const size_t e = static_cast<size_t>(worst[i].first * v.cols + worst[i].second);
    entries.push_back(fmt::format("{} (analytic {:.4g}, numeric {:.4g})",
                                  element_str(v, worst[i].first, worst[i].second), v.a[e], v.n[e]));
  }
  return {Finding::unexplained, v.input, v.check,
          fmt::format("none of the known kinds fits the {} failing elements (of {}); the error concentrates in {}; "
                      "the largest: {}",
                      bad.size(), v.m * v.cols, fmt::join(where, "; "), fmt::join(entries, ", "))};
}

}  // namespace tapegrad::gradcheck_detail

namespace tapegrad {

FindingSheet unexplained_finding() {
  return {
      .kind = Finding::unexplained,
      .title = "no known kind",
      .meaning = "none of the kinds fits: where the error concentrates (rows, columns, entries)",
      .found_by =
          "unexplained() in this file, which `checker/gradcheck.cpp` calls when no pass names a failure; "
          "`checker/diagnose_narrowed.cpp` for checks by projections",
      .section = "docs/gradchecking.md#no-known-kind",
      .before_a_named_slip = BeforeANamedSlip::replaced,
  };
}

}  // namespace tapegrad
