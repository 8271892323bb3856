#include "engine/gradcheck.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <ostream>

#include <fmt/ranges.h>

#include "engine/rng.hpp"

namespace tapegrad {

namespace {

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

// |a − ref| ≤ atol + rtol·|ref|: the element test of every comparison (NaN fails).
struct Tolerance {
  double atol, rtol;
  bool ok(double a, double ref) const { return std::abs(a - ref) <= atol + rtol * std::abs(ref); }
};

// Running maximum of |a − n| over compared elements, and the element closest to failing.
struct ErrorTracker {
  Tolerance tol;
  CheckResult r;
  double worst_ratio = -1;
  template <class Where>
  void add(double a, double n, Where&& where) {
    double err = std::abs(a - n);
    double ratio = err / (tol.atol + tol.rtol * std::abs(n));
    if (!tol.ok(a, n)) r.passed = false;
    r.max_abs_err = std::max(r.max_abs_err, err);
    r.max_rel_err = std::max(r.max_rel_err, err / std::max(std::abs(n), tol.atol));
    if (std::isnan(err)) ratio = INFINITY, r.max_abs_err = r.max_rel_err = NAN;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      r.worst = where();
      r.analytic = a;
      r.numeric = n;
    }
  }
};

Tensor random_like(const Tensor& x, Rng& rng) {
  Tensor t = Tensor::empty(DType::f64, x.shape());
  for (int64_t k = 0; k < t.numel(); ++k) t.data<double>()[k] = rng.normal();
  return t;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t k = 0; k < a.numel(); ++k) s += a.item(k) * b.item(k);
  return s;
}
double norm(const Tensor& a) { return std::sqrt(dot(a, a)); }
double dot(std::span<const double> a, std::span<const double> b) {
  double s = 0;
  for (size_t k = 0; k < a.size(); ++k) s += a[k] * b[k];
  return s;
}

