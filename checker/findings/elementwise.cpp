// An element-wise op (a diagonal Jacobian) read as the per-row factor reads rows: f′ claimed against f′ true along
// the diagonal, as a factor or a term that is a function of x or y.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "checker/finding_sheet.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad::gradcheck_detail {

namespace {

std::optional<Diagnosis> elementwise_error(const JacobianView& v) {
  if (v.m != v.cols || v.m < 3 || !(v.yshape == v.xshape)) return std::nullopt;
  // Element-wise: the analytic and numeric Jacobians vanish off the diagonal (to the tolerance).
  for (int64_t j = 0; j < v.m; ++j)
    for (int64_t k = 0; k < v.cols; ++k)
      if (j != k && !(v.tol.ok(v.a[static_cast<size_t>(j * v.cols + k)], 0) &&
                      v.tol.ok(v.n[static_cast<size_t>(j * v.cols + k)], 0)))
        return std::nullopt;
  std::vector<double> a(static_cast<size_t>(v.m)), n(a), x(a), y(a);
  for (int64_t k = 0; k < v.m; ++k) {
    a[static_cast<size_t>(k)] = v.a[static_cast<size_t>(k * v.cols + k)];
    n[static_cast<size_t>(k)] = v.n[static_cast<size_t>(k * v.cols + k)];
    x[static_cast<size_t>(k)] = v.x.item(k);
    y[static_cast<size_t>(k)] = v.y0[static_cast<size_t>(k)];
  }
  const std::string xn = v.input, yn = v.y_name;
  struct Piece {
    std::string name;
    std::vector<double> g;
  };
  auto piece = [&](std::string name, auto&& at) {
    Piece p{std::move(name), std::vector<double>(a.size())};
    for (size_t k = 0; k < a.size(); ++k) p.g[k] = at(k);
    return p;
  };
  const std::vector<Piece> factors = {piece(xn, [&](size_t k) { return x[k]; }),
                                      piece("1/" + xn, [&](size_t k) { return 1 / x[k]; }),
                                      piece(yn, [&](size_t k) { return y[k]; }),
                                      piece("1/" + yn, [&](size_t k) { return 1 / y[k]; }),
                                      piece(xn + "²", [&](size_t k) { return x[k] * x[k]; }),
                                      piece(yn + "/" + xn, [&](size_t k) { return y[k] / x[k]; })};
  // c·g with one c over every element, each within the tolerance: c, or nothing.
  auto constant = [&](const std::vector<double>& target, const std::vector<double>& g,
                      const std::vector<double>& base) -> std::optional<double> {
    double tg = 0, gg = 0;
    for (size_t k = 0; k < g.size(); ++k) tg += target[k] * g[k], gg += g[k] * g[k];
    if (!(gg > 0) || !std::isfinite(gg)) return std::nullopt;
    const double c = tg / gg;
    for (size_t k = 0; k < g.size(); ++k)
      if (!v.tol.ok(base[k] + c * g[k], base[k] + target[k])) return std::nullopt;
    return c;
  };
  const std::string where = fmt::format("an element-wise op (∂{}_k/∂{}_k only)", yn, xn);
  // analytic = c·g·numeric: a factor of f′ wrong (g = x: a power rule's exponent not lowered, say).
  std::vector<double> zero(a.size(), 0.0);
  for (const Piece& p : factors) {
    std::vector<double> gn(a.size());
    for (size_t k = 0; k < a.size(); ++k) gn[k] = p.g[k] * n[k];
    if (auto c = constant(a, gn, zero)) {
      const std::string times = std::abs(*c - 1) <= 1e-6 ? p.name : describe_factor(*c) + "·" + p.name;
      return Diagnosis{Finding::elementwise, v.input, v.check,
                       fmt::format("{}: along the diagonal the {} gives f′ × {} at every element (analytic = numeric "
                                   "× {}): the derivative has a factor {} that f′ does not",
                                   where, rule_name(v.check), times, times, times)};
    }
  }
  // analytic = numeric + c·g: a term of f′ missing, extra or wrong.
  std::vector<double> e(a.size());
  for (size_t k = 0; k < a.size(); ++k) e[k] = a[k] - n[k];
  std::vector<Piece> terms = factors;
  terms.insert(terms.begin(), piece("1", [](size_t) { return 1.0; }));
  terms.push_back(piece(xn + "·" + yn, [&](size_t k) { return x[k] * y[k]; }));
  terms.push_back(piece(yn + "²", [&](size_t k) { return y[k] * y[k]; }));
  for (const Piece& p : terms)
    if (auto c = constant(e, p.g, n)) {
      const double size = std::abs(*c);  // written with its sign apart: f′ − 1.3, not f′ + -1.3
      const std::string term = p.name == "1"                       ? describe_factor(size)
                               : std::abs(size - 1) <= kSameFactor ? p.name
                                                                   : describe_factor(size) + "·" + p.name;
      const char* sign = *c < 0 ? "−" : "+";
      return Diagnosis{Finding::elementwise, v.input, v.check,
                       fmt::format("{}: along the diagonal the {} gives f′ {} {} at every element (analytic − numeric "
                                   "= {}{}): a term of f′ is missing, counted twice or wrong by that much",
                                   where, rule_name(v.check), sign, term, *c < 0 ? "−" : "", term)};
    }
  return std::nullopt;
}

// A diagonal Jacobian whose entries are the right ones times, or plus, a function of x or y. The search
// ends.
bool derivative_off_elementwise(JacobianSearch& s) { return add_found(s, elementwise_error(s.v), true); }

}  // namespace

}  // namespace tapegrad::gradcheck_detail

namespace tapegrad {

FindingSheet elementwise_finding() {
  return {
      .kind = Finding::elementwise,
      .title = "element-wise",
      .meaning =
          "an element-wise op whose derivative along the diagonal is the right one times, or plus, a "
          "function of x or y: a factor or a term of f′ wrong",
      .found_by = "its pass over a failing full Jacobian, in this file",
      .section = "docs/gradchecking.md#element-wise",
      .passes = {{80, gradcheck_detail::derivative_off_elementwise}},
  };
}

}  // namespace tapegrad
