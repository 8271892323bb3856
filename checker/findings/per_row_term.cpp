// The per-row term: in each row r of y and of x (the slices along one axis, the last or another both share) the
// error block E_r = A_r − N_r, (y's row length, x's row length), is one outer product α_r·u vᵀ, whatever u and v
// are: a missing or wrong mean, normalizer or row sum. The vectors are named when they are (up to scale) 1, y_r or
// x_r, or a combination of two of them, in every row; else 1_S when they are constant on a subset S_r of each row
// and zero on the rest (a mean over a mask's entries, or over the entries the forward selects). A row whose subset
// has one entry has its error on one element: such rows count when other rows' error is spread.
#include <algorithm>

#include <fmt/format.h>

#include "checker/finding_sheet.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad::gradcheck_detail {

namespace {

// A vector a row's error could be built from, by the name a reader knows it by.
struct Candidate {
  std::string name;
  std::vector<double> vec;
};

// How y and x split into rows along one axis: row r of y is the elements y_flat[r·yc .. (r+1)·yc), likewise x.
struct RowLayout {
  int axis = -1;    // of y and x; -1: the last axis of each (their ranks may differ)
  int x_axis = -1;  // of x: `axis`, or another (a transposed row: y's along one axis, x's along another)
  int64_t rows = 0, yc = 0, xc = 0;
  std::vector<int64_t> y_flat, x_flat;  // (rows, yc), (rows, xc): flat indices in row order
  std::vector<int64_t> y_row, x_row;    // the row of each flat index
};

// The rows along `axis` of y and of x (-1: the last axis of each), or along y's `axis` and x's `x_axis` where the
// other axes of y and x are the same in order (softmax(xᵀ): y's rows are x's columns); nothing when y and x do not share
// that many rows.
std::optional<RowLayout> row_layout(const JacobianView& v, int axis, int x_axis = -1) {
  const Shape &ys = v.yshape, &xs = v.xshape;
  if (ys.rank() == 0 || xs.rank() == 0) return std::nullopt;
  RowLayout l;
  l.axis = axis;
  l.x_axis = axis >= 0 && x_axis < 0 ? axis : x_axis;
  auto fill = [&](const Shape& s, int a, int64_t len, std::vector<int64_t>& flat, std::vector<int64_t>& row_of) {
    const int64_t n = s.numel();
    flat.assign(static_cast<size_t>(n), 0);
    row_of.assign(static_cast<size_t>(n), 0);
    for (int64_t e = 0; e < n; ++e) {
      auto idx = unravel(s, e);
      const int64_t pos = idx[static_cast<size_t>(a)];
      idx.erase(idx.begin() + a);
      int64_t r = 0;
      for (int d = 0, k = 0; d < s.rank(); ++d)
        if (d != a) r = r * s[d] + idx[static_cast<size_t>(k++)];
      flat[static_cast<size_t>(r * len + pos)] = e;
      row_of[static_cast<size_t>(e)] = r;
    }
  };
  if (axis < 0) {
    l.yc = ys.back(), l.xc = xs.back();
    if (v.m / l.yc != v.cols / l.xc) return std::nullopt;
    l.rows = v.m / l.yc;
    fill(ys, ys.rank() - 1, l.yc, l.y_flat, l.y_row);
    fill(xs, xs.rank() - 1, l.xc, l.x_flat, l.x_row);
  } else {
    if (ys.rank() != xs.rank() || axis >= ys.rank() || l.x_axis >= xs.rank()) return std::nullopt;
    auto others = [](const Shape& s, int skip) {
      std::vector<int64_t> out;
      for (int d = 0; d < s.rank(); ++d)
        if (d != skip) out.push_back(s[d]);
      return out;
    };
    if (others(ys, axis) != others(xs, l.x_axis)) return std::nullopt;
    l.yc = ys[axis], l.xc = xs[l.x_axis];
    l.rows = v.m / l.yc;
    fill(ys, axis, l.yc, l.y_flat, l.y_row);
    fill(xs, l.x_axis, l.xc, l.x_flat, l.x_row);
  }
  if (l.yc < 2 || l.xc < 2) return std::nullopt;
  return l;
}

// The candidate vectors of row r for u (over y's row, len = yc) or v (over x's row, len = xc): 1, and x_r and y_r
// where their rows have that length.
std::vector<Candidate> candidates(const JacobianView& v, const RowLayout& l, int64_t r, int64_t len) {
  std::vector<Candidate> c;
  c.push_back({"1", std::vector<double>(static_cast<size_t>(len), 1.0)});
  auto row_of = [&](const std::vector<int64_t>& flat, auto&& value) {
    std::vector<double> out(static_cast<size_t>(len));
    for (int64_t t = 0; t < len; ++t) out[static_cast<size_t>(t)] = value(flat[static_cast<size_t>(r * len + t)]);
    return out;
  };
  if (l.xc == len) c.push_back({"x_r", row_of(l.x_flat, [&](int64_t e) { return v.x.item(e); })});
  if (l.yc == len)
    c.push_back({v.y_name + "_r", row_of(l.y_flat, [&](int64_t e) { return v.y0[static_cast<size_t>(e)]; })});
  return c;
}

// The leading singular pair of a (rows, cols) block by power iteration, w ← EᵀE w: E ≈ σ·u wᵀ with unit u and w.
// Returns σ (0 for a zero block).
double leading_singular_pair(const std::vector<double>& block, int64_t yc, int64_t xc, std::vector<double>& u,
                             std::vector<double>& w) {
  w.assign(static_cast<size_t>(xc), 1.0);
  u.assign(static_cast<size_t>(yc), 0.0);
  // The start: all ones, tilted a little (1 + b/100) so that it is not orthogonal to the leading vector by symmetry.
  for (int64_t b = 0; b < xc; ++b) w[static_cast<size_t>(b)] += 0.01 * static_cast<double>(b);
  double sigma = 0;
  for (int it = 0; it < 60; ++it) {
    for (int64_t a = 0; a < yc; ++a) {
      double s = 0;
      for (int64_t b = 0; b < xc; ++b) s += block[static_cast<size_t>(a * xc + b)] * w[static_cast<size_t>(b)];
      u[static_cast<size_t>(a)] = s;
    }
    sigma = std::sqrt(dot(u, u));
    if (!(sigma > 0)) return 0;
    for (double& e : u) e /= sigma;
    for (int64_t b = 0; b < xc; ++b) {
      double s = 0;
      for (int64_t a = 0; a < yc; ++a) s += block[static_cast<size_t>(a * xc + b)] * u[static_cast<size_t>(a)];
      w[static_cast<size_t>(b)] = s;
    }
    const double wn = std::sqrt(dot(w, w));
    for (double& e : w) e /= wn;
  }
  return sigma;
}

// A unit vector within this cosine of a candidate is that candidate (and an error vector with an entry this large
// sits on one element).
constexpr double kParallel = 0.999;
// Two candidates whose Gram determinant is under this part of g₁₁·g₂₂ are parallel; a combination of two is kept
// when the unit vector's squared residual against it is under kCombinationResidual and each weight over
// kNonzeroWeight; its ratio ρ within kUnitRatio of ±1 is written without a factor.
constexpr double kParallelPair = 1e-9, kCombinationResidual = 0.002, kNonzeroWeight = 1e-9, kUnitRatio = 1e-4;
// A vector is constant on its support when its entries there differ by less than this part of its peak, and zero
// elsewhere to the same part.
constexpr double kFlat = 1e-6;

// The candidates parallel to the unit vector; else the combinations c₂ + ρ·c₁ of two of them (as y_r − 1),
// which join the candidates under that name.
std::vector<std::string> fitting(std::vector<Candidate>& cs, const std::vector<double>& unit) {
  std::vector<std::string> names;
  for (const auto& c : cs) {
    const double cn = std::sqrt(dot(c.vec, c.vec));
    if (cn > 0 && std::abs(dot(c.vec, unit)) / cn >= kParallel) names.push_back(c.name);
  }
  if (!names.empty()) return names;
  const size_t singles = cs.size();
  for (size_t p = 0; p < singles; ++p)
    for (size_t q = p + 1; q < singles; ++q) {
      const auto &c1 = cs[p].vec, &c2 = cs[q].vec;
      const double g11 = dot(c1, c1), g12 = dot(c1, c2), g22 = dot(c2, c2), det = g11 * g22 - g12 * g12;
      if (!(det > kParallelPair * g11 * g22)) continue;  // parallel: nothing a single one would not say
      const double b1 = dot(c1, unit), b2 = dot(c2, unit);
      const double a1 = (g22 * b1 - g12 * b2) / det, a2 = (g11 * b2 - g12 * b1) / det;
      std::vector<double> fit(unit.size());
      for (size_t e = 0; e < fit.size(); ++e) fit[e] = a1 * c1[e] + a2 * c2[e];
      double res = 0;
      for (size_t e = 0; e < fit.size(); ++e) res += (unit[e] - fit[e]) * (unit[e] - fit[e]);
      if (res > kCombinationResidual || std::abs(a2) < kNonzeroWeight || std::abs(a1) < kNonzeroWeight) continue;
      const double rho = a1 / a2;
      std::string name = fmt::format(
          "({} {} {}{})", cs[q].name, rho < 0 ? "−" : "+",
          std::abs(std::abs(rho) - 1) < kUnitRatio ? "" : fmt::format("{:.4g}·", std::abs(rho)), cs[p].name);
      std::vector<double> vec(c2);
      for (size_t e = 0; e < vec.size(); ++e) vec[e] += rho * c1[e];
      cs.push_back({"", std::move(vec)});
      cs.back().name = name;
      names.push_back(std::move(name));
    }
  return names;
}

// The indicator of the unit vector's support, when the vector is constant there (to kFlat) and zero elsewhere.
std::optional<std::vector<double>> constant_on_support(const std::vector<double>& unit) {
  double peak = 0;
  for (double e : unit) peak = std::max(peak, std::abs(e));
  std::vector<double> indicator(unit.size(), 0.0);
  double level = 0;
  for (size_t e = 0; e < unit.size(); ++e) {
    if (std::abs(unit[e]) <= kFlat * peak) continue;
    if (level == 0) level = unit[e];
    if (std::abs(unit[e] - level) > kFlat * peak) return std::nullopt;
    indicator[e] = 1;
  }
  return indicator;
}

int64_t support_size(const std::vector<double>& indicator) {
  return static_cast<int64_t>(std::count(indicator.begin(), indicator.end(), 1.0));
}

std::vector<double> vector_named(const std::vector<Candidate>& cs, const std::string& name) {
  for (const auto& c : cs)
    if (name == c.name) return c.vec;
  return {};
}

std::optional<Diagnosis> per_row_term_along(const JacobianView& v, const Elements& bad, const RowLayout& l) {
  const int64_t yc = l.yc, xc = l.xc, rows = l.rows;
  for (auto [j, k] : bad)
    if (l.y_row[static_cast<size_t>(j)] != l.x_row[static_cast<size_t>(k)]) return std::nullopt;  // across rows
  std::vector<std::string> u_names, v_names;  // the names that fit every row so far
  bool first = true;
  double alpha_min = INFINITY, alpha_max = -INFINITY;
  int rows_with_error = 0;
  std::vector<double> block(static_cast<size_t>(yc * xc)), u, w;
  int spread_rows = 0;                             // rows whose error is not on one element
  int64_t subset_min = INT64_MAX, subset_max = 0;  // |S_r| over the rows, where 1_S names u
  for (int64_t r = 0; r < rows; ++r) {
    bool any = false;
    for (int64_t a = 0; a < yc; ++a)
      for (int64_t b = 0; b < xc; ++b) {
        const size_t e = static_cast<size_t>(l.y_flat[static_cast<size_t>(r * yc + a)] * v.cols +
                                             l.x_flat[static_cast<size_t>(r * xc + b)]);
        block[static_cast<size_t>(a * xc + b)] = v.a[e] - v.n[e];
        any = any || !v.tol.ok(v.a[e], v.n[e]);
      }
    if (!any) continue;
    ++rows_with_error;
    const double sigma = leading_singular_pair(block, yc, xc, u, w);
    if (!(sigma > 0)) return std::nullopt;
    // An error in one column or one row of the block is one element's business, not a per-row term, unless other
    // rows' error is spread (checked after the loop).
    auto concentrated = [](const std::vector<double>& unit) {
      return std::any_of(unit.begin(), unit.end(), [](double e) { return std::abs(e) >= kParallel; });
    };
    spread_rows += !(concentrated(u) || concentrated(w));
    // E_r = σ·u wᵀ to the tolerance: A ≈ N + σ·u wᵀ element by element.
    for (int64_t a = 0; a < yc; ++a)
      for (int64_t b = 0; b < xc; ++b) {
        const size_t e = static_cast<size_t>(l.y_flat[static_cast<size_t>(r * yc + a)] * v.cols +
                                             l.x_flat[static_cast<size_t>(r * xc + b)]);
        if (!v.tol.ok(v.a[e], v.n[e] + sigma * u[static_cast<size_t>(a)] * w[static_cast<size_t>(b)]))
          return std::nullopt;
      }
    auto keep = [&](std::vector<std::string>& acc, const std::vector<std::string>& now) {
      if (first) acc = now;
      else std::erase_if(acc, [&](const std::string& s) { return std::find(now.begin(), now.end(), s) == now.end(); });
    };
    auto cu = candidates(v, l, r, yc), cv = candidates(v, l, r, xc);
    // The subset's indicator joins the candidates after 1, x_r and y_r (so that "1" names a whole row first).
    const auto su = constant_on_support(u), sv = constant_on_support(w);
    if (su && sv) {
      cu.push_back({"1_S", *su});
      cv.push_back({"1_S", *sv});
      subset_min = std::min(subset_min, support_size(*su));
      subset_max = std::max(subset_max, support_size(*su));
    }
    keep(u_names, fitting(cu, u));
    keep(v_names, fitting(cv, w));
    // α_r against the first named pair of this row: E_r = α_r·cu cvᵀ.
    if (!u_names.empty() && !v_names.empty()) {
      const auto p = vector_named(cu, u_names[0]), q = vector_named(cv, v_names[0]);
      double num = 0;
      for (int64_t a = 0; a < yc; ++a)
        for (int64_t b = 0; b < xc; ++b)
          num += block[static_cast<size_t>(a * xc + b)] * p[static_cast<size_t>(a)] * q[static_cast<size_t>(b)];
      const double alpha = num / (dot(p, p) * dot(q, q));
      alpha_min = std::min(alpha_min, alpha);
      alpha_max = std::max(alpha_max, alpha);
    }
    first = false;
  }
  if (rows_with_error == 0 || spread_rows == 0) return std::nullopt;
  const bool is_vjp = v.check == "vjp";
  std::string uname = u_names.empty() ? "u_r" : u_names[0], vname = v_names.empty() ? "v_r" : v_names[0];
  std::string term = is_vjp ? fmt::format("⟨{}, ȳ_r⟩·{}", uname, vname) : fmt::format("⟨{}, ẋ_r⟩·{}", vname, uname);
  std::string alpha;
  if (!u_names.empty() && !v_names.empty())
    alpha = std::abs(alpha_max - alpha_min) <= kSameFactor * std::max(1.0, std::abs(alpha_max))
                ? fmt::format(" with α = {:.6g} in every row", alpha_max)
                : fmt::format(" with α_r from {:.6g} to {:.6g}", alpha_min, alpha_max);
  const bool subset = uname == "1_S" && vname == "1_S";
  const std::string what =
      subset ? fmt::format(
                   " — 1_S is the indicator of a subset S_r of row r (constant on {} of its {} entries, zero "
                   "on the others{}): a term over a subset of each row (a mean over a mask's entries, or "
                   "over the entries the forward selects) is missing or wrong",
                   subset_min == subset_max ? fmt::format("{}", subset_min)
                                            : fmt::format("{} to {}", subset_min, subset_max),
                   xc, subset_min == 1 ? "; in rows where S_r has one entry the error is that element" : "")
             : std::string(" — a per-row term (a normalizer, a mean, a row sum) is missing or wrong");
  Diagnosis found{
      Finding::per_row_term, v.input, v.check,
      fmt::format("in each of {} row{}{} the error is one outer product α_r·{}·{}ᵀ{}: {} is off by α_r·{}{}",
                  rows_with_error, rows_with_error == 1 ? "" : "s",
                  l.axis < 0           ? std::string()
                  : l.x_axis == l.axis ? fmt::format(" (the slices of y and {} along axis {})", v.input, l.axis)
                                       : fmt::format(" (the slices of y along axis {} and of {} along axis {})", l.axis,
                                                     v.input, l.x_axis),
                  uname, vname, alpha,
                  is_vjp             ? "x̄_r"
                  : v.check == "hvp" ? "ẋ̄_r"
                                     : "ẏ_r",
                  term, what)};
  found.unnamed = u_names.empty() || v_names.empty();
  return found;
}

// The rows along the last axis first, then along each other axis y and x share, then along one axis of y and
// another of x (a row of y that is a column of x).
std::optional<Diagnosis> per_row_term(const JacobianView& v, const Elements& bad) {
  if (auto l = row_layout(v, -1))
    if (auto d = per_row_term_along(v, bad, *l)) return d;
  for (int axis = v.yshape.rank() - 2; axis >= 0; --axis)
    if (auto l = row_layout(v, axis))
      if (auto d = per_row_term_along(v, bad, *l)) return d;
  for (int axis = v.yshape.rank() - 1; axis >= 0; --axis)
    for (int x_axis = v.xshape.rank() - 1; x_axis >= 0; --x_axis)
      if (x_axis != axis)
        if (auto l = row_layout(v, axis, x_axis))
          if (auto d = per_row_term_along(v, bad, *l)) return d;
  return std::nullopt;
}

// In each row the error is one outer product α_r·u·vᵀ: what shape the error has. The last pass.
bool one_outer_product_per_row(JacobianSearch& s) { return add_found(s, per_row_term(s.v, s.bad), false); }

}  // namespace

}  // namespace tapegrad::gradcheck_detail

namespace tapegrad {

FindingSheet per_row_term_finding() {
  return {
      .kind = Finding::per_row_term,
      .title = "per-row term",
      .meaning =
          "in each row (along the last axis or another) the error is one outer product: a per-row term "
          "(normalizer, mean, row sum) wrong",
      .found_by = "its pass over a failing full Jacobian, in this file",
      .section = "docs/gradchecking.md#per-row-term",
      .passes = {{120, gradcheck_detail::one_outer_product_per_row}},
      .before_a_named_slip = BeforeANamedSlip::follows,
  };
}

}  // namespace tapegrad
