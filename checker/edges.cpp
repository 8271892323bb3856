// The edge probes (checker/edges.hpp says what is probed and what is held there): where to probe each input, and the
// report. The judgement at each probe is checker/edges_judge.cpp.
#include "checker/edges.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <numeric>

#include "checker/edges_probe.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad {

using namespace gradcheck_detail;

namespace edges_detail {

namespace {

constexpr double kLarge = 710;      // exp(710) overflows float64
constexpr double kTiny = 1e-200;    // its square underflows float64
constexpr double kNearMask = -1e4;  // −∞ next to the edge
constexpr double kNearBack = 1e-3;  // next to the edge: this part of the way back to the checked row

bool same_or_both_nan(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

}  // namespace

int Prober::row_axis(size_t slot) {
  const Tensor& x = xs_[slot];
  if (x.rank() == 0) return -1;
  const Tensor base = forward(xs_);
  // the outputs that move when element `flat` moves
  auto moved = [&](int64_t flat) {
    std::vector<char> changed(static_cast<size_t>(base.numel()), 0);
    for (double by : {0.5, -0.5, 10.0, -10.0}) {  // up and down, a little and far: a max moves with one element
                                                  // one way, once it is the max
      std::vector<Tensor> in = copies(xs_);
      double& v = in[slot].data<double>()[flat];
      v += by * (1 + std::abs(v));
      const std::optional<Tensor> y = forward_or_none(in);
      if (!y) continue;  // a point outside the op's domain (a square root below 0) moves nothing it says
      for (int64_t j = 0; j < y->numel(); ++j)
        if (!same_or_both_nan(y->item(j), base.item(j))) changed[static_cast<size_t>(j)] = 1;
    }
    return changed;
  };
  const std::vector<char> first = moved(0);
  int reduced = -1;
  int64_t stride = 1;
  std::vector<int64_t> strides(static_cast<size_t>(x.rank()));
  for (int a = x.rank() - 1; a >= 0; --a) strides[static_cast<size_t>(a)] = stride, stride *= x.shape()[a];
  for (int a = 0; a < x.rank(); ++a) {
    if (x.shape()[a] < 2) continue;
    const std::vector<char> other = moved(strides[static_cast<size_t>(a)]);
    for (size_t j = 0; j < other.size(); ++j)
      if (first[j] && other[j]) {
        reduced = a;
        break;
      }
  }
  return reduced >= 0 ? reduced : x.rank() - 1;
}

// The probed row: index 1 along the first other axis longer than 1 (else 0), 0 along the rest.
Row Prober::row_of(size_t slot, int axis) const {
  const Shape& s = xs_[slot].shape();
  Row r;
  r.axis = axis;
  std::vector<int64_t> idx(static_cast<size_t>(s.rank()), 0);
  bool placed = false;
  for (int a = 0; a < s.rank(); ++a) {
    if (a == axis) {
      r.index.emplace_back(":");
    } else if (s[a] > 1 && !placed) {
      idx[static_cast<size_t>(a)] = 1, placed = true;
      r.index.emplace_back("1");
    } else {
      r.index.emplace_back("0");
    }
  }
  if (axis < 0) return r;
  for (int64_t k = 0; k < s[axis]; ++k) {
    idx[static_cast<size_t>(axis)] = k;
    r.elements.push_back(ravel(s, idx));
  }
  return r;
}

// Whether one −∞, at the row's last element and then at its first, keeps every output and every x̄ finite: then −∞
// is a mask the op takes. (y alone can fool it: a query q with one −∞ makes its scores q·k_j all −∞ where every k_j
// has one sign there, a row the attention reads as masked, and k̄ = dSᵀq is then 0·∞.)
bool Prober::masking_applies(size_t slot, const Row& r) const {
  auto finite = [](const Tensor& t) {
    for (int64_t j = 0; j < t.numel(); ++j)
      if (!std::isfinite(t.item(j))) return false;
    return true;
  };
  for (int64_t k : {r.elements.back(), r.elements.front()}) {
    std::vector<Tensor> in = copies(xs_);
    in[slot].data<double>()[k] = -INFINITY;
    try {
      const Tensor y = forward(in);
      if (!finite(y)) return false;
      Rng rng(0x5eedull);
      for (const Tensor& g : vjp(f_, in, Tensor::randn(DType::f64, y.shape(), rng)))
        if (g.defined() && !finite(g)) return false;
    } catch (const std::exception&) {  // an op that refuses −∞ does not take it as a mask
      return false;
    }
  }
  return true;
}

// The inputs cut to a length of 1 along x's row axis: every input whose length at that axis, counted from the end,
// is x's, cut to its first element there. None, with a note, where the op refuses its inputs cut so.
std::optional<Probe> Prober::cut_to_one(size_t slot, const Row& r, std::vector<std::string>& notes) const {
  const Shape& xs = xs_[slot].shape();
  const int back = xs.rank() - r.axis;  // the axis counted from the end: 1 for the last
  const int64_t n = xs[r.axis];
  Probe p{"length_one", slot, copies(xs_), "", fmt::format("a length of 1 along {}'s axis -{}", name(slot), back),
          {},           {}};
  std::vector<std::string> cut, narrowed;
  for (size_t s = 0; s < xs_.size(); ++s) {
    const Shape& shape = xs_[s].shape();
    const int axis = shape.rank() - back;
    if (axis < 0 || shape[axis] != n) continue;
    Shape one = shape;
    one[axis] = 1;
    int64_t inner = 1;
    for (int a = axis + 1; a < shape.rank(); ++a) inner *= shape[a];
    const auto bytes = static_cast<size_t>(inner) * dtype_size(xs_[s].dtype());
    Tensor t = Tensor::empty(xs_[s].dtype(), one);
    for (int64_t o = 0; o < one.numel() / std::max<int64_t>(inner, 1); ++o)  // each outer index's first slice
      std::memcpy(static_cast<char*>(t.raw()) + static_cast<size_t>(o) * bytes,
                  static_cast<const char*>(xs_[s].raw()) + static_cast<size_t>(o * n) * bytes, bytes);
    p.inputs[s] = std::move(t);
    cut.push_back(name(s));
    narrowed.push_back(fmt::format("{}.narrow(-{}, 0, 1)", name(s), back));
  }
  if (!forward_or_none(p.inputs)) {
    notes.push_back(fmt::format("{}: not probed at a length of 1 along axis -{}: the op refuses its inputs cut so",
                                name(slot), back));
    return std::nullopt;
  }
  p.line = fmt::format("{} = {}", fmt::join(cut, ", "), fmt::join(narrowed, ", "));
  std::vector<int64_t> idx(static_cast<size_t>(xs.rank()), 0);  // the row's one element: the row's index, 0 on the axis
  for (int a = 0; a < xs.rank(); ++a)
    if (a != r.axis) idx[static_cast<size_t>(a)] = r.index[static_cast<size_t>(a)] == "1" ? 1 : 0;
  Shape one = xs;
  one[r.axis] = 1;
  p.row = {ravel(one, idx)};
  return p;
}

std::vector<Probe> Prober::probes_of(size_t slot, std::vector<std::string>& notes) {
  const std::string name = this->name(slot);
  const Tensor& x = xs_[slot];
  const int axis = row_axis(slot);
  const Row r = row_of(slot, axis);
  std::vector<int64_t> elements = r.elements;
  if (axis < 0) elements = {0};
  const auto n = static_cast<int64_t>(elements.size());
  std::vector<Probe> probes;
  // change: the input at the edge, in place; near: the input next to it (given the edge's values), or none
  auto add = [&](std::string edge, std::string words, std::string line, const std::function<void(double*)>& change,
                 const std::function<void(double*, const double*)>& near = nullptr, std::vector<int64_t> row = {}) {
    Probe p{std::move(edge),
            slot,
            copies(xs_),
            std::move(line),
            std::move(words),
            row.empty() ? elements : std::move(row),
            {}};
    change(p.inputs[slot].data<double>());
    if (near) {
      p.near = copies(xs_);
      near(p.near[slot].data<double>(), p.inputs[slot].data<double>());
    }
    probes.push_back(std::move(p));
  };
  auto fill = [&](double v) {
    return [&elements, v](double* e) {
      for (int64_t k : elements) e[k] = v;
    };
  };
  auto alternate = [&](double v) {
    return [&elements, v](double* e) {
      for (size_t k = 0; k < elements.size(); ++k) e[elements[k]] = k % 2 == 0 ? v : -v;
    };
  };
  const double* x0 = x.data<double>();
  const bool positive = std::all_of(x0, x0 + x.numel(), [](double v) { return v >= 0; });
  if (axis < 0) {  // 0-d: the whole input
    add("zeros", "a zero input", name + " = 0", fill(0));
    add("large", "a large value (710 at float64)", name + " = 710", fill(kLarge));
    add("tiny", "a tiny value (1e-200 at float64)", name + " = 1e-200", fill(kTiny));
    return probes;
  }
  const std::string row = r.text(name), first = r.text(name, "0");
  if (masking_applies(slot, r)) {
    add("masked_rows", "a fully masked row (all −∞)", row + " = -inf", fill(-INFINITY),
        [&elements](double* v, const double*) {
          for (int64_t k : elements) v[k] = kNearMask;
        });
    if (n > 1)
      add(
          "one_left", "a row masked but for one element", r.text(name, "1:") + " = -inf",
          [&elements](double* e) {
            for (size_t k = 1; k < elements.size(); ++k) e[elements[k]] = -INFINITY;
          },
          [&elements](double* v, const double*) {
            for (size_t k = 1; k < elements.size(); ++k) v[elements[k]] = kNearMask;
          });
  } else {
    notes.push_back(name + ": one −∞ in a row is outside the op's domain (y or x̄ is not finite): no masked rows");
  }
  if (n > 1) {
    add("constant_rows", "a constant row", row + " = " + first, fill(x0[elements[0]]),
        [&elements](double* v, const double* e) {
          for (int64_t k : elements) v[k] = e[k] + kNearBack * (v[k] - e[k]);
        });
    std::vector<size_t> order(elements.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x0[elements[a]] < x0[elements[b]]; });
    const size_t hi0 = order[order.size() - 2], hi1 = order.back(), lo0 = order[0], lo1 = order[1];
    std::string line = fmt::format("{} = {}", r.text(name, std::to_string(hi0)), r.text(name, std::to_string(hi1)));
    if (n >= 4) line += fmt::format("; {} = {}", r.text(name, std::to_string(lo1)), r.text(name, std::to_string(lo0)));
    add("ties", "an exact tie (a row's two largest, and two smallest, made equal)", line, [&, n](double* e) {
      e[elements[hi0]] = e[elements[hi1]];
      if (n >= 4) e[elements[lo1]] = e[elements[lo0]];
    });
    if (std::optional<Probe> cut = cut_to_one(slot, r, notes)) probes.push_back(std::move(*cut));
  }
  add("zeros", "a zero row", row + " = 0", fill(0), [&elements](double* v, const double*) {
    for (int64_t k : elements) v[k] *= kNearBack;
  });
  if (x.rank() > 1 && x.numel() > n) {
    std::vector<int64_t> all(static_cast<size_t>(x.numel()));
    std::iota(all.begin(), all.end(), int64_t{0});
    const int64_t size = x.numel();
    add(
        "zeros", "an all-zero input", name + " = 0", [size](double* e) { std::fill(e, e + size, 0.0); },
        [size](double* v, const double*) { std::transform(v, v + size, v, [](double a) { return a * kNearBack; }); },
        all);
  }
  if (positive) {
    add("large", "large values (710 at float64)", row + " = 710", fill(kLarge));
    add("tiny", "tiny values (1e-200 at float64)", row + " = 1e-200", fill(kTiny),
        [&elements](double* v, const double*) {
          for (int64_t k : elements) v[k] = kTiny * 1e100;
        });
  } else {
    add("large", "large values (±710 at float64)",
        fmt::format("{} = 710; {} = -710", r.text(name, "::2"), r.text(name, "1::2")), alternate(kLarge));
    add("tiny", "tiny values (±1e-200 at float64)",
        fmt::format("{} = 1e-200; {} = -1e-200", r.text(name, "::2"), r.text(name, "1::2")), alternate(kTiny),
        [&elements](double* v, const double*) {
          for (size_t k = 0; k < elements.size(); ++k) v[elements[k]] = k % 2 == 0 ? kTiny * 1e100 : -kTiny * 1e100;
        });
  }
  return probes;
}

}  // namespace edges_detail

