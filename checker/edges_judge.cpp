// The edge probes' judgement (checker/edges.hpp says what is held): the op's forward and VJP at one probe, in
// float64, and the first finding there.
#include <algorithm>
#include <cmath>
#include <exception>

#include "checker/edges_probe.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad::edges_detail {

using namespace gradcheck_detail;

namespace {

constexpr double kStep = 1e-6;  // the central differences' step, a multiple of each element (1 at 0)
constexpr double kRtol = 0.01;  // x̄ against the differences: this part of the larger, plus 10% of it of ⟨|x̄|, |t|⟩
constexpr int kNarrowed = 16;  // a random direction that disagrees is narrowed to one of its first elements

std::string gives(const Probe& p) {  // "a zero row gives", "tiny values give"
  const std::string first = p.words.substr(0, p.words.find(' '));
  const bool one = first == "a" || first == "an" || first == "the" || first == "one";
  return p.words + (one ? " gives" : " give");
}

std::string at(const std::string& name, const Shape& s, int64_t k) { return name + index_str(s, k); }

}  // namespace

Prober::Run Prober::run(std::span<const Tensor> inputs) {
  Run r;
  r.y = forward(inputs);
  r.ybar = Tensor::randn(DType::f64, r.y.shape(), rng_);
  for (int64_t j = 0; j < r.y.numel(); ++j)
    if (!std::isfinite(r.y.item(j))) r.ybar.data<double>()[j] = 0;
  r.grads = vjp(f_, inputs, r.ybar);
  r.grads0 = vjp(f_, inputs, Tensor::zeros(DType::f64, r.y.shape()));
  return r;
}

// ⟨ȳ, f(inputs)⟩ over the outputs where ȳ ≠ 0 (NaN where f is not finite there).
double Prober::loss(std::span<const Tensor> inputs, const Tensor& ybar) const {
  const std::optional<Tensor> y = forward_or_none(inputs);
  if (!y) return NAN;  // a side the op refuses: no difference there
  double total = 0;
  for (int64_t j = 0; j < y->numel(); ++j)
    if (ybar.item(j) != 0) total += y->item(j) * ybar.item(j);
  return total;
}

std::optional<EdgeFinding> Prober::judge(const Probe& p) {
  Run r;
  try {
    r = run(p.inputs);
  } catch (const Error& e) {  // refused in words: the op's domain ends there, as its error says
    std::string what = e.what();
    refused_.push_back(fmt::format("{} ({}): the op refuses it: {}", p.words, p.line, what.substr(0, what.find('\n'))));
    return std::nullopt;
  } catch (const std::exception& e) {  // anything else thrown at an edge is a finding
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    return EdgeFinding{name(p.slot), fmt::format("{}: the op throws: {}; reproduce: {}", p.words, what, p.line), "",
                       NAN, NAN};
  }
  if (auto found = output_finding(p, r)) return found;
  for (size_t i = 0; i < xs_.size(); ++i)
    if (xs_[i].dtype() == DType::f64)
      if (auto found = gradient_finding(p, r, i)) return found;
  return std::nullopt;
}

// NaN in y where the op is finite next to the edge; at a length of 1 (inputs cut from finite ones), NaN in y.
std::optional<EdgeFinding> Prober::output_finding(const Probe& p, const Run& r) const {
  bool nan = false;
  for (int64_t j = 0; j < r.y.numel() && !nan; ++j) nan = std::isnan(r.y.item(j));
  if (!nan) return std::nullopt;
  if (p.edge == "length_one")
    for (int64_t j = 0; j < r.y.numel(); ++j)
      if (std::isnan(r.y.item(j))) {
        const std::string where = at("y", r.y.shape(), j);
        return EdgeFinding{
            name(p.slot),
            fmt::format("{} NaN in y: {} is nan from inputs that hold no NaN; reproduce: {}", gives(p), where, p.line),
            where, NAN, NAN};
      }
  if (p.near.empty()) return std::nullopt;
  const std::optional<Tensor> near_y = forward_or_none(p.near);
  if (!near_y) return std::nullopt;
  const Tensor& near = *near_y;
  for (int64_t j = 0; j < r.y.numel(); ++j)
    if (std::isnan(r.y.item(j)) && std::isfinite(near.item(j))) {
      const std::string where = at("y", r.y.shape(), j);
      return EdgeFinding{
          name(p.slot),
          fmt::format("{} NaN in y: {} is nan where the op is finite next to the edge ({:.6g} there): its "
                      "limit is finite; reproduce: {}",
                      gives(p), where, near.item(j), p.line),
          where, NAN, near.item(j)};
    }
  return std::nullopt;
}

