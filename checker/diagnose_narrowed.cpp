// Diagnoses at any size. A failure found by random projections names at most a scale or a sign. The same op on
// fewer rows (the first s along the leading axis of y and of every input that shares it: a batch, a sequence) has a
// Jacobian small enough to check in full, and there every kind can be named. The check is made again there, and its
// findings for the inputs that failed are reported, saying where; when no cut can be made (no shared leading axis,
// or the op refuses the cut inputs), or the cut passes, one line says how to get a diagnosis.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>

#include <fmt/format.h>

#include "checker/jacobian.hpp"

namespace tapegrad::gradcheck_detail {

namespace {

// Two scales found on two rows are one where they agree to this part of the first (the factor is printed to six
// digits, and a difference of a count or a norm between rows is far above it).
constexpr double kSameFactorAcrossRows = 1e-3;

// Whether factor c agrees with the reference factor to kSameFactorAcrossRows of the reference.
bool same_factor(double reference, double c) {
  return std::abs(reference - c) <= kSameFactorAcrossRows * std::abs(reference);
}

// s rows from row `from` of the inputs that share y's leading axis (all of them, or only the failing ones).
std::vector<Tensor> rows_of(std::span<const Tensor> x, const std::vector<bool>& cut, int64_t from, int64_t s) {
  std::vector<Tensor> xs;
  for (size_t q = 0; q < x.size(); ++q) {
    if (!cut[q]) {
      xs.push_back(x[q]);  // a handle: the op only reads it, and a check clones its inputs
      continue;
    }
    Shape shape = x[q].shape();
    const int64_t row = x[q].numel() / shape[0];
    shape[0] = s;
    Tensor t = Tensor::empty(x[q].dtype(), shape);
    if (t.dtype() == DType::i32) std::copy_n(x[q].data<int32_t>() + from * row, t.numel(), t.data<int32_t>());
    else std::copy_n(x[q].data<double>() + from * row, t.numel(), t.data<double>());
    xs.push_back(std::move(t));
  }
  return xs;
}

// In r, the factor c of the scale found for d's input and check, 1 where that check passed, none where it failed
// otherwise.
std::optional<double> scale_factor(const GradcheckReport& r, const Diagnosis& d) {
  const bool passed = std::all_of(r.checks.begin(), r.checks.end(), [&](const CheckResult& c) {
    return c.input != d.input || c.check != d.check || c.passed;
  });
  if (passed) return 1.0;
  const Diagnosis* scale = r.find(Finding::scale, d.input);
  if (!scale || scale->check != d.check) return std::nullopt;
  return scale->factor;
}

// A scale found on the first of y's rows alone may be a factor of each row (a count, a norm) that one row cannot
// tell from one scale: the same check on the last row says. Where its factor differs (or that row passes), the
// finding is a per-row factor with both factors, which says where it was found (true).
bool told_from_a_factor_per_row(Diagnosis& d, const GradcheckReport& first, const GradcheckReport& last, int64_t rows) {
  const std::optional<double> c_first = scale_factor(first, d), c_last = scale_factor(last, d);
  if (!c_first || !c_last || same_factor(*c_first, *c_last)) return false;
  d.kind = Finding::per_row_factor;
  d.message = fmt::format(
      "on the first and on the last of {} rows (full Jacobians there): analytic = c × numeric in "
      "each, c = {:.6g} and {:.6g}: the factor differs between y's rows — a per-row normalizer "
      "(the row's count, sum or norm) is missing, applied twice, or the wrong one",
      rows, *c_first, *c_last);
  return true;
}

// A scale found on the first s of y's rows with another factor than the projections found at all of them: a factor
// that follows the rows kept, which the projections' line (at) then says with both factors, in one line. Where
// c·rows is the same at both (same_factor) the rule divides by the count of y's rows (a mean where
// the forward sums), where c/rows is, it multiplies by it; else the factor depends on the rows otherwise. Whether it
// was told so.
bool told_with_the_factor_at_size(const Diagnosis& d, std::span<Diagnosis> at_size, int64_t s, int64_t rows) {
  auto at = std::find_if(at_size.begin(), at_size.end(), [&](const Diagnosis& e) {
    return e.kind == Finding::scale && e.input == d.input && e.check == d.check && e.factor;
  });
  if (at == at_size.end() || !d.factor) return false;
  const double c_all = *at->factor, c_cut = *d.factor;
  if (same_factor(c_cut, c_all)) return false;
  const auto n = static_cast<double>(rows), k = static_cast<double>(s);
  std::string what;
  if (same_factor(c_cut * k, c_all * n))
    what = fmt::format(
        "c × (y's rows) = {:.6g} at both: the rule divides by the count of y's rows along axis 0 (a "
        "mean over them where the forward sums){}",
        c_all * n, same_factor(1.0, c_all * n) ? "" : ", and is off by that constant besides");
  else if (same_factor(c_cut / k, c_all / n))
    what = fmt::format(
        "c ÷ (y's rows) = {:.6g} at both: the rule multiplies by the count of y's rows along axis 0 "
        "(a sum over them where the forward takes the mean){}",
        c_all / n, same_factor(1.0, c_all / n) ? "" : ", and is off by that constant besides");
  else
    what =
        "the factor depends on the rows kept (a count, a sum or a norm over y's rows is missing, applied twice, or "
        "the wrong one)";
  at->message = fmt::format(
      "analytic = c × numeric, c = {} over random projections at all {} of y's rows and c = {} on the first {} (a "
      "full Jacobian there): {}",
      describe_factor(c_all), rows, describe_factor(c_cut), s, what);
  return true;
}

}  // namespace

std::vector<Diagnosis> narrowed_diagnoses(const CheckedPoint& point, const Shape& yshape,
                                          std::span<const size_t> failing, const CheckInFull& check_in_full,
                                          std::span<Diagnosis> at_size) {
  // named references, not a structured binding: the lambdas below capture them (clang 14 refuses a binding)
  const Function& f = point.f;
  const std::span<const Tensor> x = point.x;
  const std::span<const std::string> names = point.names;
  const GradcheckOptions& opt = point.opt;
  std::vector<Diagnosis> out;
  const int64_t m = yshape.numel();
  auto how_to_name = [&](const std::string& why) {
    for (size_t i : failing) {
      const int64_t entries = m * x[i].numel();
      // within the limit, an input is checked by projections only where its blocks judged a full check too costly
      // (RuleBlocks::full_worth_its_cost); any other limit checks it in full
      const std::string limit =
          entries > opt.full_jacobian_limit
              ? fmt::format("above full_jacobian_limit = {}", opt.full_jacobian_limit)
              : fmt::format("within full_jacobian_limit = {}, checked so for what a full check costs here",
                            opt.full_jacobian_limit);
      const std::string advice = entries > opt.full_jacobian_limit
                                     ? fmt::format("raise full_jacobian_limit to {}", entries)
                                     : fmt::format("set full_jacobian_limit to {}, which checks in full at any cost",
                                                   std::max(entries, GradcheckOptions{}.full_jacobian_limit + 1));
      out.push_back({Finding::unexplained, names[i], "",
                     fmt::format("random projections ({} × {} Jacobian entries, {}) show only a scale or a sign, and "
                                 "{}; for a full diagnosis check smaller inputs or {}",
                                 m, x[i].numel(), limit, why, advice)});
    }
    return out;
  };
  const int64_t rows = yshape.rank() >= 1 ? yshape[0] : 0;
  std::vector<bool> shares(x.size());
  for (size_t q = 0; q < x.size(); ++q) shares[q] = x[q].shape().rank() >= 1 && x[q].shape()[0] == rows && rows >= 2;
  const bool failing_share = std::any_of(failing.begin(), failing.end(), [&](size_t i) { return shares[i]; });
  // Under the limit, or the default one where projections were asked for everywhere.
  const int64_t limit = std::max(opt.full_jacobian_limit, GradcheckOptions{}.full_jacobian_limit);
  // Every input that shares the axis cut (a weight that does not is checked whole against fewer rows of y), else
  // only the failing ones.
  int64_t one_row_entries = 0;  // the smallest cut's Jacobian entries, where even that is above the limit
  for (bool all : {true, false}) {
    if (!all && !failing_share) break;
    std::vector<bool> cut(shares);
    if (!all)
      for (size_t q = 0; q < x.size(); ++q) cut[q] = shares[q] && std::count(failing.begin(), failing.end(), q) > 0;
    for (int64_t s = rows / 2; s >= 1; s /= 2) {
      const std::vector<Tensor> xs = rows_of(x, cut, 0, s);
      int64_t ms = 0;
      try {
        const Tensor y = evaluate(f, xs);
        if (y.shape().rank() < 1 || y.shape()[0] != s) break;  // the output's rows are not the inputs' rows
        ms = y.numel();
      } catch (...) {  // the op does not take its inputs cut this way (an Error, or a Python op's exception)
        break;
      }
      if (!std::all_of(failing.begin(), failing.end(), [&](size_t i) { return ms * xs[i].numel() <= limit; })) {
        if (s == 1)
          for (size_t i : failing) one_row_entries = std::max(one_row_entries, ms * xs[i].numel());
        continue;
      }
      GradcheckOptions full = opt;
      full.full_jacobian_limit = limit;
      GradcheckReport r;
      try {
        r = check_in_full(xs, full);
      } catch (...) {  // the cut op ran once but not under the checks' inputs: nothing is said of it
        break;
      }
      if (r.passed) return how_to_name(fmt::format("the same check on the first {} of {} rows passes", s, rows));
      std::optional<GradcheckReport> last;  // the same check on the last row, where one row was cut and a scale found
      if (s == 1 && find_diagnosis(r.diagnoses, Finding::scale)) {
        try {
          last = check_in_full(rows_of(x, cut, rows - 1, 1), full);
        } catch (...) {  // as above: nothing more is said
        }
      }
      for (auto& d : r.diagnoses) {
        if (d.check.empty()) continue;  // which rule and which input: the checks here say that already
        if (std::none_of(failing.begin(), failing.end(), [&](size_t i) { return names[i] == d.input; })) continue;
        const std::string first_rows = fmt::format("on the first {} of {} rows{} (a full Jacobian there): ", s, rows,
                                                   all ? "" : fmt::format(" of {}", d.input));
        const bool per_row = last && d.kind == Finding::scale && told_from_a_factor_per_row(d, r, *last, rows);
        if (!per_row && d.kind == Finding::scale && told_with_the_factor_at_size(d, at_size, s, rows)) continue;
        if (!per_row) d.message = first_rows + d.message;
        out.push_back(std::move(d));
      }
      return out;
    }
  }
  if (one_row_entries > 0)
    return how_to_name(
        fmt::format("even one of y's {} rows makes a Jacobian of {} entries, above the limit", rows, one_row_entries));
  return how_to_name("y and the inputs share no leading axis the check can cut");
}

}  // namespace tapegrad::gradcheck_detail
