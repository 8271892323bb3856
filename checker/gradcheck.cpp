// The checker: finite differences against the VJP and JVP of every input, and the diagnosis of a failure.
#include "checker/jacobian.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <ostream>

#include <fmt/ranges.h>

#include "engine/rng.hpp"

namespace tapegrad {

using namespace gradcheck_detail;

namespace {

// Linearity in ȳ (or ẋ) in float64: x̄(ȳ₁ + ȳ₂) − x̄(ȳ₁) − x̄(ȳ₂) within this part of their size.
constexpr double kLinearRelative = 1e-8;
// Doubling ȳ scales x̄ by 2^degree; a degree within this of a whole number is read as that number (0: ȳ unused).
constexpr double kWholeDegree = 0.01;
// Errors within this part of the largest derivative are the central differences' own (their rounding, about
// 1e-16·|f|/ε, is 1e-10 at ε = 1e-6; their truncation ε²·|f‴|/6), not the rule's.
constexpr double kDifferencesOwnError = 1e-7;
// A random direction whose step crosses a kink is drawn again at most this many times.
constexpr int kKinkRedraws = 3;
// The seed of the shared cotangents' generator is the check's seed with these bits flipped: a stream of its own.
constexpr uint64_t kSharedStream = 0x5a4e0c07ull;

// Running maximum of |a − n| over compared elements, and the element closest to failing.
struct ErrorTracker {
  Tolerance tol;
  CheckResult r;
  double worst_ratio = -1;
  template <class Where>
  void add(double a, double n, Where&& where) {
    double err = std::abs(a - n);
    double ratio = err / (tol.atol + tol.rtol * std::abs(n));
    ++r.compared;
    if (!tol.ok(a, n)) r.passed = false;
    r.max_abs_err = std::max(r.max_abs_err, err);
    r.max_rel_err = std::max(r.max_rel_err, err / std::max(std::abs(n), tol.atol));
    if (std::isnan(err)) ratio = INFINITY, r.max_abs_err = r.max_rel_err = NAN;
    else if (!std::isfinite(n)) ratio = INFINITY;  // an infinite difference quotient explains nothing
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      r.worst = where();
      r.analytic = a;
      r.numeric = n;
    }
  }
};

Tensor random_like(const Tensor& x, Rng& rng) { return Tensor::randn(DType::f64, x.shape(), rng); }

double dot(const Tensor& a, const Tensor& b) {  // both float64
  const double *pa = a.data<double>(), *pb = b.data<double>();
  double s = 0;
  for (int64_t k = 0; k < a.numel(); ++k) s += pa[k] * pb[k];
  return s;
}
double norm(const Tensor& a) { return std::sqrt(dot(a, a)); }

// One input's VJP and JVP against finite differences. Full mode keeps the Jacobians, (m, n) row-major, for the
// diagnosis; fast mode keeps the projections.
struct Comparison {
  ErrorTracker vjp, jvp;
  bool unit_rows_ok = true;  // full mode: the VJP of every unit ȳ agrees (a failing row is then the random ȳ's)
  std::vector<double> a_vjp{}, a_jvp{}, numeric{}, plus{}, minus{};  // full mode
  std::vector<double> fa_vjp{}, fn_vjp{}, fa_jvp{}, fn_jvp{};        // fast mode
  std::vector<char> crossed{};  // fast mode, per projection: its every direction drawn crossed a kink
  bool full() const { return !a_vjp.empty(); }
};

// gradcheck() of one function at one point: each float64 input in turn is compared (VJP, JVP), checked for the
// adjoint identity and for accumulation, and diagnosed when it fails; the draws from the Rng come in that order.
class Checker {
 public:
  Checker(const Function& f, std::span<const Tensor> inputs, std::span<const std::string> names,
          const GradcheckOptions& opt, bool may_narrow = true, RuleBlocks* blocks = nullptr)
      : f_(f),
        names_(names),
        opt_(opt),
        tol_{opt.atol, opt.rtol},
        rng_(opt.seed),
        may_narrow_(may_narrow),
        blocks_(blocks) {
    validate(opt);
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].dtype() == DType::f32)
        fail("gradcheck: input {} is float32; finite differences need float64 inputs", i);
      xs_.push_back(inputs[i].clone());
    }
    y0_ = evaluate(f_, xs_);
    m_ = y0_.numel();
  }

  GradcheckReport run() {
    rows_ = full_rows();
    for (size_t i = 0; i < xs_.size(); ++i)
      if (xs_[i].dtype() == DType::f64) check_input(i);
    if (!failed_by_projections_.empty() && opt_.diagnose && may_narrow_) narrow();
    GradcheckReport rep;
    rep.checks = std::move(checks_);
    rep.diagnoses = which_rule_and_input(outcomes_, no_jvp_op_);
    for (auto& d : details_) rep.diagnoses.push_back(std::move(d));
    rep.conclude();
    return rep;
  }

 private:
  struct Differences {
    Tensor central, plus, minus;
  };

  std::string name(size_t i) const { return input_name(names_, i); }
  const Shape& yshape() const { return y0_.shape(); }

  // (f(x + ε·dir) − f(x − ε·dir)) / 2ε from the two values.
  Differences central(Tensor plus, Tensor minus) const {
    Differences r{Tensor::empty(DType::f64, yshape()), std::move(plus), std::move(minus)};
    for (int64_t j = 0; j < m_; ++j)
      r.central.data<double>()[j] = (r.plus.data<double>()[j] - r.minus.data<double>()[j]) / (2 * opt_.eps);
    return r;
  }
  // f(x ± ε·dir) with dir along input i, and the central difference between them.
  Differences differences(size_t i, const Tensor& dir) {
    double* x = xs_[i].data<double>();
    const double* d = dir.data<double>();
    const int64_t n = xs_[i].numel();
    Tensor saved = xs_[i].clone();
    for (int64_t k = 0; k < n; ++k) x[k] += opt_.eps * d[k];
    Tensor plus = evaluate(f_, xs_);
    for (int64_t k = 0; k < n; ++k) x[k] = saved.data<double>()[k] - opt_.eps * d[k];
    Tensor minus = evaluate(f_, xs_);
    xs_[i].copy_from(saved);
    return central(std::move(plus), std::move(minus));
  }
  Tensor tangent_on(size_t i, const Tensor& t) {  // J_i t
    std::vector<Tensor> ts(xs_.size());
    ts[i] = t;
    return jvp(f_, xs_, ts).second;
  }
  Tensor cotangent_on(size_t i, const Tensor& u) { return vjp(f_, xs_, u)[i]; }  // J_iᵀu

  // Rows of every Jacobian small enough to check in full: rows[j][i] = J_iᵀ e_j, undefined for the inputs checked by
  // projections (their m rows of x_i's size each would cost m·|x_i|: a cut's 32768 rows of a 32768-element x beside
  // a scalar checked in full are 8 GB).
  // Sets full_: which inputs are checked in full.
  std::vector<std::vector<Tensor>> full_rows() {
    std::vector<bool>& full = full_;
    full.assign(xs_.size(), false);
    for (size_t i = 0; i < xs_.size(); ++i)
      full[i] = xs_[i].dtype() == DType::f64 && m_ * xs_[i].numel() <= opt_.full_jacobian_limit;
    std::vector<std::vector<Tensor>> rows;
    if (std::none_of(full.begin(), full.end(), [](bool b) { return b; })) return rows;
    if (blocks_) {
      // A limit other than the default asks for full Jacobians whatever their rows cost (fast_mode=False, a check
      // made to name a failure); under the default the blocks say which rows are worth reading.
      if (opt_.full_jacobian_limit == GradcheckOptions{}.full_jacobian_limit)
        full = blocks_->full_worth_its_cost(xs_, yshape(), full);
      if (full.size() != xs_.size()) fail("gradcheck: full_worth_its_cost must say yes or no for each input");
      if (std::none_of(full.begin(), full.end(), [](bool b) { return b; })) return rows;
      return blocks_->vjp_rows(xs_, yshape(), full);
    }
    for (int64_t j = 0; j < m_; ++j) {
      Tensor e = Tensor::zeros(DType::f64, yshape());
      e.data<double>()[j] = 1;
      std::vector<Tensor> row = vjp(f_, xs_, e);
      for (size_t i = 0; i < row.size(); ++i)
        if (!full[i]) row[i] = Tensor{};
      rows.push_back(std::move(row));
    }
    return rows;
  }

  void check_input(size_t i) {
    // Forward mode on a random tangent: also tells whether the op has a JVP at all. At size, where several inputs
    // are checked, u is the one they share (shared_cotangents).
    const bool full = full_[i], own = full || !shares_cotangents();
    Tensor t = random_like(xs_[i], rng_), u = own ? random_like(y0_, rng_) : shared_cotangents().u;
    Tensor jt;
    try {
      jt = tangent_on(i, t);
    } catch (const NoJvp& e) {
      no_jvp_op_ = e.op;
    }
    const bool has_jvp = jt.defined();
    Comparison c{{tol_, {name(i), "vjp", "", 0, 0, "", 0, 0, true, false}},
                 {tol_, {name(i), "jvp", "", 0, 0, "", 0, 0, true, false}}};
    if (full) {
      compare_full(i, has_jvp, c);
      compare_random_cotangent(i, c);
    } else {
      compare_fast(i, has_jvp, c);
      if (!c.vjp.r.passed || !c.jvp.r.passed) failed_by_projections_.push_back(i);
    }
    if (!has_jvp) c.jvp.r.mode = "none", c.jvp.r.skipped = true;
    for (CheckResult* r : {&c.vjp.r, &c.jvp.r})
      if (!r->skipped && r->compared == 0) {  // an input or output with no elements: nothing to compare
        r->passed = false;
        r->worst = fmt::format("nothing compared: {} has no elements", xs_[i].numel() == 0 ? name(i) : "y");
      }
    checks_.push_back(c.vjp.r);
    checks_.push_back(c.jvp.r);

    const Tensor ju = own ? cotangent_on(i, u) : shared_cotangents().u_back[i];
    const CheckResult adj = adjoint(i, t, jt, u, ju);
    checks_.push_back(adj);
    checks_.push_back(own ? accumulation(i, u, ju) : accumulation_at_size(i));

    outcomes_.push_back({name(i), c.vjp.r.passed, c.jvp.r.passed, c.jvp.r.skipped, adj.passed, false});
    if (!opt_.diagnose || (c.vjp.r.passed && c.jvp.r.passed && adj.passed)) return;
    outcomes_.back().explained = diagnose(i, c, has_jvp, adj.passed);
  }

  // Every element of J_i: column k from f(x ± εe_k), row j from the VJP of e_j, column k from the JVP of e_k.
  void compare_full(size_t i, bool has_jvp, Comparison& c) {
    const int64_t n = xs_[i].numel();
    const Shape& xshape = xs_[i].shape();
    c.vjp.r.mode = c.jvp.r.mode = "full";
    const size_t mn = static_cast<size_t>(m_ * n);
    c.a_vjp.resize(mn), c.numeric.resize(mn), c.plus.resize(mn), c.minus.resize(mn);
    if (has_jvp) c.a_jvp.resize(mn);
    std::vector<double> steps_plus, steps_minus;  // from the blocks: row k is f(x ± εe_k)
    if (blocks_) {
      steps_plus.resize(mn), steps_minus.resize(mn);
      blocks_->unit_steps(xs_, i, opt_.eps, yshape(), steps_plus, steps_minus);
    }
    auto step = [&](const std::vector<double>& steps, int64_t k) {
      Tensor y = Tensor::empty(DType::f64, yshape());
      std::copy_n(steps.begin() + k * m_, m_, y.data<double>());
      return y;
    };
    for (int64_t k = 0; k < n; ++k) {
      Tensor e = Tensor::zeros(DType::f64, xshape);
      e.data<double>()[k] = 1;
      Differences d = blocks_ ? central(step(steps_plus, k), step(steps_minus, k)) : differences(i, e);  // column k
      Tensor forward = has_jvp ? tangent_on(i, e) : Tensor{};
      auto where = [&](int64_t j) {
        return [&, j] { return fmt::format("y{} / {}{}", index_str(yshape(), j), name(i), index_str(xshape, k)); };
      };
      for (int64_t j = 0; j < m_; ++j) {
        const size_t at = static_cast<size_t>(j * n + k);
        c.numeric[at] = d.central.data<double>()[j];
        c.plus[at] = d.plus.data<double>()[j];
        c.minus[at] = d.minus.data<double>()[j];
        c.a_vjp[at] = rows_[static_cast<size_t>(j)][i].item(k);
        c.vjp.add(c.a_vjp[at], c.numeric[at], where(j));
        if (has_jvp) {
          c.a_jvp[at] = forward.data<double>()[j];
          c.jvp.add(c.a_jvp[at], c.numeric[at], where(j));
        }
      }
    }
  }

  // The unit cotangents e_j cannot tell ȳ from ȳ² or from 1: x̄ for one random ȳ must be Nᵀȳ = Σ_j ȳ_j N_j·, each
  // element within Σ_j |ȳ_j|(atol + rtol·|N_jk|), the bound the unit rows' own tolerances add up to. Its draw comes
  // from a generator of its own, so the rest of the check sees the same random numbers as without it, and one
  // backward gives every input's x̄ for it. The vjp row keeps the unit rows' errors and fails, at the element, if
  // this comparison fails.
  void compare_random_cotangent(size_t i, Comparison& c) {
    const int64_t n = xs_[i].numel();
    c.unit_rows_ok = c.vjp.r.passed;
    if (!c.unit_rows_ok || n == 0 || m_ == 0) return;
    random_cotangent();
    const double* u = random_u_.data<double>();
    const Tensor& a = random_vjp_[i];
    for (int64_t k = 0; k < n; ++k) {
      double want = 0, bound = 0;
      for (int64_t j = 0; j < m_; ++j) {
        const double nk = c.numeric[static_cast<size_t>(j * n + k)], uj = u[j];
        want += uj * nk;
        bound += std::abs(uj) * (tol_.atol + tol_.rtol * std::abs(nk));
      }
      const double got = a.item(k), err = std::abs(got - want);
      if (std::isfinite(got) && err <= bound) continue;
      c.vjp.r.passed = false;
      c.vjp.r.max_abs_err = std::max(c.vjp.r.max_abs_err, err);
      c.vjp.r.max_rel_err = std::max(c.vjp.r.max_rel_err, err / std::max(std::abs(want), tol_.atol));
      c.vjp.r.worst = fmt::format("random ȳ, {}{}", name(i), index_str(xs_[i].shape(), k));
      c.vjp.r.analytic = got;
      c.vjp.r.numeric = want;
      return;
    }
  }

  // Whether the inputs share their cotangents at size: with one float64 input there is nothing to share, and its ȳ
  // are drawn from the check's own generator, after its directions, as the check of one input draws them.
  bool shares_cotangents() const {
    return std::count_if(xs_.begin(), xs_.end(), [](const Tensor& x) { return x.dtype() == DType::f64; }) > 1;
  }
  // At size, the cotangents are shared by the inputs: one backward gives every input's x̄ for a ȳ, where one per
  // input would cost a backward each (the forwards, one pair per input and direction, cannot be shared). They are
  // drawn from a generator of their own: u, the adjoint's and the accumulation's, is the full check's random ȳ;
  // then w_p, one per projection; then r_i, the gradient each input holds before the accumulation's backward.
  struct SharedCotangents {
    Tensor u;
    std::vector<Tensor> u_back;               // J_iᵀu for every input
    std::vector<Tensor> w;                    // the projections' ȳ
    std::vector<std::vector<Tensor>> w_back;  // [p][i]: J_iᵀw_p
    std::vector<Tensor> r, after;             // [i]: the gradient before the backward with ȳ = u, and after it
  };
  const SharedCotangents& shared_cotangents() {
    if (shared_) return *shared_;
    SharedCotangents s;
    random_cotangent();
    s.u = random_u_, s.u_back = random_vjp_;
    Rng rng(opt_.seed ^ kSharedStream);
    for (int p = 0; p < opt_.projections; ++p) {
      s.w.push_back(random_like(y0_, rng));
      s.w_back.push_back(vjp(f_, xs_, s.w.back()));
    }
    // One backward with every float64 input as a gradient that already holds r_i.
    Tape tape;
    std::vector<Var> vars;
    for (const Tensor& x : xs_) {
      const bool f64 = x.dtype() == DType::f64;
      s.r.push_back(f64 ? random_like(x, rng) : Tensor{});
      s.after.push_back(f64 ? s.r.back().clone() : Tensor{});
      vars.push_back(f64 ? tape.param(x, s.after.back()) : tape.leaf(x, x.dtype() != DType::i32));
    }
    Var y = f_(tape, vars);
    if (y.requires_grad()) tape.backward(y, s.u);
    shared_ = std::move(s);
    return *shared_;
  }
  // The full check's random ȳ and every input's x̄ for it, drawn once.
  void random_cotangent() {
    if (random_u_.defined()) return;
    Rng rng(opt_.seed ^ 0xc07a6e47ull);
    random_u_ = random_like(y0_, rng);
    random_vjp_ = vjp(f_, xs_, random_u_);
  }

  // Random projections: ⟨w, J v⟩ against ⟨Jᵀw, v⟩ for the VJP, J v element by element for the JVP. A direction
  // whose step ±εv crosses a kink of f (a relu's zero within ε of x along v) has one-sided slopes that disagree by
  // about the error (kink_explains): it says nothing of the rule at x, and another is drawn, up to kKinkRedraws
  // times (a point at a kink itself fails along every direction).
  void compare_fast(size_t i, bool has_jvp, Comparison& c) {
    c.vjp.r.mode = c.jvp.r.mode = "fast";
    const bool shared = shares_cotangents();
    for (int p = 0; p < opt_.projections; ++p) {
      Tensor w, back;  // ȳ, and J_iᵀȳ
      if (shared) {
        w = shared_cotangents().w[static_cast<size_t>(p)];
        back = std::move(shared_->w_back[static_cast<size_t>(p)][i]);  // each input reads its own once
      }
      double w_y0 = 0, analytic = 0, numeric = 0;
      Tensor numeric_v, forward;  // J_i v from the differences, and from forward mode
      bool crossed = true;
      for (int draw = 0; draw <= kKinkRedraws && crossed; ++draw) {
        const Tensor v = random_like(xs_[i], rng_);
        if (!w.defined()) {  // one input: its own ȳ, drawn after its first v
          w = random_like(y0_, rng_);
          back = cotangent_on(i, w);
        }
        if (draw == 0) w_y0 = dot(w, y0_);
        const Differences d = differences(i, v);
        numeric_v = d.central;
        analytic = dot(back, v), numeric = dot(w, numeric_v);
        forward = has_jvp ? tangent_on(i, v) : Tensor{};
        crossed = crosses_kink(d, w_y0, w, analytic, numeric, forward);
      }
      c.crossed.push_back(crossed);
      c.fa_vjp.push_back(analytic);
      c.fn_vjp.push_back(numeric);
      c.vjp.add(analytic, numeric, [&] { return fmt::format("projection {}", p); });
      if (!has_jvp) continue;
      for (int64_t j = 0; j < m_; ++j) {
        c.fa_jvp.push_back(forward.data<double>()[j]);
        c.fn_jvp.push_back(numeric_v.data<double>()[j]);
        c.jvp.add(c.fa_jvp.back(), c.fn_jvp.back(),
                  [&] { return fmt::format("y{} (projection {})", index_str(yshape(), j), p); });
      }
    }
  }
  // Whether the step along a direction crossed a kink: the projection ⟨w, ·⟩, or an element of the JVP where there
  // is one, fails by what its one-sided slopes disagree by.
  bool crosses_kink(const Differences& d, double w_y0, const Tensor& w, double analytic, double numeric,
                    const Tensor& forward) const {
    if (!tol_.ok(analytic, numeric) && kink_explains(analytic, numeric, (dot(w, d.plus) - w_y0) / opt_.eps,
                                                     (w_y0 - dot(w, d.minus)) / opt_.eps, tol_, 1))
      return true;
    if (!forward.defined()) return false;
    const double *a = forward.data<double>(), *n = d.central.data<double>(), *plus = d.plus.data<double>(),
                 *minus = d.minus.data<double>(), *y = y0_.data<double>();
    for (int64_t j = 0; j < m_; ++j)
      if (!tol_.ok(a[j], n[j]) &&
          kink_explains(a[j], n[j], (plus[j] - y[j]) / opt_.eps, (y[j] - minus[j]) / opt_.eps, tol_, 1))
        return true;
    return false;
  }

  // ⟨J t, u⟩ = ⟨t, Jᵀu⟩, to rounding: the tolerance is relative to the Cauchy–Schwarz bound of each side.
  CheckResult adjoint(size_t i, const Tensor& t, const Tensor& jt, const Tensor& u, const Tensor& ju) const {
    CheckResult adj{name(i), "adjoint", "exact", 0, 0, "<J t, u> vs <t, J^T u>", 0, 0, true, false};
    if (!jt.defined()) {
      adj.mode = "none", adj.worst = "", adj.skipped = true;
      return adj;
    }
    double lhs = dot(jt, u), rhs = dot(t, ju);
    double bound = (kExactRelative + opt_.rounding) * (norm(jt) * norm(u) + norm(t) * norm(ju)) + kNoDivisionByZero;
    adj.max_abs_err = std::abs(lhs - rhs);
    adj.max_rel_err = std::abs(lhs - rhs) / std::max({std::abs(lhs), std::abs(rhs), kNoDivisionByZero});
    adj.analytic = lhs, adj.numeric = rhs;
    adj.analytic_is = "⟨J t, u⟩", adj.numeric_is = "⟨t, Jᵀu⟩";
    adj.compared = 1;
    adj.passed = std::isfinite(lhs) && std::isfinite(rhs) && std::abs(lhs - rhs) <= bound;
    return adj;
  }

  // Backward must add into a gradient that already holds r: after backward it holds r + J_iᵀu.
  CheckResult accumulation(size_t i, const Tensor& u, const Tensor& ju) {
    Tensor r = random_like(xs_[i], rng_);
    Tensor acc = r.clone();
    {
      Tape tape;
      std::vector<Var> vars;
      for (size_t q = 0; q < xs_.size(); ++q)
        vars.push_back(q == i ? tape.param(xs_[q], acc) : tape.leaf(xs_[q], xs_[q].dtype() != DType::i32));
      Var y = f_(tape, vars);
      if (y.requires_grad()) tape.backward(y, u);
    }
    return judge_accumulation(i, r, acc, ju);
  }
  // At size, from the one backward the inputs share.
  CheckResult accumulation_at_size(size_t i) {
    const SharedCotangents& s = shared_cotangents();
    return judge_accumulation(i, s.r[i], s.after[i], s.u_back[i]);
  }
  // The gradient held r before backward and acc after: acc − r against J_iᵀu.
  CheckResult judge_accumulation(size_t i, const Tensor& r, const Tensor& acc, const Tensor& ju) {
    const int64_t n = xs_[i].numel();
    CheckResult ac{name(i), "accumulate", "exact", 0, 0, "", 0, 0, true, false};
    ac.analytic_is = "added", ac.numeric_is = "Jᵀu";  // what backward added to the gradient it found, and J_iᵀu
    double worst = -1;
    bool lost_r = true;  // acc = J_iᵀu: what an assignment leaves
    ac.compared = n;
    for (int64_t k = 0; k < n; ++k) {
      double got = acc.item(k) - r.item(k), want = ju.item(k);
      double err = std::abs(got - want);
      double tol_k = kExactRelative * (std::abs(r.item(k)) + std::abs(want)) + kExactAbsolute;
      if (!(err <= tol_k)) ac.passed = false;
      lost_r = lost_r && std::abs(acc.item(k) - want) <= tol_k;
      ac.max_abs_err = std::max(ac.max_abs_err, err);
      ac.max_rel_err = std::max(ac.max_rel_err, err / std::max(std::abs(want), kExactAbsolute));
      if (err / tol_k > worst) {
        worst = err / tol_k;
        ac.worst = fmt::format("{}{}", name(i), index_str(xs_[i].shape(), k));
        ac.analytic = got;
        ac.numeric = want;
      }
    }
    if (!ac.passed && lost_r)
      details_.push_back({Finding::overwrites, name(i), "accumulate",
                          "after backward the gradient holds J_iᵀȳ alone, not r + J_iᵀȳ: the VJP assigns into x̄ "
                          "where it must add (a value used twice would lose one of its gradients)"});
    return ac;
  }

  // What the failure of input i looks like, rule by rule; true when every failing rule is explained by kinks or
  // by the tolerance (nothing to say about the rules).
  bool diagnose(size_t i, const Comparison& c, bool has_jvp, bool adjoint_ok) {
    int rules_failed = 0, rules_explained = 0;
    for (bool is_vjp : {true, false}) {
      const CheckResult& res = is_vjp ? c.vjp.r : c.jvp.r;
      // With one-hot cotangents a rule that is not linear can pass element by element (ȳ² = ȳ on e_j):
      // a failing adjoint identity is reason enough to test linearity.
      if (res.passed && (adjoint_ok || (!is_vjp && !has_jvp))) continue;
      rules_failed += !res.passed;
      const std::string check = is_vjp ? "vjp" : "jvp";
      const size_t first_detail = details_.size();  // this rule's findings start here
      if (auto d = nonlinearity(i, is_vjp)) details_.push_back(std::move(*d));
      if (res.passed) continue;
      if (res.compared == 0) {  // an input without elements: its row says nothing was compared, and no finding
        ++rules_explained;      // (which rule, which input) is read from nothing
        continue;
      }
      if (auto d = beyond_resolution(i, res, c)) {
        details_.push_back(std::move(*d));
        ++rules_explained;
        continue;
      }
      if (is_vjp && c.full() && c.unit_rows_ok) continue;  // only the random ȳ failed: the Jacobian itself agrees
      if (c.full()) {
        const JacobianView view = view_of(i, check, is_vjp ? c.a_vjp : c.a_jvp, c);
        bool all_kinks = false;
        for (auto& d : diagnose_jacobian(view, &all_kinks)) details_.push_back(std::move(d));
        rules_explained += all_kinks;
        if (all_kinks) continue;
      } else if (auto kinked = kinks_crossed(i, check, c)) {
        details_.push_back(std::move(*kinked));
        ++rules_explained;
        continue;
      } else if (auto d = is_vjp ? diagnose_values(name(i), check, c.fa_vjp, c.fn_vjp, tol_)
                                 : diagnose_values(name(i), check, c.fa_jvp, c.fn_jvp, tol_)) {
        details_.push_back(*d);
      }
      if (!is_vjp)
        if (auto d = radial(i)) details_.push_back(std::move(*d));
      // No kind fits: say so, with where the error sits.
      if (c.full() && std::none_of(details_.begin() + static_cast<std::ptrdiff_t>(first_detail), details_.end(),
                                   [](const Diagnosis& d) { return d.kind != Finding::kink; })) {
        const JacobianView view = view_of(i, check, is_vjp ? c.a_vjp : c.a_jvp, c);
        details_.push_back(unexplained(view, failing_elements(view)));
      }
    }
    return rules_failed > 0 && rules_explained == rules_failed;
  }

  // Random projections that fail only where each direction drawn crossed a kink: the point sits within a step of one.
  std::optional<Diagnosis> kinks_crossed(size_t i, const std::string& check, const Comparison& c) const {
    const bool is_vjp = check == "vjp";
    const size_t per = is_vjp ? 1 : static_cast<size_t>(m_);  // compared values per projection
    const std::vector<double>& a = is_vjp ? c.fa_vjp : c.fa_jvp;
    const std::vector<double>& n = is_vjp ? c.fn_vjp : c.fn_jvp;
    int failing = 0;
    for (size_t p = 0; p < c.crossed.size(); ++p) {
      bool fails = false;
      for (size_t e = p * per; e < (p + 1) * per && e < a.size(); ++e) fails = fails || !tol_.ok(a[e], n[e]);
      if (fails && !c.crossed[p]) return std::nullopt;
      failing += fails;
    }
    if (failing == 0) return std::nullopt;
    return Diagnosis{Finding::kink, name(i), check,
                     fmt::format("{} of the {} random projections fail, and along each of the {} directions drawn "
                                 "for each of them the step ±ε·v crosses a kink of f (its one-sided slopes differ by "
                                 "about the error): {} sits within a step of a point where f is not differentiable, "
                                 "and the failure says nothing of the rule. Check away from it",
                                 failing, c.crossed.size(), kKinkRedraws + 1, name(i))};
  }

  JacobianView view_of(size_t i, const std::string& check, std::span<const double> a, const Comparison& c) const {
    return JacobianView{name(i),
                        check,
                        yshape(),
                        xs_[i].shape(),
                        xs_[i],
                        y0_,
                        a,
                        c.numeric,
                        c.plus,
                        c.minus,
                        std::span<const double>(y0_.data<double>(), static_cast<size_t>(m_)),
                        m_,
                        xs_[i].numel(),
                        tol_,
                        opt_.eps};
  }

  // Linearity: x̄(ȳ₁ + ȳ₂) = x̄(ȳ₁) + x̄(ȳ₂) and x̄(2ȳ) = 2x̄(ȳ) (likewise ẏ in ẋ).
  std::optional<Diagnosis> nonlinearity(size_t i, bool is_vjp) {
    Tensor p = is_vjp ? random_like(y0_, rng_) : random_like(xs_[i], rng_);
    Tensor q = is_vjp ? random_like(y0_, rng_) : random_like(xs_[i], rng_);
    Tensor pq = p.clone(), p2 = p.clone();
    pq.accumulate(q);
    p2.accumulate(p);
    auto apply = [&](const Tensor& s) { return is_vjp ? cotangent_on(i, s) : tangent_on(i, s); };
    Tensor rp = apply(p), rq = apply(q), rpq = apply(pq), rp2 = apply(p2);
    double add_err = 0;
    for (int64_t e = 0; e < rpq.numel(); ++e)
      add_err = std::max(add_err, std::abs(rpq.item(e) - rp.item(e) - rq.item(e)));
    const double size = std::max(norm(rp) + norm(rq), kNoDivisionByZero);
    // At a working precision (rounding > 0) each of the three results x̄(ȳ₁ + ȳ₂), x̄(ȳ₁), x̄(ȳ₂) may be off by the
    // rounding, relative, and by atol, the measured bound (ȳ₁ + ȳ₂ is about √2 times ȳ: 1 + 1 + √2 < 4).
    const double allowed =
        (kLinearRelative + 3 * opt_.rounding) * size + kExactAbsolute + (opt_.rounding > 0 ? 4 * opt_.atol : 0);
    if (!(add_err > allowed)) return std::nullopt;
    const double ratio = norm(rp2) / std::max(norm(rp), kNoDivisionByZero);
    const double degree = std::log2(ratio);
    if (is_vjp && std::abs(degree) < kWholeDegree && norm(rp) > 0)
      return Diagnosis{Finding::ignores_cotangent, name(i), "vjp",
                       fmt::format("x̄ is the same for every ȳ (doubling ȳ scales it by {:.4g}, and x̄(ȳ₁ + ȳ₂) is "
                                   "not x̄(ȳ₁) + x̄(ȳ₂)): the backward does not multiply by ȳ (grad_output); it "
                                   "returns the gradient for ȳ = 1",
                                   ratio)};
    const char* what = is_vjp ? "x̄ is not linear in ȳ: x̄(ȳ₁ + ȳ₂) − x̄(ȳ₁) − x̄(ȳ₂)"
                              : "ẏ is not linear in ẋ: ẏ(ẋ₁ + ẋ₂) − ẏ(ẋ₁) − ẏ(ẋ₂)";
    const char* of = is_vjp ? "ȳ" : "ẋ";
    std::string deg = std::abs(degree - std::round(degree)) < kWholeDegree
                          ? fmt::format(" (degree {:.0f} in {}{})", std::round(degree), of,
                                        std::round(degree) >= 2 ? ": a product of several of its terms" : "")
                          : "";
    return Diagnosis{Finding::nonlinear, name(i), is_vjp ? "vjp" : "jvp",
                     fmt::format("{} is {:.3g} of their size, and doubling {} scales the result by {:.4g}{}; a {} "
                                 "must be linear in {}, so this rule is not a derivative at all",
                                 what, add_err / size, of, ratio, deg, is_vjp ? "VJP" : "JVP", of)};
  }

  // Errors at the level of the finite differences' own: the tolerance asks more than they can resolve.
  std::optional<Diagnosis> beyond_resolution(size_t i, const CheckResult& res, const Comparison& c) const {
    if (opt_.rounding > 0) return std::nullopt;  // the tolerance is the rounding's, not the differences'
    const bool is_vjp = res.check == "vjp";
    const std::span<const double> ref = c.full() ? std::span<const double>(c.numeric)
                                        : is_vjp ? std::span<const double>(c.fn_vjp)
                                                 : std::span<const double>(c.fn_jvp);
    double scale = 1;
    for (double e : ref) scale = std::max(scale, std::abs(e));
    if (!(res.max_abs_err <= kDifferencesOwnError * scale)) return std::nullopt;  // NaN too
    return Diagnosis{Finding::tolerance, name(i), res.check,
                     fmt::format("the largest error, {:.3g}, is {:.2g} of the largest derivative: what central "
                                 "differences with ε = {:g} are off by themselves (rounding ≈ 1e-16·|f|/ε, "
                                 "truncation ≈ ε²·|f‴|/6); the tolerance (atol {:g}, rtol {:g}) asks for more "
                                 "than the check can resolve, nothing says the rule is wrong",
                                 res.max_abs_err, res.max_abs_err / scale, opt_.eps, tol_.atol, tol_.rtol)};
  }

  // The direction ẋ = x: right there and wrong elsewhere is a rule that holds only for tangents along x.
  std::optional<Diagnosis> radial(size_t i) {
    if (!(norm(xs_[i]) > 0)) return std::nullopt;
    const Tensor x = xs_[i].clone();  // differences() moves xs_[i] itself
    Tensor along = differences(i, x).central, analytic = tangent_on(i, x);
    for (int64_t j = 0; j < m_; ++j)
      if (!tol_.ok(analytic.item(j), along.item(j))) return std::nullopt;
    const std::string n = name(i);
    return Diagnosis{Finding::radial, n, "jvp",
                     fmt::format("along ẋ = {} itself (scaling the input) the JVP agrees with the finite "
                                 "differences, across it it does not: the rule holds only for tangents parallel to "
                                 "{} (a homogeneity argument that drops the part of ẋ orthogonal to {})",
                                 n, n, n)};
  }

  // A failure found by random projections, checked again in full on fewer rows (diagnose_narrowed.cpp).
  void narrow() {
    std::vector<std::string> input_names;
    for (size_t i = 0; i < xs_.size(); ++i) input_names.push_back(name(i));
    auto in_full = [this](std::span<const Tensor> xs, const GradcheckOptions& o) {
      return Checker(f_, xs, names_, o, /*may_narrow=*/false).run();
    };
    for (Diagnosis& d :
         narrowed_diagnoses({f_, xs_, input_names, opt_}, yshape(), failed_by_projections_, in_full, details_)) {
      // One report says one thing of an input: where the projections named it (a scale, a sign, zero, a kink:
      // diagnose_values), the line that says how to get a name is not added.
      const bool named = std::any_of(details_.begin(), details_.end(), [&](const Diagnosis& e) {
        return e.input == d.input && (e.kind == Finding::scale || e.kind == Finding::sign || e.kind == Finding::zero ||
                                      e.kind == Finding::kink);
      });
      if (!(named && d.kind == Finding::unexplained)) details_.push_back(std::move(d));
    }
  }

  const Function& f_;
  std::span<const std::string> names_;
  const GradcheckOptions& opt_;
  const Tolerance tol_;
  Rng rng_;
  std::vector<Tensor> xs_;
  Tensor y0_;
  int64_t m_ = 0;
  std::vector<std::vector<Tensor>> rows_;
  std::vector<bool> full_;  // input i is checked in full (full_rows), else by projections
  std::vector<CheckResult> checks_;
  std::vector<InputOutcome> outcomes_;
  std::vector<Diagnosis> details_;  // per input; the report-level findings go before them
  std::string no_jvp_op_;
  bool may_narrow_ = true;        // false in a narrowed check: it narrows no further
  RuleBlocks* blocks_ = nullptr;  // the full Jacobians' rows and differences in blocks, where given
  Tensor random_u_;               // the random ȳ of the full check, and every input's x̄ for it
  std::vector<Tensor> random_vjp_;
  std::optional<SharedCotangents> shared_;     // at size
  std::vector<size_t> failed_by_projections_;  // inputs whose projections failed
};

}  // namespace

