// The checker: finite differences against the VJP and JVP of every input, and the diagnosis of a failure.
#include "engine/gradcheck/jacobian.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <ostream>

#include <fmt/ranges.h>

#include "engine/rng.hpp"

namespace tapegrad {

using namespace gradcheck_detail;

namespace {

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

}  // namespace

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
      const size_t first_detail = details.size();  // this rule's findings start here
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
      auto view_of = [&] {
        return JacobianView{name(i), check, yshape, xshape, xs[i], y0,
                            is_vjp ? std::span<const double>(a_vjp) : std::span<const double>(a_jvp), numeric,
                            plus, minus, y0v, m, n, tol, opt.eps};
      };
      if (!a_vjp.empty()) {
        const JacobianView view = view_of();
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
      // No kind fits: say so, with where the error sits.
      if (!a_vjp.empty() && std::none_of(details.begin() + static_cast<std::ptrdiff_t>(first_detail), details.end(),
                                         [](const Diagnosis& d) { return d.kind != Finding::kink; })) {
        const JacobianView view = view_of();
        details.push_back(unexplained(view, failing_elements(view)));
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
