// The diagnosis of a failing second-order check: the first order first, then the Hessian in blocks.
#include <algorithm>

#include <fmt/format.h>

#include "checker/jacobian.hpp"

namespace tapegrad::gradcheck_detail {

namespace {

// One block ∂x̄_a/∂x_b of the Hessian of s: rows over x_a's elements, columns over x_b's (all of them, or a sample).
struct Block {
  size_t a, b;
  int64_t rows, cols;
  std::vector<double> analytic, numeric, plus, minus;  // (rows, cols); plus/minus: x̄_a at x ± εe_k
  bool failing = false;
};

// Columns of the Hessian taken per input when the inputs are too large for whole blocks: evenly spaced.
constexpr int64_t kSampledColumns = 12;

std::vector<int64_t> columns_of(int64_t numel, bool sampled) {
  std::vector<int64_t> ks;
  const int64_t n = sampled ? std::min(numel, kSampledColumns) : numel;
  for (int64_t i = 0; i < n; ++i) ks.push_back(sampled ? i * numel / n : i);
  return ks;
}

std::string block_name(const std::string& a, const std::string& b) { return fmt::format("∂{}̄/∂{}", a, b); }

}  // namespace

std::vector<Diagnosis> diagnose_second_order(const CheckedPoint& point, const Tensor& u, int64_t max_elements) {
  // named references, not a structured binding: lambdas capture them (clang 14 refuses a binding)
  const Function& f = point.f;
  const std::span<const Tensor> x = point.x;
  const std::span<const std::string> names = point.names;
  const GradcheckOptions& opt = point.opt;
  RuleBlocks* const rule_blocks = point.blocks;
  std::vector<Diagnosis> out;
  // A wrong VJP is a wrong gradient, and the differences of a wrong gradient are not what H·t differentiates.
  {
    GradcheckOptions first = opt;
    first.diagnose = false;
    const GradcheckReport r = gradcheck(f, x, names, first, rule_blocks);
    std::string failing;
    for (const CheckResult& c : r.checks)
      if (c.check == "vjp" && !c.passed && !c.skipped) failing += (failing.empty() ? "" : ", ") + c.input;
    if (!failing.empty()) {
      out.push_back({Finding::first_order, failing, "",
                     fmt::format("the VJP of {} already fails the first-order check, so H·t (the tangent of that "
                                 "VJP) fails with it: fix the first order first (tapegrad gradcheck --order 1)",
                                 failing)});
      return out;
    }
  }
  std::vector<size_t> fl;  // the float inputs
  int64_t total = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i].dtype() != DType::i32) fl.push_back(i), total += x[i].numel();
  // Larger inputs: which blocks fail, from a few columns of each; no block is diagnosed as a whole.
  const bool sampled = total > max_elements;
  if (sampled && fl.size() < 2) return out;

  // Column k of input b: H·e_k by Tape::hvp, and (∇s(x + εe_k) − ∇s(x − εe_k))/2ε.
  std::vector<Tensor> zero;
  for (size_t i : fl) zero.push_back(Tensor::zeros(DType::f64, x[i].shape()));
  const std::vector<Tensor> g0 = gradient_at(f, x, zero, 0, u);
  std::vector<Block> blocks;
  for (size_t a = 0; a < fl.size(); ++a)
    for (size_t b = 0; b < fl.size(); ++b) {
      const int64_t rows = x[fl[a]].numel(), cols = static_cast<int64_t>(columns_of(x[fl[b]].numel(), sampled).size());
      const size_t n = static_cast<size_t>(rows * cols);
      blocks.push_back({a, b, rows, cols, std::vector<double>(n), std::vector<double>(n), std::vector<double>(n),
                        std::vector<double>(n)});
    }
  const Tolerance tol{opt.atol, opt.rtol};
  for (size_t b = 0; b < fl.size(); ++b) {
    const std::vector<int64_t> ks = columns_of(x[fl[b]].numel(), sampled);
    for (size_t c = 0; c < ks.size(); ++c) {
      std::vector<Tensor> e;
      for (const Tensor& z : zero) e.push_back(z.clone());
      e[b].data<double>()[ks[c]] = 1;
      std::string refused;
      const std::vector<Tensor> h = hessian_times(f, x, u, e, &refused);
      if (!refused.empty()) return out;
      const std::vector<Tensor> p = gradient_at(f, x, e, opt.eps, u), m = gradient_at(f, x, e, -opt.eps, u);
      for (size_t a = 0; a < fl.size(); ++a) {
        Block& B = blocks[a * fl.size() + b];
        for (int64_t j = 0; j < B.rows; ++j) {
          const size_t at = static_cast<size_t>(j * B.cols) + c;
          B.analytic[at] = h[a].item(j);
          B.plus[at] = p[a].item(j);
          B.minus[at] = m[a].item(j);
          B.numeric[at] = (B.plus[at] - B.minus[at]) / (2 * opt.eps);
          if (!tol.ok(B.analytic[at], B.numeric[at])) B.failing = true;
        }
      }
    }
  }

  // Which blocks: a rule's term of x̄_a along ẋ_b is wrong exactly where ∂x̄_a/∂x_b is.
  std::string bad, good;
  std::vector<std::string> lopsided;  // ∂x̄_a/∂x_b failing while ∂x̄_b/∂x_a agrees
  for (const Block& B : blocks) {
    const std::string name = block_name(names[fl[B.a]], names[fl[B.b]]);
    (B.failing ? bad : good) += fmt::format("{}{}", (B.failing ? bad : good).empty() ? "" : ", ", name);
    if (B.failing && B.a != B.b && !blocks[B.b * fl.size() + B.a].failing) lopsided.push_back(name);
  }
  if (fl.size() >= 2 && !bad.empty()) {
    const bool cross_only =
        std::all_of(blocks.begin(), blocks.end(), [](const Block& B) { return !B.failing || B.a != B.b; });
    const bool own_only =
        std::all_of(blocks.begin(), blocks.end(), [](const Block& B) { return !B.failing || B.a == B.b; });
    out.push_back(
        {Finding::hessian_block, "", "hvp",
         fmt::format("the errors sit in {}; {} agree{}{}", bad, good.empty() ? "no other block" : good,
                     cross_only ? ": only cross terms are wrong, the parts of a VJP that move with another "
                                  "input's tangent (bilinear terms such as ȳ·ḃ)"
                     : own_only ? ": only the terms of each gradient along its own input's tangent are wrong"
                                : "",
                     sampled ? fmt::format(" (from at most {} columns of each block: the inputs have {} elements, "
                                           "more than the {} up to which blocks are taken whole)",
                                           kSampledColumns, total, max_elements)
                             : "")});
  }
  for (const std::string& name : lopsided)
    out.push_back({Finding::asymmetric, "", "hvp",
                   fmt::format("{} fails while its transpose block agrees: the analytic Hessian is not symmetric, and "
                               "the slip is in the rule's term for that block alone",
                               name)});
  // Each failing block as a Jacobian: rows x̄_a, columns x_b.
  if (sampled) return out;
  for (const Block& B : blocks) {
    if (!B.failing) continue;
    const size_t ia = fl[B.a], ib = fl[B.b];
    const std::string rows_name = names[ia] + "̄";
    const std::span<const double> y0(g0[B.a].data<double>(), static_cast<size_t>(B.rows));
    JacobianView view{names[ib], "hvp", x[ia].shape(), x[ib].shape(), x[ib], g0[B.a], B.analytic, B.numeric, B.plus,
                      B.minus,   y0,    B.rows,        B.cols,        tol,   opt.eps, rows_name};
    bool all_kinks = false;
    for (Diagnosis& d : diagnose_jacobian(view, &all_kinks)) {
      d.input = block_name(names[ia], names[ib]);
      out.push_back(std::move(d));
    }
  }
  return out;
}

}  // namespace tapegrad::gradcheck_detail