void validate(const GradcheckOptions& opt) {
  if (!(std::isfinite(opt.eps) && opt.eps > 0)) fail("gradcheck: eps must be finite and > 0, got {}", opt.eps);
  if (!(std::isfinite(opt.atol) && opt.atol >= 0)) fail("gradcheck: atol must be finite and ≥ 0, got {}", opt.atol);
  if (!(std::isfinite(opt.rtol) && opt.rtol >= 0)) fail("gradcheck: rtol must be finite and ≥ 0, got {}", opt.rtol);
  if (!(std::isfinite(opt.rounding) && opt.rounding >= 0))
    fail("gradcheck: rounding must be finite and ≥ 0, got {}", opt.rounding);
  if (opt.projections < 1) fail("gradcheck: projections must be at least 1, got {}", opt.projections);
  if (opt.full_jacobian_limit < 0)
    fail("gradcheck: full_jacobian_limit must not be negative, got {}", opt.full_jacobian_limit);
}

GradcheckReport gradcheck(const Function& f, std::span<const Tensor> inputs, std::span<const std::string> names,
                          const GradcheckOptions& opt, RuleBlocks* blocks) {
  return Checker(f, inputs, names, opt, /*may_narrow=*/true, blocks).run();
}

GradcheckReport gradcheck(const Function& f, std::initializer_list<Tensor> inputs,
                          std::initializer_list<std::string> names, const GradcheckOptions& opt) {
  return gradcheck(f, std::span<const Tensor>(inputs.begin(), inputs.size()),
                   std::span<const std::string>(names.begin(), names.size()), opt);
}

