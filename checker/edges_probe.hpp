// The edge probes' parts (internal to checker/): a probe, a finding, and the prober that makes the probes of each
// input (checker/edges.cpp: where to probe) and judges the op at each (checker/edges_judge.cpp: what is held there).
// checker/edges.hpp says what both do.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "../engine/rng.hpp"
#include "edges.hpp"

namespace tapegrad::edges_detail {

// One edge input: the edge, the input it changes, the inputs, the line that reproduces it, the edge in words, the
// probed elements (flat indices into the input) and the same inputs next to the edge (empty: none).
struct Probe {
  std::string edge;
  size_t slot = 0;
  std::vector<Tensor> inputs;
  std::string line, words;
  std::vector<int64_t> row;
  std::vector<Tensor> near;
};

struct EdgeFinding {
  std::string input, message, worst;
  double value, reference;
};

// Deep copies of the inputs, one to change per probe.
inline std::vector<Tensor> copies(std::span<const Tensor> xs) {
  std::vector<Tensor> out;
  for (const Tensor& x : xs) out.push_back(x.clone());
  return out;
}

// The probed rows of an input: its axis, the row's elements and how the report writes them.
struct Row {
  std::vector<int64_t> elements;   // flat indices along the axis
  std::vector<std::string> index;  // "1", ":" per axis, the row axis's entry last replaced by the tail
  int axis = -1;                   // -1: a 0-d input
  std::string text(const std::string& name, const std::string& tail = ":") const {
    std::vector<std::string> parts = index;
    if (axis >= 0) parts[static_cast<size_t>(axis)] = tail;
    return fmt::format("{}[{}]", name, fmt::join(parts, ", "));
  }
};

class Prober {
 public:
  Prober(const Function& f, std::span<const Tensor> inputs, std::span<const std::string> names, uint64_t seed)
      : f_(f), xs_(copies(inputs)), names_(names), rng_(seed ^ 0xed9e5ull) {}

  std::vector<Probe> probes_of(size_t slot, std::vector<std::string>& notes);
  std::optional<EdgeFinding> judge(const Probe& p);
  std::string name(size_t i) const { return input_name(names_, i); }
  // the edges the op refused with an Error, in words, for the report's notes
  const std::vector<std::string>& refused() const { return refused_; }

 private:
  struct Run {
    Tensor y, ybar;
    std::vector<Tensor> grads, grads0;
  };
  Run run(std::span<const Tensor> inputs);
  Tensor forward(std::span<const Tensor> inputs) const { return evaluate(f_, inputs); }
  // f at inputs, or none where the op refuses them (an Error: outside its domain)
  std::optional<Tensor> forward_or_none(std::span<const Tensor> inputs) const {
    try {
      return forward(inputs);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  double loss(std::span<const Tensor> inputs, const Tensor& ybar) const;
  int row_axis(size_t slot);
  Row row_of(size_t slot, int axis) const;
  bool masking_applies(size_t slot, const Row& r) const;
  std::optional<Probe> cut_to_one(size_t slot, const Row& r, std::vector<std::string>& notes) const;
  std::optional<EdgeFinding> output_finding(const Probe& p, const Run& r) const;
  std::optional<EdgeFinding> gradient_finding(const Probe& p, const Run& r, size_t i);  // draws directions
  std::optional<EdgeFinding> infinite(const Probe& p, const Run& r, size_t i, int64_t k) const;
  // a central difference and its rounding noise (1e-13 of the loss's size over the step): a derivative below it is
  // not resolved, and is held to that much more
  struct Difference {
    double value, noise;
  };
  std::optional<Difference> difference(const Probe& p, const Tensor& t, const Tensor& ybar, double base,
                                       bool confirmed) const;
  std::optional<EdgeFinding> disagreement(const Probe& p, const Run& r, size_t i);

  const Function& f_;
  std::vector<Tensor> xs_;
  std::span<const std::string> names_;
  Rng rng_;
  std::vector<std::string> refused_;
};

}  // namespace tapegrad::edges_detail