// c as a reader would recognize it: 0.5 = 1/2, 0.353553 = 1/√8, 2.82843 = √8.
std::string describe_factor(double c) {
  std::string s = fmt::format("{:.6g}", c);
  const double a = std::abs(c);
  const char* sign = c < 0 ? "−" : "";
  auto near = [](double v, double k) { return std::abs(v - k) <= 1e-6 * k; };
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

// ---- what a failing Jacobian looks like ----
//
// A (analytic) and N (numeric) are (m, n) row-major: entry (j, k) = ∂y_j/∂x_k, j over y's elements, k over x's.
// The VJP's A has rows J_iᵀe_j, the JVP's A has columns J_i e_k; both are compared with the same N.

struct JacobianView {
  std::string input, check;  // names for the messages
  const Shape &yshape, &xshape;
  const Tensor &x, &y;
  std::span<const double> a, n;            // (m, n)
  std::span<const double> plus, minus;     // f(x ± εe_k)_j, (m, n); empty in fast mode
  std::span<const double> y0;              // f(x), (m)
  int64_t m, cols;
  Tolerance tol;
  double eps;
};

// The least-squares c in A ≈ c·N[map], kept when every element passes against c·N[map].
std::optional<double> common_factor(std::span<const double> a, std::span<const double> n,
                                    std::span<const int64_t> map, Tolerance tol) {
  double an = 0, nn = 0;
  for (size_t e = 0; e < a.size(); ++e) {
    const double ref = n[map.empty() ? e : static_cast<size_t>(map[e])];
    an += a[e] * ref;
    nn += ref * ref;
  }
  if (!(nn > 0) || !std::isfinite(an)) return std::nullopt;
  const double c = an / nn;
  for (size_t e = 0; e < a.size(); ++e)
    if (!tol.ok(a[e], c * n[map.empty() ? e : static_cast<size_t>(map[e])])) return std::nullopt;
  return c;
}

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

std::string times(double c) {
  return std::abs(c - 1) <= 1e-6 ? "" : fmt::format(" (and a factor {})", describe_factor(c));
}

// A = c·N, A = c·Nᵀ, A = c·N with two axes of x or of y swapped: one pattern that explains every element.
std::optional<Diagnosis> whole_jacobian_pattern(const JacobianView& v) {
  const std::string& x = v.input;
  const bool is_vjp = v.check == "vjp";
  const char* rule = is_vjp ? "VJP" : "JVP";
  const size_t count = v.a.size();
  if (auto c = common_factor(v.a, v.n, {}, v.tol)) {
    if (std::abs(*c + 1) <= 1e-3)
      return Diagnosis{Finding::sign, x, v.check,
                       fmt::format("analytic = −1 × numeric at every one of {} elements: the {} has the wrong sign "
                                   "(a sign slip)",
                                   count, rule)};
    return Diagnosis{Finding::scale, x, v.check,
                     fmt::format("analytic = c × numeric at every one of {} elements, c = {}: the {} is off by a "
                                 "constant factor (a missing or wrong scale; divide by c to fix it)",
                                 count, describe_factor(*c), rule)};
  }
  if (v.m == v.cols) {
    std::vector<int64_t> map(count);
    for (int64_t j = 0; j < v.m; ++j)
      for (int64_t k = 0; k < v.cols; ++k) map[static_cast<size_t>(j * v.cols + k)] = k * v.cols + j;
    if (auto c = common_factor(v.a, v.n, map, v.tol))
      return Diagnosis{Finding::transposed_jacobian, x, v.check,
                       fmt::format("analytic = the transposed Jacobian Jᵀ{}: the {} applies {} where {} belongs "
                                   "(a transpose slip)",
                                   times(*c), rule, is_vjp ? "J" : "Jᵀ", is_vjp ? "Jᵀ" : "J")};
  }
  for (bool on_x : {true, false}) {
    const Shape& s = on_x ? v.xshape : v.yshape;
    for (int p = 0; p < s.rank(); ++p)
      for (int q = p + 1; q < s.rank(); ++q) {
        if (s[p] != s[q] || s[p] < 2) continue;
        if (auto c = common_factor(v.a, v.n, swap_map(v, on_x, p, q), v.tol)) {
          const char* name = on_x ? x.c_str() : "y";
          return Diagnosis{on_x ? Finding::transposed_input : Finding::transposed_output, x, v.check,
                           fmt::format("analytic = numeric with axes {} and {} of {} {} swapped{}: the {} "
                                       "{} (a transpose slip: a product taken in the wrong order, or a "
                                       "matrix used where its transpose belongs)",
                                       p, q, name, s, times(*c), rule,
                                       on_x ? (is_vjp ? fmt::format("gives the gradient of {} transposed", x)
                                                      : fmt::format("reads the tangent of {} transposed", x))
                                            : (is_vjp ? std::string("reads ȳ transposed")
                                                      : std::string("gives ẏ transposed")))};
        }
      }
  }
  return std::nullopt;
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
  return fmt::format("y{} / {}{}", index_str(v.yshape, j), v.input, index_str(v.xshape, k));
}

std::string examples_str(const JacobianView& v, const std::vector<std::pair<int64_t, int64_t>>& bad) {
  std::string s = element_str(v, bad[0].first, bad[0].second);
  if (bad.size() > 1) s += fmt::format(" and {} more", bad.size() - 1);
  return s;
}

// Every failing element has pred(j, k), and the numeric Jacobian has nonzero entries where pred is false
// (else "all errors in the set" says nothing).
template <class Pred>
bool confined(const JacobianView& v, const std::vector<std::pair<int64_t, int64_t>>& bad, Pred&& pred) {
  for (auto [j, k] : bad)
    if (!pred(j, k)) return false;
  for (int64_t j = 0; j < v.m; ++j)
    for (int64_t k = 0; k < v.cols; ++k)
      if (!pred(j, k) && std::abs(v.n[static_cast<size_t>(j * v.cols + k)]) > v.tol.atol) return true;
  return false;
}

// One-sided differences (f(x+εe_k) − f(x))/ε and (f(x) − f(x−εe_k))/ε at (j, k): at a kink within ε of x_k they
// are two different slopes, the central difference is their mean, and a rule that gives one of them is off by half
// the gap. On a smooth f the gap is O(ε·f″), far above the error of a right rule and far below that of a wrong one.
bool kink_at(const JacobianView& v, int64_t j, int64_t k, double* forward, double* backward) {
  const size_t e = static_cast<size_t>(j * v.cols + k);
  *forward = (v.plus[e] - v.y0[static_cast<size_t>(j)]) / v.eps;
  *backward = (v.y0[static_cast<size_t>(j)] - v.minus[e]) / v.eps;
  const double gap = std::abs(*forward - *backward), err = std::abs(v.a[e] - v.n[e]);
  return gap > 10 * (v.tol.atol + v.tol.rtol * std::abs(v.n[e])) && gap >= 0.9 * err && gap <= 4 * err;
}

// Per row r (the last axis of y and of x; both with R rows): the error block E_r = A_r − N_r, (y cols, x cols),
// is one outer product α_r·u vᵀ. The vectors are named when they are (up to scale) 1, y_r or x_r in every row.
std::optional<Diagnosis> per_row_term(const JacobianView& v, const std::vector<std::pair<int64_t, int64_t>>& bad) {
  if (v.yshape.rank() == 0 || v.xshape.rank() == 0) return std::nullopt;
  const int64_t yc = v.yshape.back(), xc = v.xshape.back();
  if (yc < 2 || xc < 2 || v.m / yc != v.cols / xc) return std::nullopt;
  const int64_t rows = v.m / yc;
  for (auto [j, k] : bad)
    if (j / yc != k / xc) return std::nullopt;  // errors across rows: not a per-row term
  struct Candidate {
    std::string name;
    std::vector<double> vec;
  };
  // The candidate vectors of row r for u (over y's row) or v (over x's row).
  auto candidates = [&](int64_t r, int64_t len) {
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
  };
  std::vector<std::string> u_names, v_names;  // the names that fit every row so far
  bool first = true;
  double alpha_min = INFINITY, alpha_max = -INFINITY;
  int rows_with_error = 0;
  std::vector<double> block(static_cast<size_t>(yc * xc));
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
    // The leading singular pair by power iteration: w ← EᵀE w.
    std::vector<double> w(static_cast<size_t>(xc), 1.0), u(static_cast<size_t>(yc));
    for (int64_t b = 0; b < xc; ++b) w[static_cast<size_t>(b)] += 0.01 * static_cast<double>(b);
    double sigma = 0;
    for (int it = 0; it < 60; ++it) {
      for (int64_t a = 0; a < yc; ++a) {
        double s = 0;
        for (int64_t b = 0; b < xc; ++b) s += block[static_cast<size_t>(a * xc + b)] * w[static_cast<size_t>(b)];
        u[static_cast<size_t>(a)] = s;
      }
      sigma = std::sqrt(dot(u, u));
      if (!(sigma > 0)) return std::nullopt;
      for (double& e : u) e /= sigma;
      for (int64_t b = 0; b < xc; ++b) {
        double s = 0;
        for (int64_t a = 0; a < yc; ++a) s += block[static_cast<size_t>(a * xc + b)] * u[static_cast<size_t>(a)];
        w[static_cast<size_t>(b)] = s;
      }
      const double wn = std::sqrt(dot(w, w));
      for (double& e : w) e /= wn;
    }
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
    // The candidates parallel to the unit vector; else the combinations c₂ + ρ·c₁ of two of them (as y_r − 1),
    // which join the candidates under that name.
    auto fitting = [](std::vector<Candidate>& cs, const std::vector<double>& unit) {
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
    };
    auto keep = [&](std::vector<std::string>& acc, const std::vector<std::string>& now) {
      if (first) acc = now;
      else std::erase_if(acc, [&](const std::string& s) { return std::find(now.begin(), now.end(), s) == now.end(); });
    };
    auto cu = candidates(r, yc), cv = candidates(r, xc);
    keep(u_names, fitting(cu, u));
    keep(v_names, fitting(cv, w));
    // α_r against the first named pair of this row: E_r = α_r·cu cvᵀ.
    if (!u_names.empty() && !v_names.empty()) {
      auto vec_of = [](const std::vector<Candidate>& cs, const std::string& name) {
        for (const auto& c : cs)
          if (name == c.name) return c.vec;
        return std::vector<double>{};
      };
      const auto p = vec_of(cu, u_names[0]), q = vec_of(cv, v_names[0]);
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

// Everything the full Jacobians say about a failing VJP or JVP, most telling first. *all_kinks: every failing
// element sits at a kink (the failure says nothing about the rule).
std::vector<Diagnosis> diagnose_jacobian(const JacobianView& v, bool* all_kinks) {
  std::vector<Diagnosis> out;
  *all_kinks = false;
  const bool is_vjp = v.check == "vjp";
  const char* rule = is_vjp ? "VJP" : "JVP";
  const auto bad = failing_elements(v);
  if (bad.empty()) return out;

  for (auto [j, k] : bad)
    if (!std::isfinite(v.a[static_cast<size_t>(j * v.cols + k)])) {
      out.push_back({Finding::not_finite, v.input, v.check,
                     fmt::format("the {} gives {} at {}: a division by zero or an overflow in the rule", rule,
                                 v.a[static_cast<size_t>(j * v.cols + k)], element_str(v, j, k))});
      return out;
    }
  // Kinks: every failing element has one-sided slopes that differ by more than its error.
  if (!v.plus.empty()) {
    int kinks = 0;
    double fw = 0, bw = 0, f0 = 0, b0 = 0;
    std::pair<int64_t, int64_t> first{-1, -1};
    for (auto [j, k] : bad)
      if (kink_at(v, j, k, &fw, &bw)) {
        if (kinks++ == 0) first = {j, k}, f0 = fw, b0 = bw;
      }
    if (kinks > 0) {
      const double a = v.a[static_cast<size_t>(first.first * v.cols + first.second)];
      const char* side = std::abs(a - f0) <= std::abs(a - b0) ? "the right-hand" : "the left-hand";
      out.push_back({Finding::kink, v.input, v.check,
                     fmt::format("{} of {} failing elements sit at a kink: at {} the slope is {:.6g} to the right "
                                 "and {:.6g} to the left, the central difference averages them and the {} gives {:.6g} "
                                 "({} slope). The point is not differentiable: check away from it "
                                 "(Fill::away_from_zero)",
                                 kinks, bad.size(), element_str(v, first.first, first.second), f0, b0, rule, a,
                                 side)});
      if (kinks == static_cast<int>(bad.size())) {
        *all_kinks = true;
        return out;
      }
    }
  }

  if (std::all_of(v.a.begin(), v.a.end(), [](double e) { return e == 0; })) {
    out.push_back({Finding::zero, v.input, v.check,
                   is_vjp ? fmt::format("the VJP leaves x̄ of {} at 0 everywhere while y depends on it: it never "
                                        "writes that input's gradient",
                                        v.input)
                          : fmt::format("the JVP leaves ẏ at 0 for every tangent of {}: it never adds that input's "
                                        "term (an op without a forward-mode rule records no_jvp(name) instead)",
                                        v.input)});
    return out;
  }


  if (auto d = whole_jacobian_pattern(v)) {
    out.push_back(*d);
    return out;
  }

  const double zero_tol = 1e-12 * std::max(1.0, *std::max_element(v.n.begin(), v.n.end(), [](double p, double q) {
    return std::abs(p) < std::abs(q);
  }));
  auto numeric_zero = [&](int64_t j, int64_t k) { return std::abs(v.n[static_cast<size_t>(j * v.cols + k)]) <= zero_tol; };
  auto analytic_zero = [&](int64_t j, int64_t k) { return v.a[static_cast<size_t>(j * v.cols + k)] == 0; };
  if (confined(v, bad, numeric_zero))
    out.push_back({Finding::masked_positions, v.input, v.check,
                   fmt::format("all {} failing elements are where y does not depend on {} (numeric derivative 0, "
                               "analytic not), e.g. {}; elsewhere the {} agrees: it lets a masked position through "
                               "(a mask missing in the rule)",
                               bad.size(), v.input, examples_str(v, bad), rule)});
  else if (confined(v, bad, analytic_zero))
    out.push_back({Finding::masked_positions, v.input, v.check,
                   fmt::format("all {} failing elements are where the {} gives 0 but y does depend on {}, e.g. {}: "
                               "the rule masks positions the forward does not",
                               bad.size(), rule, v.input, examples_str(v, bad))});

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
                                   bad.size(), on_x ? v.input.c_str() : "y", on_x ? v.input.c_str() : "y",
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
      auto idx = unravel(s, row * len);
      idx.pop_back();
      rows_msg += fmt::format("{}{}[{}, :]", rows_msg.empty() ? "" : " and ", on_x ? v.input : "y", fmt::join(idx, ", "));
    }
  }
  if (!rows_msg.empty())
    out.push_back({Finding::one_row, v.input, v.check,
                   fmt::format("all {} failing elements are in one row, {}; the other rows agree: a term of that "
                               "row alone (its normalizer, a boundary or special case, a loop bound) is wrong",
                               bad.size(), rows_msg)});
  if (auto d = per_row_term(v, bad)) out.push_back(*d);
  return out;
}

// The fast mode keeps only projections: A = c·N over them is all it can tell.
std::optional<Diagnosis> diagnose_values(const std::string& input, const std::string& check,
                                         std::span<const double> a, std::span<const double> n, Tolerance tol) {
  const char* rule = check == "vjp" ? "VJP" : "JVP";
  if (std::all_of(a.begin(), a.end(), [](double e) { return e == 0; }) &&
      std::any_of(n.begin(), n.end(), [&](double e) { return std::abs(e) > tol.atol; }))
    return Diagnosis{Finding::zero, input, check, fmt::format("the {} gives 0 for every projection of {}", rule, input)};
  if (auto c = common_factor(a, n, {}, tol)) {
    if (std::abs(*c + 1) <= 1e-3)
      return Diagnosis{Finding::sign, input, check,
                       fmt::format("analytic = −1 × numeric for every random projection: the {} has the wrong sign",
                                   rule)};
    return Diagnosis{Finding::scale, input, check,
                     fmt::format("analytic = c × numeric for every random projection, c = {}: the {} is off by a "
                                 "constant factor",
                                 describe_factor(*c), rule)};
  }
  return std::nullopt;
}

}  // namespace

