#include "engine/gradcheck/second_order.hpp"

#include <cmath>

#include <fmt/format.h>

#include "engine/rng.hpp"

namespace tapegrad {

namespace {

double dot(std::span<const Tensor> a, std::span<const Tensor> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (int64_t k = 0; k < a[i].numel(); ++k) s += a[i].item(k) * b[i].item(k);
  return s;
}

// H·dir for s = ⟨u, f(x)⟩ on a fresh tape; directions for the float inputs, in order.
std::vector<Tensor> hessian_times(const Function& f, std::span<const Tensor> x, const Tensor& u,
                                  std::span<const Tensor> directions, std::string* refused) {
  Tape tape;
  std::vector<Var> xs, wrt;
  for (const Tensor& t : x) {
    xs.push_back(tape.leaf(t, t.dtype() != DType::i32));
    if (t.dtype() != DType::i32) wrt.push_back(xs.back());
  }
  const Var y = f(tape, xs);
  try {
    return tape.hvp(y, u, wrt, directions).hvp;
  } catch (const Error& e) {
    *refused = e.what();
    return {};
  }
}

// ∇s at x + c·t (the float inputs moved along t).
std::vector<Tensor> gradient_at(const Function& f, std::span<const Tensor> x, std::span<const Tensor> t, double c,
                                const Tensor& u) {
  std::vector<Tensor> moved;
  size_t k = 0;
  for (const Tensor& xi : x) {
    if (xi.dtype() == DType::i32) {
      moved.push_back(xi);
      continue;
    }
    Tensor m = xi.clone();
    for (int64_t e = 0; e < m.numel(); ++e) m.data<double>()[e] += c * t[k].item(e);
    moved.push_back(m);
    ++k;
  }
  std::vector<Tensor> g = vjp(f, moved, u), out;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i].dtype() != DType::i32) out.push_back(g[i]);
  return out;
}

}  // namespace

GradcheckReport gradcheck_second_order(const Function& f, std::span<const Tensor> inputs,
                                       std::span<const std::string> names, const GradcheckOptions& opt) {
  GradcheckReport rep;
  std::vector<Tensor> x;
  std::vector<std::string> float_names;
  for (size_t i = 0; i < inputs.size(); ++i) {
    x.push_back(inputs[i].dtype() == DType::i32 ? inputs[i] : inputs[i].to(DType::f64));
    if (inputs[i].dtype() != DType::i32)
      float_names.push_back(i < names.size() ? names[i] : fmt::format("x{}", i));
  }
  Rng rng(opt.seed ^ 0x5ec0d0dull);
  const Tensor y = evaluate(f, x);
  const Tensor u = Tensor::randn(DType::f64, y.shape(), rng);
  std::vector<Tensor> v, w;
  for (const Tensor& xi : x)
    if (xi.dtype() != DType::i32) {
      v.push_back(Tensor::randn(DType::f64, xi.shape(), rng));
      w.push_back(Tensor::randn(DType::f64, xi.shape(), rng));
    }
  std::string refused;
  const std::vector<Tensor> hv = hessian_times(f, x, u, v, &refused);
  if (!refused.empty()) {
    for (const auto& name : float_names)
      rep.checks.push_back({.input = name, .check = "hvp", .mode = "none", .worst = refused, .skipped = true});
    rep.conclude();
    return rep;
  }
  const std::vector<Tensor> plus = gradient_at(f, x, v, opt.eps, u), minus = gradient_at(f, x, v, -opt.eps, u);
  for (size_t i = 0; i < hv.size(); ++i) {
    CheckResult r{.input = float_names[i], .check = "hvp", .mode = "full"};
    double worst_excess = -INFINITY;
    for (int64_t e = 0; e < hv[i].numel(); ++e) {
      const double a = hv[i].item(e), n = (plus[i].item(e) - minus[i].item(e)) / (2 * opt.eps);
      const double err = std::abs(a - n), rel = err / std::max(std::abs(n), 1e-12);
      r.max_abs_err = std::max(r.max_abs_err, err);
      r.max_rel_err = std::max(r.max_rel_err, std::min(rel, 1e5));
      const double excess = err - (opt.atol + opt.rtol * std::abs(n));
      if (excess > worst_excess) {
        worst_excess = excess;
        r.worst = fmt::format("(H t)[{}] of {}", e, float_names[i]);
        r.analytic = a, r.numeric = n;
      }
      if (excess > 0) r.passed = false;
    }
    rep.checks.push_back(r);
  }
  // ⟨w, H v⟩ = ⟨v, H w⟩ to rounding, relative to the Cauchy–Schwarz bounds of both sides.
  const std::vector<Tensor> hw = hessian_times(f, x, u, w, &refused);
  const double whv = dot(w, hv), vhw = dot(v, hw);
  const double bound = std::sqrt(dot(w, w) * dot(hv, hv)) + std::sqrt(dot(v, v) * dot(hw, hw));
  CheckResult sym{.input = "all", .check = "symmetry", .mode = "exact"};
  sym.max_abs_err = std::abs(whv - vhw);
  sym.max_rel_err = sym.max_abs_err / std::max(bound, 1e-300);
  sym.worst = "<w, H v> vs <v, H w>";
  sym.analytic = whv, sym.numeric = vhw;
  sym.passed = sym.max_rel_err <= 1e-10;
  rep.checks.push_back(sym);
  rep.conclude();
  return rep;
}

GradcheckReport gradcheck_second_order(const GradcheckCase& c, const GradcheckOptions& opt, std::string_view op) {
  if (c.at_kink) {  // f′ jumps there: the differences of the gradient see a δ, not f″
    GradcheckReport rep{.op = std::string(op), .case_name = c.name};
    rep.checks.push_back({.input = "all", .check = "hvp", .mode = "none",
                          .worst = "at a kink: not twice differentiable there", .skipped = true});
    rep.conclude();
    return rep;
  }
  return check_case([](const Function& f, std::span<const Tensor> x, std::span<const std::string> names,
                       const GradcheckOptions& o) { return gradcheck_second_order(f, x, names, o); },
                    c, opt, op);
}

}  // namespace tapegrad
