// tapegrad gradcheck: every built-in op (or some) in float64, as a table with the diagnosis of each failure, or
// as JSON; with --precision f32|bf16, each op's rules also at that precision against float64. The command itself is
// checker/cli's run_gradcheck, which a program of one's own ops calls too.
#include <memory>

#include <fmt/core.h>

#include "checker/cli.hpp"
#include "checker/edges.hpp"
#include "ops/ops.hpp"
#include "tools/commands.hpp"

namespace tapegrad::cli {

void add_gradcheck_command(CLI::App& app) {
  auto args = std::make_shared<GradcheckRun>();
  CLI::App* cmd = app.add_subcommand(
      "gradcheck", "Check every op's VJP and JVP against central finite differences in float64 (exit 1 on a failure)");
  cmd->add_option("--op", args->ops, "Only these ops (repeatable)");
  cmd->add_flag("--list", args->list, "List the registered ops and their cases");
  cmd->add_flag("--kinds", args->kinds, "List the kinds of finding a report can name, as a Markdown table");
  cmd->add_flag("--json", args->json,
                "Print a JSON list of {op, case, input, check, max_abs_err, max_rel_err, passed}");
  cmd->add_flag("-v,--verbose", args->verbose, "One row per input and check instead of one per case");
  cmd->add_option("--order", args->order,
                  "1: VJP and JVP against finite differences; 2: Hessian-vector products (the ops' second-order "
                  "rules) against differences of the gradient, and the Hessian's symmetry")
      ->capture_default_str()
      ->check(CLI::IsMember({1, 2}));
  cmd->add_option_function<std::string>(
         "--precision", [args](const std::string& name) { args->precision = parse_check_precision(name); },
         precision_option_help())
      ->check(CLI::IsMember({"f64", "f32", "bf16"}))
      ->default_str("f64");
  cmd->add_flag("--edges", args->edges,
                "Also run each case's forward and VJP in float64 at the edges of its domain (a masked, constant, tied, "
                "zero, overflowing or tiny row): NaN or ∞ where the limit is finite, x̄ not 0 at ȳ = 0, x̄ away from "
                "central differences; each finding with a line that reproduces it");
  cmd->add_option("--undefined-edge", args->undefined_edges,
                  "EDGE=nan|inf|undefined: an edge the ops define as undefined, not probed (repeatable)")
      ->check([](const std::string& entry) {
        try {
          parse_undefined_edges(std::vector<std::string>{entry});
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      });
  cmd->add_option("--atol", args->options.atol, "Absolute tolerance")->capture_default_str()->check(positive());
  cmd->add_option("--rtol", args->options.rtol, "Relative tolerance")->capture_default_str()->check(non_negative());
  cmd->add_option("--eps", args->options.eps, "Finite-difference step")->capture_default_str()->check(positive());
  cmd->add_option("--seed", args->options.seed, "Seed of the random inputs and projections")->capture_default_str();
  cmd->add_option("--full-jacobian-limit", args->options.full_jacobian_limit,
                  "Full Jacobian when output size × input size is at most this, else random projections")
      ->capture_default_str()
      ->check(non_negative());
  cmd->callback([args] {
    if (const std::string why = precision_refusal(*args); !why.empty()) {
      fmt::print(stderr, "tapegrad: error: {}\n", why);
      return set_exit_code(1);
    }
    if (run_gradcheck(builtin_registry(), *args)) set_exit_code(1);
  });
}

}  // namespace tapegrad::cli
