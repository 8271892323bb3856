// The whole-Jacobian patterns: one relation between A and N that explains every element (a sign, a scale, a
// transpose).
#include <fmt/format.h>

#include "checker/jacobian.hpp"

namespace tapegrad::gradcheck_detail {

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

std::string times(double c) {
  return std::abs(c - 1) <= 1e-6 ? "" : fmt::format(" (and a factor {})", describe_factor(c));
}

}  // namespace

// A = c·N, A = c·Nᵀ, A = c·N with two axes of x or of y swapped: one pattern that explains every element.
std::optional<Diagnosis> whole_jacobian_pattern(const JacobianView& v) {
  const std::string& x = v.input;
  const bool is_vjp = v.check == "vjp";
  const char* rule = rule_name(v.check);
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
          const char* name = on_x ? x.c_str() : v.y_name.c_str();
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

// The fast mode keeps only projections: A = c·N over them is all it can tell.
std::optional<Diagnosis> diagnose_values(const std::string& input, const std::string& check,
                                         std::span<const double> a, std::span<const double> n, Tolerance tol) {
  const char* rule = rule_name(check);
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

}  // namespace tapegrad::gradcheck_detail
