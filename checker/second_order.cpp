#include "checker/second_order.hpp"

#include <cmath>

#include <fmt/format.h>

#include "checker/jacobian.hpp"
#include "engine/rng.hpp"

namespace tapegrad {

namespace gradcheck_detail {

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

}  // namespace gradcheck_detail

namespace {

using namespace gradcheck_detail;

// A relative error where the numeric side is 0 is capped here, so that the table shows a number.
constexpr double kLargestRelativeError = 1e5;

double dot(std::span<const Tensor> a, std::span<const Tensor> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (int64_t k = 0; k < a[i].numel(); ++k) s += a[i].item(k) * b[i].item(k);
  return s;
}

// f(x) recorded twice and added by a node of the checker's own: its Hessian is 2H, and each node's rule adds
// into the same ẋ̄ as the other's (a rule that assigns there loses the other's term).
Var twice(const Function& f, Tape& tape, std::span<const Var> x) {
  const Var a = f(tape, x), b = f(tape, x);
  Tensor y = tape.empty(a.dtype(), a.shape());
  y.fill_zero();
  y.accumulate(a.value());
  y.accumulate(b.value());
  const Var ab[] = {a, b};
  return tape.record(
      "checker: f(x) + f(x)", ab, y,
      [](const Tensor& g, std::span<Tensor> gin) {
        for (Tensor& gi : gin)
          if (gi.defined()) gi.accumulate(g);
      },
      [](std::span<const Tensor> tin, Tensor& ty) {
        for (const Tensor& t : tin)
          if (t.defined()) ty.accumulate(t);
      },
      Tape::linear_in_inputs);
}

}  // namespace

GradcheckReport gradcheck_second_order(const Function& f, std::span<const Tensor> inputs,
                                       std::span<const std::string> names, const GradcheckOptions& opt,
                                       RuleBlocks* blocks) {
  validate(opt);
  GradcheckReport rep;
  std::vector<Tensor> x;
  std::vector<std::string> all_names, float_names;
  for (size_t i = 0; i < inputs.size(); ++i) {
    x.push_back(inputs[i].dtype() == DType::i32 ? inputs[i] : inputs[i].to(DType::f64));
    all_names.push_back(input_name(names, i));
    if (inputs[i].dtype() != DType::i32) float_names.push_back(all_names.back());
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
  bool hvp_ok = true;
  for (size_t i = 0; i < hv.size(); ++i) {
    CheckResult r{.input = float_names[i], .check = "hvp", .mode = "full", .worst = ""};
    double worst_excess = -INFINITY;
    for (int64_t e = 0; e < hv[i].numel(); ++e) {
      const double a = hv[i].item(e), n = (plus[i].item(e) - minus[i].item(e)) / (2 * opt.eps);
      const double err = std::abs(a - n), rel = err / std::max(std::abs(n), kExactAbsolute);
      r.max_abs_err = std::max(r.max_abs_err, err);
      r.max_rel_err = std::max(r.max_rel_err, std::min(rel, kLargestRelativeError));
      const double excess = err - (opt.atol + opt.rtol * std::abs(n));
      if (excess > worst_excess) {
        worst_excess = excess;
        r.worst = fmt::format("(H t)[{}] of {}", e, float_names[i]);
        r.analytic = a, r.numeric = n;
      }
      if (!(excess <= 0)) r.passed = false;
    }
    r.compared = hv[i].numel();
    if (r.compared == 0)
      r.passed = false, r.worst = fmt::format("nothing compared: {} has no elements", float_names[i]);
    hvp_ok = hvp_ok && r.passed;
    rep.checks.push_back(r);
  }
  // ⟨w, H v⟩ = ⟨v, H w⟩ to rounding, relative to the Cauchy–Schwarz bounds of both sides.
  const std::vector<Tensor> hw = hessian_times(f, x, u, w, &refused);
  const double whv = dot(w, hv), vhw = dot(v, hw);
  const double bound = std::sqrt(dot(w, w) * dot(hv, hv)) + std::sqrt(dot(v, v) * dot(hw, hw));
  CheckResult sym{.input = "all", .check = "symmetry", .mode = "exact", .worst = "<w, H v> vs <v, H w>"};
  sym.max_abs_err = std::abs(whv - vhw);
  sym.max_rel_err = sym.max_abs_err / std::max(bound, kNoDivisionByZero);
  sym.analytic = whv, sym.numeric = vhw;
  sym.analytic_is = "⟨w, H v⟩", sym.numeric_is = "⟨v, H w⟩";
  sym.compared = 1;
  sym.passed = sym.max_rel_err <= kExactRelative;
  rep.checks.push_back(sym);
  // The Hessian of f(x) + f(x), each recorded on its own, is 2·H: H·v again, doubled.
  const std::vector<Tensor> h2v =
      hessian_times([&f](Tape& tape, std::span<const Var> xs) { return twice(f, tape, xs); }, x, u, v, &refused);
  CheckResult acc{.input = "all", .check = "accumulate", .mode = "exact", .worst = ""};
  acc.analytic_is = "(H t) of f + f", acc.numeric_is = "2·(H t)";
  bool lost_one = true;  // H₂v = H·v: what a rule that assigns leaves
  double worst = -1;
  for (size_t i = 0; i < hv.size(); ++i)
    for (int64_t e = 0; e < hv[i].numel(); ++e) {
      const double got = h2v[i].item(e), want = 2 * hv[i].item(e);
      const double err = std::abs(got - want), tol = kExactRelative * std::abs(want) + kExactAbsolute;
      if (!(err <= tol)) acc.passed = false;
      lost_one = lost_one && std::abs(got - hv[i].item(e)) <= tol;
      acc.max_abs_err = std::max(acc.max_abs_err, err);
      acc.max_rel_err = std::max(acc.max_rel_err, err / std::max(std::abs(want), kExactAbsolute));
      if (err / tol > worst) {
        worst = err / tol;
        acc.worst = fmt::format("(H t)[{}] of {}", e, float_names[i]);
        acc.analytic = got, acc.numeric = want;
      }
    }
  for (const Tensor& h : hv) acc.compared += h.numel();
  rep.checks.push_back(acc);

  if (opt.diagnose) {
    if (!hvp_ok) rep.diagnoses = diagnose_second_order({f, x, all_names, opt, blocks}, u);
    if (hvp_ok && !sym.passed)
      rep.diagnoses.push_back(
          {Finding::asymmetric, "all", "symmetry",
           fmt::format("H·t agrees with the differences but ⟨w, H v⟩ = {:.9g} ≠ ⟨v, H w⟩ = {:.9g}: the rules of two "
                       "inputs' cross terms disagree by less than the differences resolve",
                       whv, vhw)});
    if (!acc.passed && lost_one)
      rep.diagnoses.push_back({Finding::overwrites, "all", "accumulate",
                               "with f(x) recorded twice, H·t is that of one f(x), not twice it: a second-order rule "
                               "assigns into ẋ̄ where it must add (a value used twice loses one of its terms)"});
  }
  rep.conclude();
  return rep;
}

GradcheckReport gradcheck_second_order(const GradcheckCase& c, const GradcheckOptions& opt, std::string_view op) {
  if (c.at_kink) {  // f′ jumps there: the differences of the gradient see a δ, not f″
    GradcheckReport rep{
        .op = std::string(op), .case_name = c.name, .checks = {}, .diagnoses = {}, .notes = {}, .passed = {}};
    rep.checks.push_back({.input = "all",
                          .check = "hvp",
                          .mode = "none",
                          .worst = "at a kink: not twice differentiable there",
                          .skipped = true});
    rep.conclude();
    return rep;
  }
  return check_case([](const Function& f, std::span<const Tensor> x, std::span<const std::string> names,
                       const GradcheckOptions& o) { return gradcheck_second_order(f, x, names, o); },
                    c, opt, op);
}

}  // namespace tapegrad
