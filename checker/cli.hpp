// The gradcheck command over any registry: `tapegrad gradcheck` runs it on the built-in ops, and a program of
// one's own ops gets the same command from gradcheck_main:
//
//   int main(int argc, char** argv) {
//     tapegrad::Registry registry;
//     register_my_ops(registry);                       // registry.add(...), registry.add_case(...)
//     return tapegrad::gradcheck_main(registry, argc, argv);
//   }
//   $ ./my_ops gradcheck --op my_op -v
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "../ops/products/products.hpp"
#include "gradcheck.hpp"

namespace tapegrad {

struct GradcheckRun {
  std::vector<std::string> ops;  // only these (all when empty)
  bool list = false;             // list the ops instead of checking them
  bool kinds = false;            // list the kinds of finding instead (checker/finding_sheet.hpp), as Markdown
  bool json = false;             // [{op, case, input, check, max_abs_err, max_rel_err, passed}, ...]
  bool verbose = false;          // one row per input and check, not one per case
  int order = 1;                 // 1: VJP, JVP, adjoint, accumulation; 2: second order (checker/second_order.hpp)
  // Set: each case's float64 check, then its rules in float32 tensors at these products against float64
  // (checker/precision.hpp). Unset: float64 alone.
  std::optional<ProductPrecision> precision;
  // Each case also probed at the edges of its domain, in float64 (checker/edges.hpp), but for the edges given as
  // EDGE=nan|inf|undefined in undefined_edges (the op's own declared ones are always skipped: OpSheet).
  bool edges = false;
  std::vector<std::string> undefined_edges;
  GradcheckOptions options;
};

// --precision NAME, as both command lines take it: f64 (nothing set: float64 alone), f32 or bf16; throws Error
// naming what was expected.
std::optional<ProductPrecision> parse_check_precision(std::string_view name);
// What --precision does, in one paragraph written from the precision check's constants (checker/precision.hpp).
std::string precision_option_help();
// Why this run cannot be made here ("--precision bf16: <what is missing>"), or "" when it can.
std::string precision_refusal(const GradcheckRun& run);

// Checks the selected ops' cases and prints a table (with the diagnosis of each failure) or JSON to `out`.
// Returns 0 when every case passed, 1 otherwise; throws Error for an op the registry does not have (and, with
// precision bf16, where bf16 products cannot run here).
int run_gradcheck(const Registry& registry, const GradcheckRun& run, std::FILE* out = stdout);

// A main for a program of one's own ops: [gradcheck] [--op NAME]... [--list] [--json] [-v] [--order 1|2]
// [--precision f64|f32|bf16] [--edges] [--undefined-edge EDGE=nan]... [--atol X] [--rtol X] [--eps X] [--seed N] [--full-jacobian-limit N] [--help], or
// explain OP [--case NAME] [--shape NAME=D,...]... [--json] (checker/explain.hpp). Returns the exit code:
// 0 passed, 1 a check failed (or --precision bf16 where bf16 products cannot run: one line on stderr saying why),
// 2 a usage error (printed to stderr on one line).
int gradcheck_main(const Registry& registry, int argc, const char* const* argv);

}  // namespace tapegrad
