// Errors confined to a structured set of the Jacobian's entries, whatever the op: a triangle (a causal mask), a
// band, a band's edge or what lies outside it (a window), or a set of indices along one axis (rows, columns,
// positions). The sets compare an index of y with one of x (query i against key j), or two indices of one tensor.
#include <algorithm>
#include <functional>

#include <fmt/ranges.h>

#include "checker/jacobian.hpp"

namespace tapegrad::gradcheck_detail {

namespace {

// One axis of y or of x, with the index each element has along it.
struct Axis {
  std::string name;  // "y axis 1", "k axis 2"
  int64_t size;
  std::vector<int64_t> index;  // per flat element of that tensor
  bool on_x;
};

std::vector<Axis> axes_of(const JacobianView& v) {
  std::vector<Axis> out;
  for (bool on_x : {false, true}) {
    const Shape& s = on_x ? v.xshape : v.yshape;
    const int64_t n = on_x ? v.cols : v.m;
    for (int d = 0; d < s.rank(); ++d) {
      Axis a{fmt::format("{} axis {}", on_x ? v.input : v.y_name, d), s[d], std::vector<int64_t>(size_t(n)), on_x};
      for (int64_t e = 0; e < n; ++e) a.index[size_t(e)] = unravel(s, e)[size_t(d)];
      out.push_back(std::move(a));
    }
  }
  return out;
}

struct Candidate {
  std::string text;
  std::function<bool(int64_t, int64_t)> in;  // (j, k) in the set
};

}  // namespace

std::optional<std::string> structured_set(const JacobianView& v, const Elements& bad, double zero_tol) {
  const auto axes = axes_of(v);
  auto at = [&](const Axis& a, int64_t j, int64_t k) { return a.index[size_t(a.on_x ? k : j)]; };
  std::vector<Candidate> cands;
  // Relations between two axes of equal size (at least 3): i on the first, j on the second.
  for (size_t p = 0; p < axes.size(); ++p)
    for (size_t q = p + 1; q < axes.size(); ++q) {
      const Axis &A = axes[p], &B = axes[q];
      if (A.size != B.size || A.size < 3) continue;
      const std::string pair = fmt::format("j of {} against i of {}", B.name, A.name);
      auto rel = [&, pa = &A, pb = &B](std::string text, std::function<bool(int64_t, int64_t)> r) {
        cands.push_back({fmt::format("{} ({})", text, pair),
                         [=, &at](int64_t j, int64_t k) { return r(at(*pa, j, k), at(*pb, j, k)); }});
      };
      // Most specific first: of two sets that fit as tightly, the first is named.
      rel("the diagonal j = i", [](int64_t i, int64_t j) { return j == i; });
      for (int64_t w = 1; w < A.size; ++w) {
        rel(fmt::format("the line j − i = {} (one diagonal: a mask or window boundary off by one)", w),
            [w](int64_t i, int64_t j) { return j - i == w; });
        rel(fmt::format("the line j − i = −{} (one diagonal: a mask or window boundary off by one)", w),
            [w](int64_t i, int64_t j) { return i - j == w; });
        rel(fmt::format("the band edge |j − i| = {} (a window's width off by one)", w),
            [w](int64_t i, int64_t j) { return std::abs(j - i) == w; });
      }
      rel("the triangle j > i (a causal mask: the entries after the diagonal)",
          [](int64_t i, int64_t j) { return j > i; });
      rel("the triangle j < i (the entries before the diagonal)", [](int64_t i, int64_t j) { return j < i; });
      rel("the triangle j ≥ i", [](int64_t i, int64_t j) { return j >= i; });
      rel("the triangle j ≤ i", [](int64_t i, int64_t j) { return j <= i; });
      for (int64_t w = 1; w < A.size - 1; ++w) {
        rel(fmt::format("the band |j − i| ≤ {} (a local window)", w),
            [w](int64_t i, int64_t j) { return std::abs(j - i) <= w; });
        rel(fmt::format("the entries outside the band |j − i| ≤ {} (beyond a local window)", w),
            [w](int64_t i, int64_t j) { return std::abs(j - i) > w; });
      }
    }
  // A set of indices along one axis: at most half of them.
  for (const Axis& A : axes) {
    if (A.size < 3) continue;
    std::vector<int64_t> set;
    for (auto [j, k] : bad) set.push_back(at(A, j, k));
    std::sort(set.begin(), set.end());
    set.erase(std::unique(set.begin(), set.end()), set.end());
    if (set.size() < 2 || 2 * static_cast<int64_t>(set.size()) > A.size) continue;  // one index: one_row says it
    cands.push_back({fmt::format("the indices {{{}}} of {} (of {})", fmt::join(set, ", "), A.name, A.size),
                     [&, set, pa = &A](int64_t j, int64_t k) {
                       return std::binary_search(set.begin(), set.end(), at(*pa, j, k));
                     }});
  }
  // The tightest set that holds every failing element, is at least half failing where either Jacobian is nonzero,
  // and leaves nonzero entries outside.
  std::optional<std::string> best;
  int64_t best_size = 0;
  for (const auto& c : cands) {
    if (!confined(v, bad, c.in)) continue;
    int64_t size = 0;
    for (int64_t j = 0; j < v.m; ++j)
      for (int64_t k = 0; k < v.cols; ++k) {
        const size_t e = size_t(j * v.cols + k);
        size += c.in(j, k) && (std::abs(v.n[e]) > zero_tol || v.a[e] != 0);
      }
    if (2 * static_cast<int64_t>(bad.size()) < size) continue;
    if (!best || size < best_size) best = c.text, best_size = size;
  }
  return best;
}

}  // namespace tapegrad::gradcheck_detail
