// A node's rules at a working precision against float64, judged by the measured rounding (precision.hpp has the
// model).
#include "checker/precision.hpp"

#include <algorithm>
#include <cmath>
#include <ostream>

#include <fmt/format.h>

#include "checker/jacobian.hpp"
#include "engine/rng.hpp"
#include "engine/tape_observer.hpp"

namespace tapegrad {

namespace {

// The stream of ȳ and the tangents, apart from the float64 check's draws of the same seed.
constexpr uint64_t kPrecisionStream = 0x9b16a5c3e1d2f407ull;

bool is_float(const Tensor& t) { return t.defined() && t.dtype() != DType::i32; }

// x rounded to float32, in float64 (integer inputs as they are): the values both sides read.
Tensor float32_values(const Tensor& x) { return is_float(x) ? x.to(DType::f32).to(DType::f64) : x; }
Tensor as_float32(const Tensor& x) { return is_float(x) ? x.to(DType::f32) : x; }
Tensor as_float64(const Tensor& x) { return is_float(x) ? x.to(DType::f64) : x; }

std::vector<Tensor> each(std::span<const Tensor> xs, Tensor (*convert)(const Tensor&)) {
  std::vector<Tensor> out;
  for (const Tensor& x : xs) out.push_back(convert(x));
  return out;
}

// Every element of the float tensors moved as a float32 rounding could move it.
std::vector<Tensor> moved(std::span<const Tensor> xs, uint64_t seed) {
  std::vector<Tensor> out;
  for (const Tensor& x : xs) {
    if (!is_float(x)) {
      out.push_back(x);
      continue;
    }
    Tensor m = x.clone();
    double* p = m.data<double>();
    for (int64_t k = 0; k < m.numel(); ++k) p[k] = emulate_rounding(p[k], kFloat32UnitRoundoff, seed);
    out.push_back(m);
  }
  return out;
}

// Every value, gradient and tangent a float64 tape computes moved as a float32 rounding could move it (seeded as
// an emulated rounding): what storing them in float32 tensors does, inside the case's map as well as at its ends.
// A value that is a view of an input (a reshape) is that input's elements, moved already.
struct ValueRounding : TapeObserver {
  uint64_t seed;
  explicit ValueRounding(uint64_t s) : seed(s) {}
  void move(Tensor t) const {  // a handle to the tape's own tensor
    if (!is_float(t) || t.dtype() != DType::f64) return;
    double* p = t.data<double>();
    for (int64_t k = 0; k < t.numel(); ++k) p[k] = emulate_rounding(p[k], kFloat32UnitRoundoff, seed);
  }
  void on_output(const Tape&, const char*, std::span<const Var> inputs, const Tensor& out) override {
    const auto* at = static_cast<const char*>(out.raw());
    for (const Var& x : inputs) {
      const auto* from = static_cast<const char*>(x.value().raw());
      if (at >= from && at < from + x.value().nbytes()) return;
    }
    move(out);
  }
  void on_vjp_end(const Tape&, const Node&, std::span<const Tensor> gin) override {
    for (const Tensor& g : gin) move(g);
  }
  void on_jvp_end(const Tape&, const Node&, const Tensor& tout) override { move(tout); }
};

// max_k |a_k − b_k|; NaN when either holds a value that is not finite.
double max_abs_diff(const Tensor& a, const Tensor& b) {
  double worst = 0;
  for (int64_t k = 0; k < a.numel(); ++k) {
    const double x = a.item(k), y = b.item(k);
    if (!std::isfinite(x) || !std::isfinite(y)) return NAN;
    worst = std::max(worst, std::abs(x - y));
  }
  return worst;
}
double max_abs(const Tensor& a) {
  double m = 0;
  for (int64_t k = 0; k < a.numel(); ++k) m = std::max(m, std::abs(a.item(k)));
  return m;
}

// The rules of one evaluation, in float64: x̄ of every input for ȳ, and ẏ for each input's tangent alone (undefined
// for integer inputs, and every ẏ undefined for an op without a JVP).
struct Rules {
  std::vector<Tensor> vjp, jvp;
};

Rules rules(const Function& f, std::span<const Tensor> x, const Tensor& u, std::span<const Tensor> tangents,
            TapeObserver* observer = nullptr) {
  Rules r{each(vjp(f, x, u, observer), as_float64), std::vector<Tensor>(x.size())};
  for (size_t i = 0; i < x.size(); ++i) {
    if (!is_float(x[i])) continue;
    std::vector<Tensor> t(x.size());
    t[i] = tangents[i];
    try {
      r.jvp[i] = as_float64(jvp(f, x, t, observer).second);
    } catch (const NoJvp&) {  // no forward mode: the jvp rows are skipped
      r.jvp.assign(x.size(), Tensor{});
      break;
    }
  }
  return r;
}

// run() with every product at p: a rule run on float32 tensors.
template <class Run>
auto at_precision(ProductPrecision p, Run&& run) {
  PrecisionScope scope(p, Bf16Reach::every_product);
  return run();
}

// The rules at p, run on float32 tensors (x, u and the tangents hold float32 values).
Rules rules_at(ProductPrecision p, const Function& f, std::span<const Tensor> x, const Tensor& u,
               std::span<const Tensor> tangents) {
  const std::vector<Tensor> x32 = each(x, as_float32), t32 = each(tangents, as_float32);
  return at_precision(p, [&] { return rules(f, x32, as_float32(u), t32); });
}

// The rows of f at p on x (float32 values in float64): the errors and what rounding explains of them.
std::vector<PrecisionRow> measure(const Function& f, std::span<const Tensor> x, std::span<const std::string> names,
                                  ProductPrecision p, uint64_t seed) {
  const Tensor y = evaluate(f, x);
  Rng rng(seed ^ kPrecisionStream);
  const Tensor u = float32_values(Tensor::randn(DType::f64, y.shape(), rng));
  std::vector<Tensor> tangents(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    if (is_float(x[i])) tangents[i] = float32_values(Tensor::randn(DType::f64, x[i].shape(), rng));

  const Rules low = rules_at(p, f, x, u, tangents), ref = rules(f, x, u, tangents);
  std::vector<double> deviation(2 * x.size(), 0.0);  // vjp, jvp of each input
  for (int s = 0; s < kRoundingSeeds; ++s) {
    const uint64_t at = seed + 2 * static_cast<uint64_t>(s);
    const std::vector<Tensor> xm = moved(x, at), tm = moved(tangents, at);
    const Tensor um = moved(std::span<const Tensor>(&u, 1), at)[0];
    EmulatedRoundingScope products({unit_roundoff(p), kFloat32UnitRoundoff, at + 1});
    ValueRounding values(at + 1);
    const Rules m = rules(f, xm, um, tm, &values);
    for (size_t i = 0; i < x.size(); ++i) {
      if (!is_float(x[i])) continue;
      deviation[2 * i] = std::max(deviation[2 * i], max_abs_diff(m.vjp[i], ref.vjp[i]));
      if (ref.jvp[i].defined())
        deviation[2 * i + 1] = std::max(deviation[2 * i + 1], max_abs_diff(m.jvp[i], ref.jvp[i]));
    }
  }
  std::vector<PrecisionRow> rows;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!is_float(x[i])) continue;
    for (bool is_vjp : {true, false}) {
      PrecisionRow r{input_name(names, i), is_vjp ? "vjp" : "jvp"};
      const Tensor& got = is_vjp ? low.vjp[i] : low.jvp[i];
      const Tensor& want = is_vjp ? ref.vjp[i] : ref.jvp[i];
      if (!want.defined() || !got.defined()) {
        r.skipped = true;
        rows.push_back(r);
        continue;
      }
      r.max_err = max_abs_diff(got, want);
      r.bound = kBoundMultiple * deviation[2 * i + (is_vjp ? 0 : 1)];
      r.scale = max_abs(want);
      r.passed = r.max_err <= r.bound;  // NaN fails
      rows.push_back(r);
    }
  }
  return rows;
}

// The rules at p as a claimed derivative of the float64 forward: what gradcheck() compares with its differences.
Function claimed_at(ProductPrecision p, const Function& f) {
  return claimed({fmt::format("rules at {}", precision_name(p)), f,
                  [p, f](const ClaimPoint& at, const Tensor& g, std::span<Tensor> gin) {
                    const std::vector<Tensor> x32 = each(at.inputs, as_float32);
                    const std::vector<Tensor> got = at_precision(p, [&] { return vjp(f, x32, as_float32(g)); });
                    for (size_t i = 0; i < gin.size(); ++i)
                      if (gin[i].defined()) gin[i].accumulate(as_float64(got[i]));
                  },
                  [p, f](const ClaimPoint& at, std::span<const Tensor> tin, Tensor& tout) {
                    const std::vector<Tensor> x32 = each(at.inputs, as_float32), t32 = each(tin, as_float32);
                    tout.accumulate(as_float64(at_precision(p, [&] { return jvp(f, x32, t32).second; })));
                  }});
}

// What a failing case's error is: a rounding defect (bf16 rows whose f32 twins pass), else the slip as gradcheck()
// names it with the measured bound as its tolerance.
std::vector<Diagnosis> diagnose(const Function& f, std::span<const Tensor> x, std::span<const std::string> names,
                                ProductPrecision p, const GradcheckOptions& opt,
                                const std::vector<PrecisionRow>& rows) {
  std::vector<Diagnosis> out;
  std::vector<PrecisionRow> slips;
  std::vector<PrecisionRow> at_f32;
  if (p == ProductPrecision::bf16) at_f32 = measure(f, x, names, ProductPrecision::f32, opt.seed);
  for (size_t r = 0; r < rows.size(); ++r) {
    const PrecisionRow& row = rows[r];
    if (row.passed || row.skipped) continue;
    const bool defect = p == ProductPrecision::bf16 && at_f32[r].passed && !at_f32[r].skipped &&
                        row.max_err <= kDefectRoundoffs * kBf16UnitRoundoff * row.scale;
    if (!defect) {
      slips.push_back(row);
      continue;
    }
    out.push_back({Finding::precision_defect, row.input, row.check,
                   fmt::format("the error shrinks with the precision (bf16 → f32: {:.1e} → {:.1e}, {:.1e} of max "
                               "|{}| at bf16); not a slip: at f32 the {} is within its rounding, and at bf16 it "
                               "loses more than its products' rounding explains (a value sent through a product "
                               "where float64 adds it up, or a cancellation the float32 code alone makes)",
                               row.max_err, at_f32[r].max_err, row.max_err / row.scale, row.check == "vjp" ? "x̄" : "ẏ",
                               gradcheck_detail::rule_name(row.check))});
  }
  if (slips.empty()) return out;
  GradcheckOptions o = opt;
  o.atol = 0, o.rtol = 0, o.rounding = 0;
  for (const PrecisionRow& row : rows) {
    if (row.skipped) continue;
    o.atol = std::max(o.atol, row.bound);
    if (row.scale > 0) o.rounding = std::max(o.rounding, row.bound / row.scale);
  }
  const GradcheckReport named = gradcheck(claimed_at(p, f), x, names, o);
  for (const Diagnosis& d : named.diagnoses) out.push_back(d);
  if (named.diagnoses.empty())
    for (const PrecisionRow& row : slips)
      out.push_back({Finding::unexplained, row.input, row.check,
                     fmt::format("the error is beyond what rounding explains for the random {}, yet every Jacobian "
                                 "entry at {} agrees with float64's differences within {:.1e}: no kind to name",
                                 row.check == "vjp" ? "ȳ" : "tangent", precision_name(p), o.atol)});
  return out;
}

}  // namespace