using namespace edges_detail;

UndefinedEdges parse_undefined_edges(std::span<const std::string> entries) {
  UndefinedEdges out;
  for (const std::string& entry : entries) {
    const size_t eq = entry.find('=');
    const std::string edge = entry.substr(0, eq), what = eq == std::string::npos ? "" : entry.substr(eq + 1);
    if (std::find(kEdges.begin(), kEdges.end(), edge) == kEdges.end())
      fail("edges: no edge is named '{}'; the edges are {}", edge, fmt::join(kEdges, ", "));
    if (what != "nan" && what != "inf" && what != "undefined")
      fail("edges: '{}' must be EDGE=nan, EDGE=inf or EDGE=undefined (what the op gives there), got '{}'", entry, what);
    out[edge] = what;
  }
  return out;
}

void probe_edges(GradcheckReport& report, const Function& f, std::span<const Tensor> inputs,
                 std::span<const std::string> names, uint64_t seed, const UndefinedEdges& undefined) {
  Prober prober(f, inputs, names, seed);
  std::vector<std::string> notes;
  std::vector<EdgeFinding> findings;
  size_t probed = 0;
  for (size_t slot = 0; slot < inputs.size(); ++slot) {
    if (inputs[slot].dtype() != DType::f64) continue;
    size_t mine = 0;
    std::optional<EdgeFinding> first;
    for (const Probe& p : prober.probes_of(slot, notes)) {
      if (undefined.count(p.edge)) continue;
      ++probed, ++mine;
      if (std::optional<EdgeFinding> found = prober.judge(p)) {
        if (!first) first = found;  // the probed input's row fails, whichever x̄ broke
        findings.push_back(std::move(*found));
      }
    }
    CheckResult row;
    row.input = prober.name(slot), row.check = "edges", row.mode = "edge";
    row.compared = static_cast<int64_t>(mine);
    row.analytic_is = "at the edge", row.numeric_is = "held to";
    if (first) {
      row.passed = false;
      row.worst = first->worst;
      row.analytic = first->value, row.numeric = first->reference;
      const double err = std::abs(first->value - first->reference);
      row.max_abs_err = row.max_rel_err = std::isfinite(err) ? err : INFINITY;
    }
    report.checks.push_back(std::move(row));
  }
  for (size_t k = 0; k < findings.size() && k < kMaxEdgeFindings; ++k)
    report.diagnoses.push_back({Finding::edge, findings[k].input, "edges", findings[k].message});
  std::string note = fmt::format("edges: {} inputs at the edges of the op's domain, run in float64", probed);
  if (findings.size() > kMaxEdgeFindings)
    note += fmt::format("; {} more edges break (the first {} are shown)", findings.size() - kMaxEdgeFindings,
                        kMaxEdgeFindings);
  if (!undefined.empty()) {
    std::vector<std::string> declared;
    for (const auto& [edge, what] : undefined) declared.push_back(edge + " (" + what + ")");
    note += fmt::format("; not probed, declared undefined: {}", fmt::join(declared, ", "));
  }
  report.notes.push_back(std::move(note));
  for (const std::string& n : notes) report.notes.push_back("edges: " + n);
  for (const std::string& n : prober.refused()) report.notes.push_back("edges: " + n);
  report.conclude();
}

}  // namespace tapegrad
