// Diagnoses at any size. A failure found by random projections names at most a scale or a sign. The same op on
// fewer rows (the first s along the leading axis of y and of every input that shares it: a batch, a sequence) has a
// Jacobian small enough to check in full, and there every kind can be named. The check is made again there, and its
// findings for the inputs that failed are reported, saying where; when no cut can be made (no shared leading axis,
// or the op refuses the cut inputs), or the cut passes, one line says how to get a diagnosis.
#include <algorithm>

#include <fmt/format.h>

#include "checker/jacobian.hpp"

namespace tapegrad::gradcheck_detail {

namespace {

// The first s rows of the inputs that share y's leading axis (all of them, or only the failing ones).
std::vector<Tensor> first_rows(std::span<const Tensor> x, const std::vector<bool>& cut, int64_t s) {
  std::vector<Tensor> xs;
  for (size_t q = 0; q < x.size(); ++q) {
    if (!cut[q]) {
      xs.push_back(x[q]);  // a handle: the op only reads it, and a check clones its inputs
      continue;
    }
    Shape shape = x[q].shape();
    shape[0] = s;
    Tensor t = Tensor::empty(x[q].dtype(), shape);
    if (t.dtype() == DType::i32) std::copy_n(x[q].data<int32_t>(), t.numel(), t.data<int32_t>());
    else std::copy_n(x[q].data<double>(), t.numel(), t.data<double>());
    xs.push_back(std::move(t));
  }
  return xs;
}

}  // namespace

std::vector<Diagnosis> narrowed_diagnoses(const CheckedPoint& point, const Shape& yshape,
                                          std::span<const size_t> failing, const CheckInFull& check_in_full) {
  // named references, not a structured binding: the lambdas below capture them (clang 14 refuses a binding)
  const Function& f = point.f;
  const std::span<const Tensor> x = point.x;
  const std::span<const std::string> names = point.names;
  const GradcheckOptions& opt = point.opt;
  std::vector<Diagnosis> out;
  const int64_t m = yshape.numel();
  auto how_to_name = [&](const std::string& why) {
    for (size_t i : failing)
      out.push_back({Finding::unexplained, names[i], "",
                     fmt::format("random projections ({} × {} Jacobian entries, above full_jacobian_limit = {}) show "
                                 "only a scale or a sign, and {}; for a full diagnosis check smaller inputs or raise "
                                 "full_jacobian_limit to {}",
                                 m, x[i].numel(), opt.full_jacobian_limit, why, m * x[i].numel())});
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
      const std::vector<Tensor> xs = first_rows(x, cut, s);
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
      for (auto& d : r.diagnoses) {
        if (d.check.empty()) continue;  // which rule and which input: the checks here say that already
        if (std::none_of(failing.begin(), failing.end(), [&](size_t i) { return names[i] == d.input; })) continue;
        d.message = fmt::format("on the first {} of {} rows{} (a full Jacobian there): {}", s, rows,
                                all ? "" : fmt::format(" of {}", d.input), d.message);
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