CaseInputs case_inputs(const GradcheckCase& c, const GradcheckOptions& opt) {
  CaseInputs in{make_inputs(c.inputs, DType::f64, opt.seed), {}, opt};
  for (const InputSpec& s : c.inputs) in.names.push_back(s.name);
  if (c.atol) in.options.atol = *c.atol;
  if (c.rtol) in.options.rtol = *c.rtol;
  return in;
}

std::string input_name(std::span<const std::string> names, size_t i) {
  return i < names.size() ? names[i] : fmt::format("x{}", i);
}

std::string report_title(std::string_view op, std::string_view case_name) {
  if (op.empty()) return std::string(case_name.empty() ? "gradcheck" : case_name);
  return case_name.empty() ? std::string(op) : fmt::format("{} / {}", op, case_name);
}

GradcheckReport check_case(FunctionCheck check, const GradcheckCase& c, const GradcheckOptions& opt,
                           std::string_view op) {
  const CaseInputs in = case_inputs(c, opt);
  GradcheckReport rep = check(c.build, in.values, in.names, in.options);
  rep.op = std::string(op);
  rep.case_name = c.name;
  rep.conclude();
  return rep;
}

GradcheckReport gradcheck(const GradcheckCase& c, const GradcheckOptions& opt, std::string_view op) {
  return check_case([](const Function& f, std::span<const Tensor> x, std::span<const std::string> names,
                       const GradcheckOptions& o) { return gradcheck(f, x, names, o); },
                    c, opt, op);
}

std::vector<GradcheckReport> gradcheck(const OpSheet& op, const GradcheckOptions& opt) {
  if (op.cases.empty()) fail("gradcheck: op '{}' has no gradcheck case", op.name);
  std::vector<GradcheckReport> reports;
  for (const auto& c : op.cases) reports.push_back(gradcheck(c, opt, op.name));
  return reports;
}

}  // namespace tapegrad
