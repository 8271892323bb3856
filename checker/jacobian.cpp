#include "checker/jacobian.hpp"

#include <algorithm>

#include <fmt/ranges.h>

namespace tapegrad::gradcheck_detail {

std::vector<int64_t> unravel(const Shape& s, int64_t flat) {
  std::vector<int64_t> idx(static_cast<size_t>(s.rank()));
  for (int d = s.rank() - 1; d >= 0; --d) {
    idx[static_cast<size_t>(d)] = flat % s[d];
    flat /= s[d];
  }
  return idx;
}

int64_t ravel(const Shape& s, const std::vector<int64_t>& idx) {
  int64_t flat = 0;
  for (int d = 0; d < s.rank(); ++d) flat = flat * s[d] + idx[static_cast<size_t>(d)];
  return flat;
}

std::string index_str(const Shape& s, int64_t flat) { return fmt::format("[{}]", fmt::join(unravel(s, flat), ", ")); }

double dot(std::span<const double> a, std::span<const double> b) {
  double s = 0;
  for (size_t k = 0; k < a.size(); ++k) s += a[k] * b[k];
  return s;
}

std::string row_name(const Shape& s, const std::string& name, int64_t row) {
  auto idx = unravel(s, row * s.back());
  idx.pop_back();
  return fmt::format("{}[{}{}:]", name, fmt::join(idx, ", "), idx.empty() ? "" : ", ");
}

// c as a reader would recognize it: 0.5 = 1/2, 0.353553 = 1/√8, 2.82843 = √8.
std::string describe_factor(double c) {
  std::string s = fmt::format("{:.6g}", c);
  const double a = std::abs(c);
  const char* sign = c < 0 ? "−" : "";
  auto near = [](double v, double k) { return std::abs(v - k) <= kSameFactor * k; };
  for (int k = 2; k <= 1024; ++k) {
    const double kk = k;
    const double root = std::sqrt(kk);
    if (near(a, kk)) return s;
    if (near(1 / a, kk)) return fmt::format("{} = {}1/{}", s, sign, k);
    if (root != std::floor(root) && near(a * a, kk)) return fmt::format("{} = {}√{}", s, sign, k);
    if (root != std::floor(root) && near(1 / (a * a), kk)) return fmt::format("{} = {}1/√{}", s, sign, k);
  }
  return s;
}

// The least-squares c in A ≈ c·N[map], kept when every element passes against c·N[map].
std::optional<double> common_factor(std::span<const double> a, std::span<const double> n, std::span<const int64_t> map,
                                    Tolerance tol) {
  double an = 0, nn = 0;
  for (size_t e = 0; e < a.size(); ++e) {
    const double ref = n[map.empty() ? e : static_cast<size_t>(map[e])];
    an += a[e] * ref;
    nn += ref * ref;
  }
  if (!(nn > 0) || !std::isfinite(an)) return std::nullopt;
  const double c = an / nn;
  // A = c·N to the tolerance, on N's scale or on A's: the noise the tolerance allows for scales with c where it is
  // in what c multiplies (a rounded computation scaled by c, or N's own differences seen through c·N).
  for (size_t e = 0; e < a.size(); ++e) {
    const double ref = n[map.empty() ? e : static_cast<size_t>(map[e])];
    if (!tol.ok(a[e], c * ref) && !(c != 0 && tol.ok(a[e] / c, ref))) return std::nullopt;
  }
  return c;
}

// The failing elements as (j, k) pairs.
std::vector<std::pair<int64_t, int64_t>> failing_elements(const JacobianView& v) {
  std::vector<std::pair<int64_t, int64_t>> bad;
  for (int64_t j = 0; j < v.m; ++j)
    for (int64_t k = 0; k < v.cols; ++k) {
      const size_t e = static_cast<size_t>(j * v.cols + k);
      if (!v.tol.ok(v.a[e], v.n[e])) bad.emplace_back(j, k);
    }
  return bad;
}

std::string element_str(const JacobianView& v, int64_t j, int64_t k) {
  return fmt::format("{}{} / {}{}", v.y_name, index_str(v.yshape, j), v.input, index_str(v.xshape, k));
}

std::string examples_str(const JacobianView& v, const std::vector<std::pair<int64_t, int64_t>>& bad) {
  std::string s = element_str(v, bad[0].first, bad[0].second);
  if (bad.size() > 1) s += fmt::format(" and {} more", bad.size() - 1);
  return s;
}

// One-sided differences (f(x+εe_k) − f(x))/ε and (f(x) − f(x−εe_k))/ε at (j, k): at a kink within ε of x_k they
// are two different slopes, the central difference is their mean, and a rule that gives one of them is off by half
// the gap. On a smooth f the gap is O(ε·f″), far above the error of a right rule and far below that of a wrong one.
bool kink_explains(double a, double n, double forward, double backward, Tolerance tol, double tolerances) {
  const double gap = std::abs(forward - backward), err = std::abs(a - n);
  return gap > tolerances * (tol.atol + tol.rtol * std::abs(n)) && gap >= 0.9 * err && gap <= 4 * err;
}
bool kink_at(const JacobianView& v, int64_t j, int64_t k, double* forward, double* backward) {
  const size_t e = static_cast<size_t>(j * v.cols + k);
  *forward = (v.plus[e] - v.y0[static_cast<size_t>(j)]) / v.eps;
  *backward = (v.y0[static_cast<size_t>(j)] - v.minus[e]) / v.eps;
  return kink_explains(v.a[e], v.n[e], *forward, *backward, v.tol);
}

double JacobianSearch::zero_tol() const {
  return kZeroOfN * std::max(1.0, *std::max_element(v.n.begin(), v.n.end(),
                                                    [](double p, double q) { return std::abs(p) < std::abs(q); }));
}

const std::optional<std::string>& JacobianSearch::structure() {
  if (!structure_) structure_ = structured_set(v, bad, zero_tol());
  return *structure_;
}

const std::optional<double>& JacobianSearch::whole_factor() {
  if (!whole_factor_) whole_factor_ = common_factor(v.a, v.n, {}, v.tol);
  return *whole_factor_;
}

bool JacobianSearch::failing_where_n_is_zero() {
  if (!where_n_is_zero_) {
    const double zero = zero_tol();
    where_n_is_zero_ = confined(
        v, bad, [&](int64_t j, int64_t k) { return std::abs(v.n[static_cast<size_t>(j * v.cols + k)]) <= zero; });
  }
  return *where_n_is_zero_;
}

bool JacobianSearch::failing_where_a_is_zero() {
  if (!where_a_is_zero_)
    where_a_is_zero_ =
        confined(v, bad, [&](int64_t j, int64_t k) { return v.a[static_cast<size_t>(j * v.cols + k)] == 0; });
  return *where_a_is_zero_;
}

bool JacobianSearch::found_any(std::initializer_list<Finding> kinds) const {
  return std::any_of(found.begin(), found.end(),
                     [&](const Diagnosis& d) { return std::find(kinds.begin(), kinds.end(), d.kind) != kinds.end(); });
}

namespace {

// Index map (j, k) → (j, k with x's axes p and q swapped), or (j with y's axes swapped, k).
std::vector<int64_t> swap_map(const JacobianView& v, bool on_x, int p, int q) {
  std::vector<int64_t> map(static_cast<size_t>(v.m * v.cols));
  const Shape& s = on_x ? v.xshape : v.yshape;
  const int64_t len = on_x ? v.cols : v.m;
  std::vector<int64_t> swapped(static_cast<size_t>(len));
  for (int64_t e = 0; e < len; ++e) {
    auto idx = unravel(s, e);
    std::swap(idx[static_cast<size_t>(p)], idx[static_cast<size_t>(q)]);
    swapped[static_cast<size_t>(e)] = ravel(s, idx);
  }
  for (int64_t j = 0; j < v.m; ++j)
    for (int64_t k = 0; k < v.cols; ++k)
      map[static_cast<size_t>(j * v.cols + k)] =
          on_x ? j * v.cols + swapped[static_cast<size_t>(k)] : swapped[static_cast<size_t>(j)] * v.cols + k;
  return map;
}

}  // namespace

std::optional<SwappedAxes> swapped_axes(const JacobianView& v, bool on_x) {
  const Shape& shape = on_x ? v.xshape : v.yshape;
  for (int p = 0; p < shape.rank(); ++p)
    for (int q = p + 1; q < shape.rank(); ++q) {
      if (shape[p] != shape[q] || shape[p] < 2) continue;
      if (const auto c = common_factor(v.a, v.n, swap_map(v, on_x, p, q), v.tol)) return SwappedAxes{p, q, *c};
    }
  return std::nullopt;
}

bool add_found(JacobianSearch& s, std::optional<Diagnosis> d, bool ends_search) {
  if (!d) return false;
  s.found.push_back(std::move(*d));
  return ends_search;
}

std::string and_a_factor(double c) {
  return std::abs(c - 1) <= kSameFactor ? "" : fmt::format(" (and a factor {})", describe_factor(c));
}

}  // namespace tapegrad::gradcheck_detail