std::string PrecisionRow::line(ProductPrecision p) const {
  if (skipped) return fmt::format("{} {} at {}: skipped (no JVP)", check, input, precision_name(p));
  return fmt::format("{} {} at {}: max error {:.1e}; rounding at {} explains up to {:.1e} here{}", check, input,
                     precision_name(p), max_err, precision_name(p), bound, passed ? "" : "; not this error");
}

std::string precision_header(ProductPrecision p) {
  return p == ProductPrecision::bf16
             ? "bf16 products (each float32 product's operands rounded to bfloat16), float32 tensors, against float64"
             : "f32 products, float32 tensors, against float64";
}

std::string PrecisionReport::str() const {
  std::string s = fmt::format("{} at {}: {}\n", report_title(op, case_name), precision_name(precision),
                              passed ? "passed" : "FAILED");
  if (!float64.passed) {
    s += "  the float64 check fails, so the reference does not stand:\n";
    const std::string text = float64.str();
    for (size_t at = 0, end; at < text.size(); at = end + 1) {
      end = std::min(text.find('\n', at), text.size());
      s += "  " + text.substr(at, end - at) + "\n";
    }
    return s;
  }
  for (const PrecisionRow& r : rows) s += "  " + r.line(precision) + "\n";
  if (!diagnoses.empty()) {
    s += "  diagnosis:\n";
    for (const Diagnosis& d : diagnoses) s += fmt::format("    {}\n", d.str());
  }
  return s;
}

