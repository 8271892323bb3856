// The per-row factor: each row of y (or of x), along any axis, is off by a factor of its own, A_r = c_r·N_r, with
// the c_r not all equal (all equal is a scale). It is what a per-row normalizer forgotten or wrong leaves: a row's
// sum, norm or count divided by once too often, or not at all. The rows of y are taken whole, over every column of
// x, so the kind is found whichever axis of x y's rows come from (y's rows may be x's columns). The factors are then
// reciprocal of one of them in every row, the report names it.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "checker/finding_sheet.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad::gradcheck_detail {

namespace {

// The fibre index of every flat element of a tensor of `shape` along `axis`: elements that differ only in their
// index on `axis` share a fibre. Returns the count of fibres.
int64_t fibres(const Shape& shape, int axis, std::vector<int64_t>& fibre_of) {
  const int64_t n = shape.numel();
  fibre_of.assign(static_cast<size_t>(n), 0);
  int64_t count = 0;
  for (int64_t e = 0; e < n; ++e) {
    auto idx = unravel(shape, e);
    idx[static_cast<size_t>(axis)] = 0;
    const int64_t f = ravel(shape, idx);
    fibre_of[static_cast<size_t>(e)] = f;
    count = std::max(count, f + 1);
  }
  return count;
}

// Per-fibre sums of a tensor's values, and of their squares (for norms).
struct FibreStats {
  std::vector<double> sum, norm;
};
FibreStats stats(std::span<const double> values, const std::vector<int64_t>& fibre_of, int64_t count) {
  FibreStats s{std::vector<double>(static_cast<size_t>(count)), std::vector<double>(static_cast<size_t>(count))};
  for (size_t e = 0; e < values.size(); ++e) {
    s.sum[static_cast<size_t>(fibre_of[e])] += values[e];
    s.norm[static_cast<size_t>(fibre_of[e])] += values[e] * values[e];
  }
  for (double& q : s.norm) q = std::sqrt(q);
  return s;
}

// The name of the row statistic the factors are proportional to (c_r = κ·s_r or κ/s_r in every used row), if any.
std::string matching_statistic(const std::vector<double>& c, const std::vector<bool>& used,
                               const std::vector<std::pair<std::string, std::vector<double>>>& candidates) {
  for (const auto& [name, s] : candidates)
    for (bool reciprocal : {false, true}) {
      double kappa = NAN;
      bool all = true;
      for (size_t r = 0; r < c.size() && all; ++r) {
        if (!used[r]) continue;
        const double v = reciprocal ? 1 / s[r] : s[r];
        if (!std::isfinite(v) || v == 0) {
          all = false;
          break;
        }
        const double k = c[r] / v;
        if (std::isnan(kappa)) kappa = k;
        all = std::abs(k - kappa) <= kSameFactor * std::abs(kappa);
      }
      if (all && !std::isnan(kappa))
        return std::abs(kappa - 1) <= kSameFactor
                   ? (reciprocal ? "1/" + name : name)
                   : fmt::format("{} × {}", describe_factor(kappa), reciprocal ? "1/" + name : name);
    }
  return "";
}

std::optional<Diagnosis> per_row_factor(const JacobianView& v) {
  const std::string rows_of_y = v.y_name;
  for (bool by_y : {true, false}) {
    const Shape& shape = by_y ? v.yshape : v.xshape;
    for (int axis = shape.rank() - 1; axis >= 0; --axis) {
      if (shape[axis] < 2) continue;
      std::vector<int64_t> fibre_of;
      const int64_t count = fibres(shape, axis, fibre_of);
      if (count < 2) continue;
      // c_r by least squares over the row's entries; the row fits when every entry passes against c_r·N.
      std::vector<double> an(static_cast<size_t>(count)), nn(static_cast<size_t>(count));
      for (int64_t j = 0; j < v.m; ++j)
        for (int64_t k = 0; k < v.cols; ++k) {
          const size_t e = static_cast<size_t>(j * v.cols + k);
          const size_t r = static_cast<size_t>(fibre_of[static_cast<size_t>(by_y ? j : k)]);
          an[r] += v.a[e] * v.n[e];
          nn[r] += v.n[e] * v.n[e];
        }
      std::vector<double> c(static_cast<size_t>(count), 1.0);
      std::vector<bool> used(static_cast<size_t>(count), false);
      for (size_t r = 0; r < c.size(); ++r)
        if (nn[r] > 0) c[r] = an[r] / nn[r], used[r] = true;
      bool fits = true;
      for (int64_t j = 0; j < v.m && fits; ++j)
        for (int64_t k = 0; k < v.cols && fits; ++k) {
          const size_t e = static_cast<size_t>(j * v.cols + k);
          const double cr = c[static_cast<size_t>(fibre_of[static_cast<size_t>(by_y ? j : k)])];
          fits = v.tol.ok(v.a[e], cr * v.n[e]);
        }
      if (!fits) continue;
      double lo = INFINITY, hi = -INFINITY;
      int off = 0, used_rows = 0;
      for (size_t r = 0; r < c.size(); ++r) {
        if (!used[r]) continue;
        ++used_rows;
        lo = std::min(lo, c[r]), hi = std::max(hi, c[r]);
        off += std::abs(c[r] - 1) > kSameFactor;
      }
      // Factors all equal are a scale (named elsewhere); one row off is "one row".
      if (used_rows < 2 || off < 2 || hi - lo <= kSameFactor * std::max(std::abs(hi), std::abs(lo))) continue;
      // What the factors are, in the rows' own numbers (those of the side whose rows they are).
      std::vector<std::pair<std::string, std::vector<double>>> candidates;
      if (by_y) {
        const FibreStats ys = stats(v.y0, fibre_of, count);
        candidates.push_back({"‖" + rows_of_y + "_r‖", ys.norm});
        candidates.push_back({"Σ" + rows_of_y + "_r", ys.sum});
      }
      if (!by_y || v.xshape == v.yshape) {  // x's fibres along the axis are then fibre_of too
        const FibreStats xs =
            stats(std::span<const double>(v.x.data<double>(), static_cast<size_t>(v.cols)), fibre_of, count);
        std::vector<double> one_plus(xs.norm);
        for (double& q : one_plus) q += 1;
        candidates.push_back({"‖" + v.input + "_r‖", xs.norm});
        candidates.push_back({"(1 + ‖" + v.input + "_r‖)", one_plus});
        candidates.push_back({"Σ" + v.input + "_r", xs.sum});
      }
      const std::string what = matching_statistic(c, used, candidates);
      const std::string which = by_y ? rows_of_y : v.input;
      const std::string along = axis == shape.rank() - 1 ? "along its last axis" : fmt::format("along axis {}", axis);
      return Diagnosis{
          Finding::per_row_factor, v.input, v.check,
          fmt::format("each row of {} ({}) is off by a factor of its own: analytic = c_r × numeric in every row, c_r "
                      "from {:.4g} to {:.4g}{}: a per-row normalizer (the row's sum, norm or count) is missing, "
                      "applied twice, or the wrong one",
                      which, along, lo, hi, what.empty() ? "" : fmt::format(", and c_r = {} in every row", what))};
    }
  }
  return std::nullopt;
}

// Each row off by its own factor. The search ends.
bool rows_off_by_factors(JacobianSearch& s) { return add_found(s, per_row_factor(s.v), true); }

}  // namespace

}  // namespace tapegrad::gradcheck_detail

namespace tapegrad {

FindingSheet per_row_factor_finding() {
  return {
      .kind = Finding::per_row_factor,
      .title = "per-row factor",
      .meaning = "each row of y or x (along any axis) off by its own factor: a per-row normalizer wrong",
      .found_by = "its pass over a failing full Jacobian, in this file",
      .section = "docs/gradchecking.md#per-row-factor",
      .passes = {{70, gradcheck_detail::rows_off_by_factors}},
  };
}

}  // namespace tapegrad