std::optional<EdgeFinding> Prober::gradient_finding(const Probe& p, const Run& r, size_t i) {
  const Tensor &g = r.grads[i], &g0 = r.grads0[i];
  const std::string bar = name(i) + "̄";
  const Shape& s = g.shape();
  for (int64_t k = 0; k < g0.numel(); ++k)
    if (g0.item(k) != 0 && !std::isinf(g.item(k))) {  // NaN too; where x̄ is ∞ the derivative is, and 0·∞ is NaN
      const double v = g0.item(k);
      return EdgeFinding{
          name(i),
          fmt::format("{} {} in {} at ȳ = 0: {} is {:g} where it must be exactly 0 (an output that does "
                      "not reach the loss sends it back: a zero ȳ times NaN or ∞ in the backward); "
                      "reproduce: {}",
                      gives(p), std::isnan(v) ? "NaN" : fmt::format("{:g}", v), bar, at(bar, s, k), v, p.line),
          at(bar, s, k), v, 0.0};
    }
  for (int64_t k = 0; k < g.numel(); ++k)
    if (std::isnan(g.item(k))) {
      bool finite = true;
      for (int64_t j = 0; j < r.y.numel() && finite; ++j) finite = std::isfinite(r.y.item(j));
      return EdgeFinding{name(i),
                         fmt::format("{} NaN in {}: {} is nan {}; reproduce: {}", gives(p), bar, at(bar, s, k),
                                     finite ? "where y is finite" : "(ȳ is 0 where y is not finite)", p.line),
                         at(bar, s, k), NAN, NAN};
    }
  const Tensor& x = p.inputs[i];
  for (int64_t k = 0; k < g.numel(); ++k)
    if (std::isinf(g.item(k)) && std::isfinite(x.item(k))) {
      if (auto found = infinite(p, r, i, k)) return found;
      break;
    }
  if (p.slot == i) return disagreement(p, r, i);
  return std::nullopt;
}

// ∞ in x̄ at element k where one-sided differences of the op at two steps do not grow (the derivative is finite).
std::optional<EdgeFinding> Prober::infinite(const Probe& p, const Run& r, size_t i, int64_t k) const {
  const double x0 = p.inputs[i].item(k);
  const double h = x0 != 0 ? 1e-3 * std::abs(x0) : kStep, sign = x0 >= 0 ? 1.0 : -1.0;
  const double base = loss(p.inputs, r.ybar);
  double d[2];
  int n = 0;
  for (double step : {h, h / 100}) {
    std::vector<Tensor> moved = copies(p.inputs);
    moved[i].data<double>()[k] += sign * step;
    d[n++] = (loss(moved, r.ybar) - base) / (sign * step);
  }
  if (!std::isfinite(d[0]) || !std::isfinite(d[1]) || std::abs(d[1]) > 1.2 * std::abs(d[0]) + 1e-300)
    return std::nullopt;  // the derivative grows without bound there: ∞ is its value
  const std::string bar = name(i) + "̄", where = at(bar, p.inputs[i].shape(), k);
  const double v = r.grads[i].item(k);
  return EdgeFinding{
      name(i),
      fmt::format("{} ∞ in {}: {} is {:g} where the derivative is finite (one-sided differences of the op "
                  "in float64 give {:.6g}); reproduce: {}",
                  gives(p), bar, where, v, d[1], p.line),
      where, v, d[1]};
}

// The central difference of ⟨ȳ, f⟩ along t in the probed input, with its rounding noise, or none where it is not
// resolved: a side not finite, one-sided differences that disagree (a kink), or (confirmed) a step ten times smaller
// that gives another value. Unconfirmed, the difference at kStep alone: enough to accept an x̄ that agrees with it,
// not to find one that does not.
std::optional<Prober::Difference> Prober::difference(const Probe& p, const Tensor& t, const Tensor& ybar, double base,
                                                     bool confirmed) const {
  double found[2][2];  // (value, noise) at each step
  int n = 0;
  for (double step : {kStep, kStep / 10}) {
    if (n == 1 && !confirmed) return Difference{found[0][0], found[0][1]};
    double sides[2];
    for (int s = 0; s < 2; ++s) {
      std::vector<Tensor> moved = copies(p.inputs);
      double* e = moved[p.slot].data<double>();
      for (int64_t k = 0; k < t.numel(); ++k) e[k] += (s == 0 ? 1 : -1) * step * t.item(k);
      sides[s] = loss(moved, ybar);
    }
    if (!std::isfinite(sides[0]) || !std::isfinite(sides[1]) || !std::isfinite(base)) return std::nullopt;
    const double up = (sides[0] - base) / step, down = (base - sides[1]) / step;
    const double noise = 1e-13 * (std::abs(sides[0]) + std::abs(base) + std::abs(sides[1])) / step;
    if (std::abs(up - down) > 1e-3 * std::max(std::abs(up), std::abs(down)) + 100 * noise) return std::nullopt;
    found[n][0] = (up + down) / 2, found[n][1] = noise, ++n;
  }
  const double coarse = found[0][0], fine = found[1][0];
  if (std::abs(coarse - fine) > 1e-3 * std::max(std::abs(coarse), std::abs(fine)) + 100 * found[1][1])
    return std::nullopt;
  return Difference{fine, found[1][1]};
}

