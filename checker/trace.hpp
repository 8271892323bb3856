// An op's worked example with its numbers: `tapegrad explain OP --trace` runs the lines of the op's sheet
// (OpSheet::trace, ops/sheet.hpp) on a tiny seeded input in float64 and prints each formula of the forward and the
// VJP with the matrix it produces, down to the inputs' gradients; then compares those gradients with the node's
// own VJP at the same ȳ, and gradchecks the node at the same inputs.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "gradcheck.hpp"

namespace tapegrad {

struct TracedLine {
  std::string part;     // "forward", "VJP", ...
  std::string formula;  // "D = rowsum(y ⊙ ȳ)"
  Tensor value;         // float64
};

// One input's gradient from the example's lines against the node's own VJP.
struct TracedGradient {
  std::string input;
  double max_abs_diff = 0;  // max |x̄_lines − x̄_node|
  double scale = 0;         // max |x̄_node|
  bool agrees = false;      // within 1e-12·(1 + scale), and both finite
};

struct OpTraceRun {
  std::string op, case_name;
  uint64_t seed = 0;
  std::vector<std::pair<std::string, Tensor>> inputs;  // name, value (float64)
  Tensor ybar;                                         // the cotangent, drawn from the seed
  std::vector<TracedLine> lines;
  std::vector<TracedGradient> gradients;
  GradcheckReport check;  // the node's gradcheck at the same inputs
  bool passed = false;    // every gradient agrees and the gradcheck passed
};

// Throws Error for an op the registry does not have, or one whose sheet has no worked example (naming the ops
// that have one).
OpTraceRun trace_op(const Registry& registry, std::string_view op, const GradcheckOptions& options = {});
std::string format_trace(const OpTraceRun& run);
nlohmann::json trace_json(const OpTraceRun& run);

}  // namespace tapegrad