std::string_view finding_name(Finding f) {
  switch (f) {
    case Finding::not_finite: return "not finite";
    case Finding::zero: return "zero";
    case Finding::nonlinear: return "nonlinear";
    case Finding::sign: return "sign";
    case Finding::scale: return "scale";
    case Finding::transposed_jacobian: return "transposed Jacobian";
    case Finding::transposed_input: return "transposed input";
    case Finding::transposed_output: return "transposed output";
    case Finding::masked_positions: return "masked positions";
    case Finding::diagonal: return "diagonal";
    case Finding::one_row: return "one row";
    case Finding::per_row_term: return "per-row term";
    case Finding::radial: return "radial";
    case Finding::kink: return "kink";
    case Finding::tolerance: return "tolerance";
    case Finding::one_input: return "one input";
    case Finding::jvp_only: return "JVP only";
    case Finding::vjp_only: return "VJP only";
    case Finding::adjoint: return "adjoint";
    case Finding::consistent: return "consistent";
    case Finding::overwrites: return "overwrites";
    case Finding::no_jvp: return "no JVP";
  }
  return "?";
}

std::string Diagnosis::str() const {
  std::string where = input.empty() ? "" : check.empty() ? input + ": " : input + ", " + check + ": ";
  return fmt::format("[{}] {}{}", finding_name(kind), where, message);
}