// x̄ along the probed row's directions (each group of equal finite elements moved together, two at most, the largest;
// the other finite elements along one random direction; each element's step a multiple of itself, 1 at 0) against
// central differences; a random direction that disagrees is narrowed to its element.
std::optional<EdgeFinding> Prober::disagreement(const Probe& p, const Run& r, size_t i) {
  const Tensor& g = r.grads[i];
  const double* x = p.inputs[i].data<double>();
  const double base = loss(p.inputs, r.ybar);
  if (!std::isfinite(base)) return std::nullopt;
  auto scale = [&](int64_t k) { return x[k] != 0 ? std::abs(x[k]) : 1.0; };
  std::vector<std::vector<int64_t>> groups;
  std::vector<int64_t> single;
  for (int64_t k : p.row) {
    if (!std::isfinite(x[k])) continue;
    auto same = std::find_if(groups.begin(), groups.end(), [&](const auto& grp) { return x[grp[0]] == x[k]; });
    if (same != groups.end()) same->push_back(k);
    else groups.push_back({k});
  }
  for (auto it = groups.begin(); it != groups.end();)
    if (it->size() < 2) single.push_back((*it)[0]), it = groups.erase(it);
    else ++it;
  std::stable_sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  if (groups.size() > 2) groups.resize(2);
  std::vector<std::pair<std::vector<int64_t>, Tensor>> directions;  // (elements, t)
  for (const auto& grp : groups) {
    Tensor t = Tensor::zeros(DType::f64, g.shape());
    for (int64_t k : grp) t.data<double>()[k] = scale(k);
    directions.emplace_back(grp, t);
  }
  std::sort(single.begin(), single.end());
  if (!single.empty()) {
    Tensor t = Tensor::zeros(DType::f64, g.shape());
    for (int64_t k : single) t.data<double>()[k] = scale(k) * rng_.normal();
    directions.emplace_back(single, t);
  }
  const std::string bar = name(i) + "̄";
  const Shape& s = g.shape();
  for (const auto& direction : directions) {
    const std::vector<int64_t>& elements = direction.first;  // named, not bound: a lambda below captures them
    const Tensor& t = direction.second;
    if (std::any_of(elements.begin(), elements.end(), [&](int64_t k) { return !std::isfinite(g.item(k)); })) continue;
    double a = 0, magnitude = 0;
    for (int64_t k : elements) a += g.item(k) * t.item(k), magnitude += std::abs(g.item(k) * t.item(k));
    auto agrees = [&](const std::optional<Difference>& d) {
      return !d || std::abs(a - d->value) <= kRtol * std::max(std::abs(d->value), std::abs(a)) * 0.5 +
                                                 kRtol * 0.1 * magnitude + 10 * d->noise + 1e-10;
    };
    if (agrees(difference(p, t, r.ybar, base, false))) continue;               // unresolved, or agreeing at one step
    const std::optional<Difference> d = difference(p, t, r.ybar, base, true);  // a disagreement confirmed first
    if (agrees(d)) continue;
    const bool tied = elements.size() > 1 && std::all_of(elements.begin(), elements.end(),
                                                         [&](int64_t k) { return t.item(k) == t.item(elements[0]); });
    std::string where, what;
    double value = a, reference = d->value;
    if (tied) {
      std::vector<std::string> parts;
      for (int64_t k : elements) parts.push_back(at(bar, s, k));
      where = fmt::format("{}", fmt::join(parts, " + "));
      what = fmt::format("{} (the elements made equal, moved together) is {:.6g}", where, a);
    } else {
      where = at(bar, s, elements[0]);
      what = fmt::format("⟨{}, t⟩ along a random t over the row is {:.6g}", bar, a);
      for (size_t e = 0; e < elements.size() && e < kNarrowed; ++e) {
        const int64_t k = elements[e];
        Tensor unit = Tensor::zeros(DType::f64, g.shape());
        unit.data<double>()[k] = t.item(k);
        const std::optional<Difference> nk = difference(p, unit, r.ybar, base, true);
        const double ak = g.item(k) * t.item(k);
        if (nk && std::abs(ak - nk->value) >
                      kRtol * std::max(std::abs(nk->value), std::abs(ak)) * 0.5 + 10 * nk->noise + 1e-10) {
          where = at(bar, s, k), what = fmt::format("{} is {:.6g}", where, g.item(k));
          value = g.item(k), reference = nk->value / t.item(k);
          break;
        }
      }
    }
    return EdgeFinding{name(i),
                       fmt::format("{} {} away from the derivative: {}, central differences of the op in float64 give "
                                   "{:.6g}; reproduce: {}",
                                   gives(p), bar, what, reference, p.line),
                       where, value, reference};
  }
  return std::nullopt;
}

}  // namespace tapegrad::edges_detail
