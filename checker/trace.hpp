// An op's worked example with its numbers: `tapegrad explain OP --trace` runs the lines of the op's sheet
// (OpSheet::trace, ops/sheet.hpp) on a tiny seeded input in float64 (or at the shapes asked for) and prints each
// formula of the forward and the VJP with its shape and the matrix it produces, down to the inputs' gradients; then
// the node's Jacobian J, built from its JVP, where it is small, with x̄ = Jᵀȳ against the lines' x̄; then compares
// those gradients with the node's own VJP at the same ȳ, and gradchecks the node at the same inputs.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <utility>
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

// The node's Jacobian of one input, column k its JVP at the tangent e_k: forward mode, a rule of its own, so
// Jᵀȳ against the lines' x̄ shows the VJP as the JVP's transpose.
struct TracedJacobian {
  std::string input;
  int64_t rows = 0, cols = 0;  // y's and the input's number of elements
  Tensor value;                // (rows, cols), entry (j, k) = ∂y_j/∂x_k in row-major order; kept where printed
  double max_abs_diff = 0;     // max |Jᵀȳ − x̄ of the lines|
  bool agrees = false;
};

struct OpTraceRun {
  std::string op, case_name;
  uint64_t seed = 0;
  std::vector<std::pair<std::string, Tensor>> inputs;  // name, value (float64)
  Tensor ybar;                                         // the cotangent, drawn from the seed
  bool shapes_given = false;                           // the example at shapes asked for
  std::vector<TracedLine> lines;
  std::vector<TracedJacobian> jacobians;  // one per differentiable input
  std::vector<TracedGradient> gradients;
  GradcheckReport check;  // the node's gradcheck at the same inputs
  bool passed = false;    // every gradient and Jᵀȳ agrees and the gradcheck passed
};

// A Jacobian is printed when it has at most this many entries, and built when its input has at most
// kTraceMaxInputElements (the most --shape may give an input: the trace prints every value).
inline constexpr int64_t kTracePrintedJacobian = 64, kTraceMaxInputElements = 256;

// Throws Error for an op the registry does not have, or one whose sheet has no worked example (naming the ops
// that have one), for a shape the example has no input of or that is over kTraceMaxInputElements, and for shapes
// the op refuses.
OpTraceRun trace_op(const Registry& registry, std::string_view op, const GradcheckOptions& options = {},
                    std::span<const std::pair<std::string, Shape>> shapes = {});
std::string format_trace(const OpTraceRun& run);
nlohmann::json trace_json(const OpTraceRun& run);

}  // namespace tapegrad