std::ostream& operator<<(std::ostream& os, const Verdict& v) {
  return v.report.empty() ? os << (v.ok ? "passed" : "FAILED") : os << "\n" << v.report;
}

void GradcheckReport::conclude() {
  passed.ok = std::all_of(checks.begin(), checks.end(), [](const CheckResult& c) { return c.passed; });
  passed.report = str();
}

const Diagnosis* GradcheckReport::find(Finding f, std::string_view input) const {
  for (const auto& d : diagnoses)
    if (d.kind == f && (input.empty() || d.input == input)) return &d;
  return nullptr;
}

bool GradcheckReport::has(Finding f, std::string_view input) const { return find(f, input) != nullptr; }

std::string GradcheckReport::str() const {
  const bool ok = std::all_of(checks.begin(), checks.end(), [](const CheckResult& c) { return c.passed; });
  std::string title = op.empty() ? (case_name.empty() ? "gradcheck" : case_name)
                                  : (case_name.empty() ? op : fmt::format("{} / {}", op, case_name));
  std::string s = fmt::format("{}: {}\n", title, ok ? "passed" : "FAILED");
  s += fmt::format("  {:<8} {:<10} {:<5} {:>11} {:>11}  {:<24} {}\n", "input", "check", "mode", "max_abs_err",
                   "max_rel_err", "worst element", "result");
  for (const auto& c : checks) {
    if (c.skipped) {
      s += fmt::format("  {:<8} {:<10} {:<5} {:>11} {:>11}  {:<24} {}\n", c.input, c.check, c.mode, "", "", "",
                       "skipped (no JVP)");
      continue;
    }
    s += fmt::format("  {:<8} {:<10} {:<5} {:>11.2e} {:>11.2e}  {:<24} {}", c.input, c.check, c.mode,
                     c.max_abs_err, c.max_rel_err, c.worst, c.passed ? "ok" : "FAIL");
    if (!c.passed) s += fmt::format("  (analytic {:.6g}, numeric {:.6g})", c.analytic, c.numeric);
    s += "\n";
  }
  if (!diagnoses.empty()) {
    s += "  diagnosis:\n";
    for (const auto& d : diagnoses) s += fmt::format("    {}\n", d.str());
  }
  return s;
}

