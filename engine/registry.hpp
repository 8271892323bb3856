// The op registry: every op registers its name, the equation its derivatives implement, and one or more
// gradcheck cases. `tapegrad gradcheck` and the test suite iterate it; a test fails for an op without a case.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tape.hpp"

namespace tapegrad {

// How a gradcheck input is filled: values that keep an op away from its kinks and its domain's edges.
enum class Fill {
  normal,          // N(0, 1)
  positive,        // U(0.5, 2): log, division, square roots
  away_from_zero,  // ±U(0.2, 2): relu, elu and other kinks at 0
  zeros,           // exactly 0: a point where a formula has a special case (β at x = 0)
  indices,         // int32 in [0, index_bound): token ids, class targets (not differentiable)
};

struct InputSpec {
  std::string name;
  Shape shape;
  Fill fill = Fill::normal;
  int64_t index_bound = 0;
  bool differentiable() const { return fill != Fill::indices; }
};

struct GradcheckCase {
  std::string name;
  std::vector<InputSpec> inputs;
  Function build;                      // the op (or a small map around it) applied to the inputs
  std::optional<double> atol{}, rtol{};  // only where an op needs other tolerances than the checker's
};

struct OpInfo {
  std::string name;      // as recorded on the tape
  std::string family;    // the file in ops/ that holds it
  std::string equation;  // the derivative it implements, in one line
  std::vector<GradcheckCase> cases;
};

class Registry {
 public:
  void add(OpInfo op);
  void add_case(std::string_view op, GradcheckCase c);
  const std::vector<OpInfo>& ops() const { return ops_; }
  const OpInfo* find(std::string_view name) const;

 private:
  std::vector<OpInfo> ops_;
};

// Inputs for a case, drawn from a seeded generator in the given float dtype.
std::vector<Tensor> make_inputs(std::span<const InputSpec> specs, DType dtype, uint64_t seed);

}  // namespace tapegrad
