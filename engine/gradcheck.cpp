#include "engine/gradcheck.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/ranges.h>

#include "engine/rng.hpp"

namespace tapegrad {

namespace {

std::string index_str(const Shape& s, int64_t flat) {
  std::vector<int64_t> idx(static_cast<size_t>(s.rank()));
  for (int d = s.rank() - 1; d >= 0; --d) {
    idx[static_cast<size_t>(d)] = flat % s[d];
    flat /= s[d];
  }
  return fmt::format("[{}]", fmt::join(idx, ", "));
}

// Running maximum of |a − n| over compared elements, and the element closest to failing.
struct ErrorTracker {
  double atol, rtol;
  CheckResult r;
  double worst_ratio = -1;
  template <class Where>
  void add(double a, double n, Where&& where) {
    double err = std::abs(a - n);
    double ratio = err / (atol + rtol * std::abs(n));
    if (!(err <= atol + rtol * std::abs(n))) r.passed = false;  // NaN fails
    r.max_abs_err = std::max(r.max_abs_err, err);
    r.max_rel_err = std::max(r.max_rel_err, err / std::max(std::abs(n), atol));
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

}  // namespace

bool GradcheckReport::passed() const {
  return std::all_of(checks.begin(), checks.end(), [](const CheckResult& c) { return c.passed; });
}

std::string GradcheckReport::str() const {
  std::string s = fmt::format("{} / {}: {}\n", op, case_name, passed() ? "passed" : "FAILED");
  s += fmt::format("  {:<8} {:<10} {:<5} {:>11} {:>11}  {:<24} {}\n", "input", "check", "mode", "max_abs_err",
                   "max_rel_err", "worst element", "result");
  for (const auto& c : checks) {
    s += fmt::format("  {:<8} {:<10} {:<5} {:>11.2e} {:>11.2e}  {:<24} {}", c.input, c.check, c.mode,
                     c.max_abs_err, c.max_rel_err, c.worst, c.passed ? "ok" : "FAIL");
    if (!c.passed) s += fmt::format("  (analytic {:.6g}, numeric {:.6g})", c.analytic, c.numeric);
    s += "\n";
  }
  return s;
}

GradcheckReport gradcheck(const Function& f, std::span<const Tensor> inputs, std::span<const std::string> names,
                          const GradcheckOptions& opt) {
  std::vector<Tensor> xs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].dtype() == DType::f32)
      fail("gradcheck: input {} is float32; finite differences need float64 inputs", i);
    xs.push_back(inputs[i].clone());
  }
  auto name = [&](size_t i) { return i < names.size() ? names[i] : fmt::format("x{}", i); };
  GradcheckReport rep;
  const Tensor y0 = evaluate(f, xs);
  const Shape yshape = y0.shape();
  const int64_t m = y0.numel();
  Rng rng(opt.seed);

  // (f(x + ε·dir) − f(x − ε·dir)) / 2ε, with dir along input i.
  auto central_difference = [&](size_t i, const Tensor& dir) {
    double* x = xs[i].data<double>();
    const double* d = dir.data<double>();
    const int64_t n = xs[i].numel();
    Tensor saved = xs[i].clone();
    for (int64_t k = 0; k < n; ++k) x[k] += opt.eps * d[k];
    Tensor plus = evaluate(f, xs);
    for (int64_t k = 0; k < n; ++k) x[k] = saved.data<double>()[k] - opt.eps * d[k];
    Tensor minus = evaluate(f, xs);
    xs[i].copy_from(saved);
    Tensor out = Tensor::empty(DType::f64, yshape);
    for (int64_t j = 0; j < m; ++j)
      out.data<double>()[j] = (plus.data<double>()[j] - minus.data<double>()[j]) / (2 * opt.eps);
    return out;
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

  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i].dtype() != DType::f64) continue;
    const int64_t n = xs[i].numel();
    const Shape xshape = xs[i].shape();
    ErrorTracker vj{opt.atol, opt.rtol, {name(i), "vjp", "", 0, 0, "", 0, 0, true}};
    ErrorTracker jv{opt.atol, opt.rtol, {name(i), "jvp", "", 0, 0, "", 0, 0, true}};
    if (m * n <= opt.full_jacobian_limit) {
      vj.r.mode = jv.r.mode = "full";
      for (int64_t k = 0; k < n; ++k) {
        Tensor e = Tensor::zeros(DType::f64, xshape);
        e.data<double>()[k] = 1;
        Tensor numeric = central_difference(i, e);  // column k of J_i
        Tensor forward = tangent_on(i, e);
        auto where = [&](int64_t j) {
          return [&, j] { return fmt::format("y{} / {}{}", index_str(yshape, j), name(i), index_str(xshape, k)); };
        };
        for (int64_t j = 0; j < m; ++j) {
          double num = numeric.data<double>()[j];
          vj.add(rows[static_cast<size_t>(j)][i].item(k), num, where(j));
          jv.add(forward.data<double>()[j], num, where(j));
        }
      }
    } else {
      vj.r.mode = jv.r.mode = "fast";
      for (int p = 0; p < opt.projections; ++p) {
        Tensor v = random_like(xs[i], rng), u = random_like(y0, rng);
        Tensor numeric = central_difference(i, v);  // J_i v
        Tensor back = vjp(f, xs, u)[i];
        vj.add(dot(back, v), dot(u, numeric), [&] { return fmt::format("projection {}", p); });
        Tensor forward = tangent_on(i, v);
        for (int64_t j = 0; j < m; ++j)
          jv.add(forward.data<double>()[j], numeric.data<double>()[j],
                 [&] { return fmt::format("y{} (projection {})", index_str(yshape, j), p); });
      }
    }
    rep.checks.push_back(vj.r);
    rep.checks.push_back(jv.r);

    // ⟨J t, u⟩ = ⟨t, Jᵀu⟩, to rounding: the tolerance is relative to the Cauchy–Schwarz bound of each side.
    Tensor t = random_like(xs[i], rng), u = random_like(y0, rng);
    Tensor jt = tangent_on(i, t);
    Tensor ju = vjp(f, xs, u)[i];
    double lhs = dot(jt, u), rhs = dot(t, ju);
    double bound = 1e-10 * (norm(jt) * norm(u) + norm(t) * norm(ju)) + 1e-300;
    CheckResult adj{name(i), "adjoint", "exact", std::abs(lhs - rhs), std::abs(lhs - rhs) / std::max(std::abs(rhs), 1e-300),
                    "<J t, u> vs <t, J^T u>", lhs, rhs, std::abs(lhs - rhs) <= bound};
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
    CheckResult ac{name(i), "accumulate", "exact", 0, 0, "", 0, 0, true};
    double worst = -1;
    for (int64_t k = 0; k < n; ++k) {
      double got = acc.item(k) - r.item(k), want = ju.item(k);
      double err = std::abs(got - want);
      double tol = 1e-10 * (std::abs(r.item(k)) + std::abs(want)) + 1e-12;
      if (!(err <= tol)) ac.passed = false;
      ac.max_abs_err = std::max(ac.max_abs_err, err);
      ac.max_rel_err = std::max(ac.max_rel_err, err / std::max(std::abs(want), 1e-12));
      if (err / tol > worst) {
        worst = err / tol;
        ac.worst = fmt::format("{}{}", name(i), index_str(xshape, k));
        ac.analytic = got;
        ac.numeric = want;
      }
    }
    rep.checks.push_back(ac);
  }
  return rep;
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
  return rep;
}

}  // namespace tapegrad