std::ostream& operator<<(std::ostream& os, const GradcheckReport& r) { return os << r.str(); }

GradcheckReport gradcheck(const Function& f, std::span<const Tensor> inputs, std::span<const std::string> names,
                          const GradcheckOptions& opt) {
  std::vector<Tensor> xs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].dtype() == DType::f32)
      fail("gradcheck: input {} is float32; finite differences need float64 inputs", i);
    xs.push_back(inputs[i].clone());
  }
  auto name = [&](size_t i) { return i < names.size() ? names[i] : fmt::format("x{}", i); };
  const Tolerance tol{opt.atol, opt.rtol};
  GradcheckReport rep;
  const Tensor y0 = evaluate(f, xs);
  const Shape yshape = y0.shape();
  const int64_t m = y0.numel();
  const std::span<const double> y0v(y0.data<double>(), static_cast<size_t>(m));
  Rng rng(opt.seed);

  // f(x ± ε·dir) with dir along input i, and the central difference between them.
  struct Differences {
    Tensor central, plus, minus;
  };
  auto differences = [&](size_t i, const Tensor& dir) {
    double* x = xs[i].data<double>();
    const double* d = dir.data<double>();
    const int64_t n = xs[i].numel();
    Tensor saved = xs[i].clone();
    for (int64_t k = 0; k < n; ++k) x[k] += opt.eps * d[k];
    Differences r{Tensor::empty(DType::f64, yshape), evaluate(f, xs), {}};
    for (int64_t k = 0; k < n; ++k) x[k] = saved.data<double>()[k] - opt.eps * d[k];
    r.minus = evaluate(f, xs);
    xs[i].copy_from(saved);
    for (int64_t j = 0; j < m; ++j)
      r.central.data<double>()[j] = (r.plus.data<double>()[j] - r.minus.data<double>()[j]) / (2 * opt.eps);
    return r;
  };
  auto tangent_on = [&](size_t i, const Tensor& t) {
    std::vector<Tensor> ts(xs.size());
    ts[i] = t;
    return jvp(f, xs, ts).second;
  };

  // Rows of every Jacobian small enough to check in full: rows[j][i] = J_iᵀ e_j.
  bool any_full = false;
  for (const Tensor& x : xs)
    any_full = any_full || (x.dtype() == DType::f64 && m * x.numel() <= opt.full_jacobian_limit);
  std::vector<std::vector<Tensor>> rows;
  if (any_full)
    for (int64_t j = 0; j < m; ++j) {
      Tensor e = Tensor::zeros(DType::f64, yshape);
      e.data<double>()[j] = 1;
      rows.push_back(vjp(f, xs, e));
    }

  std::vector<Diagnosis> details;  // per input; the report-level findings go first
  struct InputOutcome {
    std::string name;
    bool vjp_ok = true, jvp_ok = true, jvp_skipped = false, adjoint_ok = true;
    bool explained = false;  // every failure is a kink's or the tolerance's: nothing to say about the rules
  };
  std::vector<InputOutcome> outcomes;
  std::string no_jvp_op;

  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i].dtype() != DType::f64) continue;
    const int64_t n = xs[i].numel();
    const Shape xshape = xs[i].shape();
    ErrorTracker vj{tol, {name(i), "vjp", "", 0, 0, "", 0, 0, true, false}};
    ErrorTracker jv{tol, {name(i), "jvp", "", 0, 0, "", 0, 0, true, false}};

    // Forward mode on a random tangent: also tells whether the op has a JVP at all.
    Tensor t = random_like(xs[i], rng), u = random_like(y0, rng);
    Tensor jt;
    try {
      jt = tangent_on(i, t);
    } catch (const NoJvp& e) {
      no_jvp_op = e.op;
    }
    const bool has_jvp = jt.defined();

    std::vector<double> a_vjp, a_jvp, numeric, plus, minus;  // full mode, (m, n)
    std::vector<double> fa_vjp, fn_vjp, fa_jvp, fn_jvp;      // fast mode
    if (m * n <= opt.full_jacobian_limit) {
      vj.r.mode = jv.r.mode = "full";
      const size_t mn = static_cast<size_t>(m * n);
      a_vjp.resize(mn), numeric.resize(mn), plus.resize(mn), minus.resize(mn);
      if (has_jvp) a_jvp.resize(mn);
      for (int64_t k = 0; k < n; ++k) {
        Tensor e = Tensor::zeros(DType::f64, xshape);
        e.data<double>()[k] = 1;
        Differences d = differences(i, e);  // column k of J_i
        Tensor forward = has_jvp ? tangent_on(i, e) : Tensor{};
        auto where = [&](int64_t j) {
          return [&, j] { return fmt::format("y{} / {}{}", index_str(yshape, j), name(i), index_str(xshape, k)); };
        };
        for (int64_t j = 0; j < m; ++j) {
          const size_t at = static_cast<size_t>(j * n + k);
          numeric[at] = d.central.data<double>()[j];
          plus[at] = d.plus.data<double>()[j];
          minus[at] = d.minus.data<double>()[j];
          a_vjp[at] = rows[static_cast<size_t>(j)][i].item(k);
          vj.add(a_vjp[at], numeric[at], where(j));
          if (has_jvp) {
            a_jvp[at] = forward.data<double>()[j];
            jv.add(a_jvp[at], numeric[at], where(j));
          }
        }
      }
    } else {
      vj.r.mode = jv.r.mode = "fast";
      for (int p = 0; p < opt.projections; ++p) {
        Tensor v = random_like(xs[i], rng), w = random_like(y0, rng);
        Tensor numeric_v = differences(i, v).central;  // J_i v
        Tensor back = vjp(f, xs, w)[i];
        fa_vjp.push_back(dot(back, v));
        fn_vjp.push_back(dot(w, numeric_v));
        vj.add(fa_vjp.back(), fn_vjp.back(), [&] { return fmt::format("projection {}", p); });
        if (!has_jvp) continue;
        Tensor forward = tangent_on(i, v);
        for (int64_t j = 0; j < m; ++j) {
          fa_jvp.push_back(forward.data<double>()[j]);
          fn_jvp.push_back(numeric_v.data<double>()[j]);
          jv.add(fa_jvp.back(), fn_jvp.back(),
                 [&] { return fmt::format("y{} (projection {})", index_str(yshape, j), p); });
        }
      }
    }
    if (!has_jvp) jv.r.mode = "none", jv.r.skipped = true;
    rep.checks.push_back(vj.r);
    rep.checks.push_back(jv.r);

    // ⟨J t, u⟩ = ⟨t, Jᵀu⟩, to rounding: the tolerance is relative to the Cauchy–Schwarz bound of each side.
    Tensor ju = vjp(f, xs, u)[i];
    CheckResult adj{name(i), "adjoint", "exact", 0, 0, "<J t, u> vs <t, J^T u>", 0, 0, true, false};
    if (has_jvp) {
      double lhs = dot(jt, u), rhs = dot(t, ju);
      double bound = 1e-10 * (norm(jt) * norm(u) + norm(t) * norm(ju)) + 1e-300;
      adj.max_abs_err = std::abs(lhs - rhs);
      adj.max_rel_err = std::abs(lhs - rhs) / std::max({std::abs(lhs), std::abs(rhs), 1e-300});
      adj.analytic = lhs, adj.numeric = rhs;
      adj.passed = std::abs(lhs - rhs) <= bound;
    } else {
      adj.mode = "none", adj.worst = "", adj.skipped = true;
    }
    rep.checks.push_back(adj);

    // Backward must add into a gradient that already holds r.
    Tensor r = random_like(xs[i], rng);
    Tensor acc = r.clone();
    {
      Tape tape;
      std::vector<Var> vars;
      for (size_t q = 0; q < xs.size(); ++q)
        vars.push_back(q == i ? tape.param(xs[q], acc) : tape.leaf(xs[q], xs[q].dtype() != DType::i32));
      Var y = f(tape, vars);
      if (y.requires_grad()) tape.backward(y, u);
    }
    CheckResult ac{name(i), "accumulate", "exact", 0, 0, "", 0, 0, true, false};
    double worst = -1;
    bool lost_r = true;  // acc = J_iᵀu: what an assignment leaves
    for (int64_t k = 0; k < n; ++k) {
      double got = acc.item(k) - r.item(k), want = ju.item(k);
      double err = std::abs(got - want);
      double tol_k = 1e-10 * (std::abs(r.item(k)) + std::abs(want)) + 1e-12;
      if (!(err <= tol_k)) ac.passed = false;
      lost_r = lost_r && std::abs(acc.item(k) - want) <= tol_k;
      ac.max_abs_err = std::max(ac.max_abs_err, err);
      ac.max_rel_err = std::max(ac.max_rel_err, err / std::max(std::abs(want), 1e-12));
      if (err / tol_k > worst) {
        worst = err / tol_k;
        ac.worst = fmt::format("{}{}", name(i), index_str(xshape, k));
        ac.analytic = got;
        ac.numeric = want;
      }
    }
    rep.checks.push_back(ac);
    if (!ac.passed && lost_r)
      details.push_back({Finding::overwrites, name(i), "accumulate",
                         "after backward the gradient holds J_iᵀȳ alone, not r + J_iᵀȳ: the VJP assigns into x̄ "
                         "where it must add (a value used twice would lose one of its gradients)"});

    outcomes.push_back({name(i), vj.r.passed, jv.r.passed, jv.r.skipped, adj.passed, false});
    if (!opt.diagnose || (vj.r.passed && jv.r.passed && adj.passed)) continue;

    // ---- what the failure looks like ----
    int rules_failed = 0, rules_explained = 0;  // explained: by kinks or by the tolerance
    for (bool is_vjp : {true, false}) {
      const bool rule_failed = !(is_vjp ? vj.r.passed : jv.r.passed);
      // With one-hot cotangents a rule that is not linear can pass element by element (ȳ² = ȳ on e_j):
      // a failing adjoint identity is reason enough to test linearity.
      if (!rule_failed && (adj.passed || (!is_vjp && !has_jvp))) continue;
      rules_failed += rule_failed;
      const std::string check = is_vjp ? "vjp" : "jvp";
      // Linearity: x̄(ȳ₁ + ȳ₂) = x̄(ȳ₁) + x̄(ȳ₂) and x̄(2ȳ) = 2x̄(ȳ) (likewise ẏ in ẋ).
      Tensor p = is_vjp ? random_like(y0, rng) : random_like(xs[i], rng);
      Tensor q = is_vjp ? random_like(y0, rng) : random_like(xs[i], rng);
      Tensor pq = p.clone(), p2 = p.clone();
      pq.accumulate(q);
      p2.accumulate(p);
      auto apply = [&](const Tensor& s) { return is_vjp ? vjp(f, xs, s)[i] : tangent_on(i, s); };
      Tensor rp = apply(p), rq = apply(q), rpq = apply(pq), rp2 = apply(p2);
      Tensor additivity = rpq.clone();
      double add_err = 0;
      for (int64_t e = 0; e < additivity.numel(); ++e)
        add_err = std::max(add_err, std::abs(rpq.item(e) - rp.item(e) - rq.item(e)));
      const double size = std::max(norm(rp) + norm(rq), 1e-300);
      if (add_err > 1e-8 * size + 1e-12) {
        const double ratio = norm(rp2) / std::max(norm(rp), 1e-300);
        const double degree = std::log2(ratio);
        const char* what = is_vjp ? "x̄ is not linear in ȳ: x̄(ȳ₁ + ȳ₂) − x̄(ȳ₁) − x̄(ȳ₂)"
                                  : "ẏ is not linear in ẋ: ẏ(ẋ₁ + ẋ₂) − ẏ(ẋ₁) − ẏ(ẋ₂)";
        const char* of = is_vjp ? "ȳ" : "ẋ";
        std::string deg = std::abs(degree - std::round(degree)) < 0.01
                              ? fmt::format(" (degree {:.0f} in {}{})", std::round(degree), of,
                                            std::round(degree) >= 2 ? ": a product of several of its terms" : "")
                              : "";
        details.push_back({Finding::nonlinear, name(i), check,
                           fmt::format("{} is {:.3g} of their size, and doubling {} scales "
                                       "the result by {:.4g}{}; a {} must be linear in {}, so this rule is not a "
                                       "derivative at all",
                                       what, add_err / size, of, ratio, deg, is_vjp ? "VJP" : "JVP", of)});
      }
      if (!rule_failed) continue;
      // Errors at the level of the finite differences' own: the tolerance asks more than they can resolve.
      const CheckResult& res = is_vjp ? vj.r : jv.r;
      const std::span<const double> ref = !numeric.empty() ? std::span<const double>(numeric)
                                          : is_vjp           ? std::span<const double>(fn_vjp)
                                                             : std::span<const double>(fn_jvp);
      double scale = 1;
      for (double e : ref) scale = std::max(scale, std::abs(e));
      if (res.max_abs_err <= 1e-7 * scale) {
        details.push_back({Finding::tolerance, name(i), check,
                           fmt::format("the largest error, {:.3g}, is {:.2g} of the largest derivative: what central "
                                       "differences with ε = {:g} are off by themselves (rounding ≈ 1e-16·|f|/ε, "
                                       "truncation ≈ ε²·|f‴|/6); the tolerance (atol {:g}, rtol {:g}) asks for more "
                                       "than the check can resolve, nothing says the rule is wrong",
                                       res.max_abs_err, res.max_abs_err / scale, opt.eps, tol.atol, tol.rtol)});
        ++rules_explained;
        continue;
      }
      if (!a_vjp.empty()) {
        JacobianView view{name(i), check, yshape, xshape, xs[i], y0,
                          is_vjp ? std::span<const double>(a_vjp) : std::span<const double>(a_jvp), numeric,
                          plus, minus, y0v, m, n, tol, opt.eps};
        bool all_kinks = false;
        for (auto& d : diagnose_jacobian(view, &all_kinks)) details.push_back(std::move(d));
        rules_explained += all_kinks;
        if (all_kinks) continue;
      } else if (auto d = is_vjp ? diagnose_values(name(i), check, fa_vjp, fn_vjp, tol)
                                 : diagnose_values(name(i), check, fa_jvp, fn_jvp, tol)) {
        details.push_back(*d);
      }
      // The direction ẋ = x: right there and wrong elsewhere is a rule that holds only for tangents along x.
      if (!is_vjp && norm(xs[i]) > 0) {
        Tensor along = differences(i, xs[i]).central, analytic = tangent_on(i, xs[i]);
        bool radial_ok = true;
        for (int64_t j = 0; j < m; ++j) radial_ok = radial_ok && tol.ok(analytic.item(j), along.item(j));
        if (radial_ok)
          details.push_back({Finding::radial, name(i), "jvp",
                             fmt::format("along ẋ = {} itself (scaling the input) the JVP agrees with the finite "
                                         "differences, across it it does not: the rule holds only for tangents "
                                         "parallel to {} (a homogeneity argument that drops the part of ẋ "
                                         "orthogonal to {})",
                                         name(i), name(i), name(i))});
      }
    }
    outcomes.back().explained = rules_failed > 0 && rules_explained == rules_failed;
  }

  // Which rule, and which input, is at fault.
  std::vector<Diagnosis> summary;
  int failing_inputs = 0;
  for (const auto& o : outcomes) failing_inputs += !(o.vjp_ok && o.jvp_ok) && !o.explained;
  for (const auto& o : outcomes) {
    if (o.explained) continue;
    if (o.vjp_ok && !o.jvp_ok)
      summary.push_back({Finding::jvp_only, o.name, "",
                         fmt::format("the VJP agrees with the finite differences and the JVP does not{}: the slip is "
                                     "in the forward-mode rule",
                                     o.adjoint_ok ? "" : " (so the adjoint identity ⟨J t, u⟩ = ⟨t, Jᵀu⟩ fails too)")});
    else if (!o.vjp_ok && o.jvp_ok && !o.jvp_skipped)
      summary.push_back({Finding::vjp_only, o.name, "",
                         fmt::format("the JVP agrees with the finite differences and the VJP does not{}: the slip is "
                                     "in backward",
                                     o.adjoint_ok ? "" : " (so the adjoint identity ⟨J t, u⟩ = ⟨t, Jᵀu⟩ fails too)")});
    else if (o.vjp_ok && o.jvp_ok && !o.adjoint_ok)
      summary.push_back({Finding::adjoint, o.name, "adjoint",
                         "VJP and JVP each pass their checks, but ⟨J t, u⟩ ≠ ⟨t, Jᵀu⟩: they are not transposes of "
                         "each other (an error below the finite-difference tolerance, one the projections miss, or a rule that "
                         "is not linear and passes on one-hot cotangents)"});
    else if (!o.vjp_ok && !o.jvp_ok && o.adjoint_ok)
      summary.push_back({Finding::consistent, o.name, "",
                         "VJP and JVP both disagree with the finite differences but agree with each other (the "
                         "adjoint identity holds): the derivation they share is wrong, or the forward computes "
                         "something else than what they differentiate"});
  }
  if (failing_inputs == 1 && outcomes.size() >= 2)
    for (const auto& o : outcomes)
      if (!(o.vjp_ok && o.jvp_ok) && !o.explained)
        summary.push_back({Finding::one_input, o.name, "",
                           fmt::format("only {}'s derivatives fail; {} agree: the slip is in {}'s term", o.name,
                                       outcomes.size() == 2 ? std::string("the other input's")
                                                            : fmt::format("those of the other {} inputs",
                                                                          outcomes.size() - 1),
                                       o.name)});
  if (!no_jvp_op.empty())
    summary.push_back({Finding::no_jvp, "", "",
                       fmt::format("op '{}' was recorded with no_jvp: forward mode and the adjoint identity are not "
                                   "checked (a note, not a failure)",
                                   no_jvp_op)});
  rep.diagnoses = std::move(summary);
  for (auto& d : details) rep.diagnoses.push_back(std::move(d));
  rep.conclude();
  return rep;
}

