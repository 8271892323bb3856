// The per-row term: in each row r (the last axis of y and of x; both with R rows) the error block
// E_r = A_r − N_r, (y cols, x cols), is one outer product α_r·u vᵀ. The vectors are named when they are (up to
// scale) 1, y_r or x_r, or a combination of two of them, in every row.
#include <algorithm>

#include <fmt/format.h>

#include "engine/gradcheck/jacobian.hpp"

namespace tapegrad::gradcheck_detail {

namespace {

// A vector a row's error could be built from, by the name a reader knows it by.
struct Candidate {
  std::string name;
  std::vector<double> vec;
};

// The candidate vectors of row r for u (over y's row) or v (over x's row): 1, x_r and y_r where they have that
// length.
std::vector<Candidate> candidates(const JacobianView& v, int64_t rows, int64_t r, int64_t len) {
  std::vector<Candidate> c;
  c.push_back({"1", std::vector<double>(static_cast<size_t>(len), 1.0)});
  if (v.x.numel() == rows * len) {
    std::vector<double> xr(static_cast<size_t>(len));
    for (int64_t t = 0; t < len; ++t) xr[static_cast<size_t>(t)] = v.x.item(r * len + t);
    c.push_back({"x_r", std::move(xr)});
  }
  if (v.y.numel() == rows * len)
    c.push_back({"y_r", std::vector<double>(v.y0.begin() + r * len, v.y0.begin() + (r + 1) * len)});
  return c;
}

// The leading singular pair of a (rows, cols) block by power iteration, w ← EᵀE w: E ≈ σ·u wᵀ with unit u and w.
// Returns σ (0 for a zero block).
double leading_singular_pair(const std::vector<double>& block, int64_t yc, int64_t xc, std::vector<double>& u,
                             std::vector<double>& w) {
  w.assign(static_cast<size_t>(xc), 1.0);
  u.assign(static_cast<size_t>(yc), 0.0);
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

// The candidates parallel to the unit vector; else the combinations c₂ + ρ·c₁ of two of them (as y_r − 1),
// which join the candidates under that name.
std::vector<std::string> fitting(std::vector<Candidate>& cs, const std::vector<double>& unit) {
  std::vector<std::string> names;
  for (const auto& c : cs) {
    const double cn = std::sqrt(dot(c.vec, c.vec));
    if (cn > 0 && std::abs(dot(c.vec, unit)) / cn >= 0.999) names.push_back(c.name);
  }
  if (!names.empty()) return names;
  const size_t singles = cs.size();
  for (size_t p = 0; p < singles; ++p)
    for (size_t q = p + 1; q < singles; ++q) {
      const auto &c1 = cs[p].vec, &c2 = cs[q].vec;
      const double g11 = dot(c1, c1), g12 = dot(c1, c2), g22 = dot(c2, c2), det = g11 * g22 - g12 * g12;
      if (!(det > 1e-9 * g11 * g22)) continue;  // parallel: nothing a single one would not say
      const double b1 = dot(c1, unit), b2 = dot(c2, unit);
      const double a1 = (g22 * b1 - g12 * b2) / det, a2 = (g11 * b2 - g12 * b1) / det;
      std::vector<double> fit(unit.size());
      for (size_t e = 0; e < fit.size(); ++e) fit[e] = a1 * c1[e] + a2 * c2[e];
      double res = 0;
      for (size_t e = 0; e < fit.size(); ++e) res += (unit[e] - fit[e]) * (unit[e] - fit[e]);
      if (res > 0.002 || std::abs(a2) < 1e-9 || std::abs(a1) < 1e-9) continue;
      const double rho = a1 / a2;
      std::string name = fmt::format("({} {} {}{})", cs[q].name, rho < 0 ? "−" : "+",
                                     std::abs(std::abs(rho) - 1) < 1e-4 ? "" : fmt::format("{:.4g}·", std::abs(rho)),
                                     cs[p].name);
      std::vector<double> vec(c2);
      for (size_t e = 0; e < vec.size(); ++e) vec[e] += rho * c1[e];
      cs.push_back({"", std::move(vec)});
      cs.back().name = name;
      names.push_back(std::move(name));
    }
  return names;
}

std::vector<double> vector_named(const std::vector<Candidate>& cs, const std::string& name) {
  for (const auto& c : cs)
    if (name == c.name) return c.vec;
  return {};
}

}  // namespace

std::optional<Diagnosis> per_row_term(const JacobianView& v, const Elements& bad) {
  if (v.yshape.rank() == 0 || v.xshape.rank() == 0) return std::nullopt;
  const int64_t yc = v.yshape.back(), xc = v.xshape.back();
  if (yc < 2 || xc < 2 || v.m / yc != v.cols / xc) return std::nullopt;
  const int64_t rows = v.m / yc;
  for (auto [j, k] : bad)
    if (j / yc != k / xc) return std::nullopt;  // errors across rows: not a per-row term
  std::vector<std::string> u_names, v_names;  // the names that fit every row so far
  bool first = true;
  double alpha_min = INFINITY, alpha_max = -INFINITY;
  int rows_with_error = 0;
  std::vector<double> block(static_cast<size_t>(yc * xc)), u, w;
  for (int64_t r = 0; r < rows; ++r) {
    bool any = false;
    for (int64_t a = 0; a < yc; ++a)
      for (int64_t b = 0; b < xc; ++b) {
        const size_t e = static_cast<size_t>((r * yc + a) * v.cols + r * xc + b);
        block[static_cast<size_t>(a * xc + b)] = v.a[e] - v.n[e];
        any = any || !v.tol.ok(v.a[e], v.n[e]);
      }
    if (!any) continue;
    ++rows_with_error;
    const double sigma = leading_singular_pair(block, yc, xc, u, w);
    if (!(sigma > 0)) return std::nullopt;
    // An error in one column or one row of the block is one element's business, not a per-row term.
    auto concentrated = [](const std::vector<double>& unit) {
      return std::any_of(unit.begin(), unit.end(), [](double e) { return std::abs(e) >= 0.999; });
    };
    if (concentrated(u) || concentrated(w)) return std::nullopt;
    // E_r = σ·u wᵀ to the tolerance: A ≈ N + σ·u wᵀ element by element.
    for (int64_t a = 0; a < yc; ++a)
      for (int64_t b = 0; b < xc; ++b) {
        const size_t e = static_cast<size_t>((r * yc + a) * v.cols + r * xc + b);
        if (!v.tol.ok(v.a[e], v.n[e] + sigma * u[static_cast<size_t>(a)] * w[static_cast<size_t>(b)]))
          return std::nullopt;
      }
    auto keep = [&](std::vector<std::string>& acc, const std::vector<std::string>& now) {
      if (first) acc = now;
      else std::erase_if(acc, [&](const std::string& s) { return std::find(now.begin(), now.end(), s) == now.end(); });
    };
    auto cu = candidates(v, rows, r, yc), cv = candidates(v, rows, r, xc);
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
  if (rows_with_error == 0) return std::nullopt;
  const bool is_vjp = v.check == "vjp";
  std::string uname = u_names.empty() ? "u_r" : u_names[0], vname = v_names.empty() ? "v_r" : v_names[0];
  std::string term = is_vjp ? fmt::format("⟨{}, ȳ_r⟩·{}", uname, vname) : fmt::format("⟨{}, ẋ_r⟩·{}", vname, uname);
  std::string alpha;
  if (!u_names.empty() && !v_names.empty())
    alpha = std::abs(alpha_max - alpha_min) <= 1e-6 * std::max(1.0, std::abs(alpha_max))
                ? fmt::format(" with α = {:.6g} in every row", alpha_max)
                : fmt::format(" with α_r from {:.6g} to {:.6g}", alpha_min, alpha_max);
  return Diagnosis{
      Finding::per_row_term, v.input, v.check,
      fmt::format("in each of {} row{} the error is one outer product α_r·{}·{}ᵀ{}: {} is off by α_r·{} — a "
                  "per-row term (a normalizer, a mean, a row sum) is missing or wrong",
                  rows_with_error, rows_with_error == 1 ? "" : "s", uname, vname, alpha, is_vjp ? "x̄_r" : "ẏ_r",
                  term)};
}

}  // namespace tapegrad::gradcheck_detail