std::ostream& operator<<(std::ostream& os, const PrecisionReport& r) { return os << r.str(); }

PrecisionReport gradcheck_at_precision(const Function& f, std::span<const Tensor> inputs,
                                       std::span<const std::string> names, ProductPrecision p,
                                       const GradcheckOptions& opt) {
  if (p == ProductPrecision::bf16)
    if (const std::string why = bf16_unavailable_reason(); !why.empty()) fail("gradcheck at bf16: {}", why);
  PrecisionReport rep;
  rep.precision = p;
  rep.float64 = gradcheck(f, inputs, names, opt);
  if (!rep.float64.passed) return rep;
  const std::vector<Tensor> x = each(inputs, float32_values);
  rep.rows = measure(f, x, names, p, opt.seed);
  rep.passed = std::all_of(rep.rows.begin(), rep.rows.end(), [](const PrecisionRow& r) { return r.passed; }) &&
               std::any_of(rep.rows.begin(), rep.rows.end(), [](const PrecisionRow& r) { return !r.skipped; });
  if (!rep.passed && opt.diagnose) rep.diagnoses = diagnose(f, x, names, p, opt, rep.rows);
  return rep;
}

PrecisionReport gradcheck_at_precision(const GradcheckCase& c, ProductPrecision p, const GradcheckOptions& opt,
                                       std::string_view op) {
  const CaseInputs in = case_inputs(c, opt);  // the case's own tolerances serve its float64 check
  PrecisionReport rep = gradcheck_at_precision(c.build, in.values, in.names, p, in.options);
  rep.op = rep.float64.op = std::string(op);
  rep.case_name = rep.float64.case_name = c.name;
  rep.float64.conclude();
  return rep;
}

}  // namespace tapegrad