GradcheckReport gradcheck(const Function& f, std::initializer_list<Tensor> inputs,
                          std::initializer_list<std::string> names, const GradcheckOptions& opt) {
  return gradcheck(f, std::span<const Tensor>(inputs.begin(), inputs.size()),
                   std::span<const std::string>(names.begin(), names.size()), opt);
}

GradcheckReport gradcheck(const GradcheckCase& c, const GradcheckOptions& opt, std::string_view op) {
  GradcheckOptions o = opt;
  if (c.atol) o.atol = *c.atol;
  if (c.rtol) o.rtol = *c.rtol;
  std::vector<Tensor> xs = make_inputs(c.inputs, DType::f64, opt.seed);
  std::vector<std::string> names;
  for (const auto& s : c.inputs) names.push_back(s.name);
  GradcheckReport rep = gradcheck(c.build, xs, names, o);
  rep.op = std::string(op);
  rep.case_name = c.name;
  rep.conclude();
  return rep;
}

std::vector<GradcheckReport> gradcheck(const OpInfo& op, const GradcheckOptions& opt) {
  if (op.cases.empty()) fail("gradcheck: op '{}' has no gradcheck case", op.name);
  std::vector<GradcheckReport> reports;
  for (const auto& c : op.cases) reports.push_back(gradcheck(c, opt, op.name));
  return reports;
}

}  // namespace tapegrad
