// tapegrad explain OP: one op's forward, VJP and JVP, where they are written and derived, what its node keeps and
// costs at a shape, and its gradcheck there and then (checker/explain.hpp); with --trace, its worked example with
// the numbers (checker/trace.hpp). With no op: the list of ops.
#include <fmt/core.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "checker/explain.hpp"
#include "checker/cli.hpp"
#include "checker/trace.hpp"
#include "models/files.hpp"
#include "ops/ops.hpp"
#include "tools/commands.hpp"

namespace tapegrad::cli {

namespace {

struct ExplainArgs {
  std::string op;
  std::vector<std::string> shapes;  // NAME=D,D,...
  bool json = false;
  bool index_markdown = false;
  bool trace = false;
  ExplainOptions options;
};

}  // namespace

void add_explain_command(CLI::App& app) {
  auto args = std::make_shared<ExplainArgs>();
  CLI::App* cmd = app.add_subcommand(
      "explain",
      "One op on one screen: its forward, VJP and JVP, where they are written and derived, what it keeps "
      "and costs at a shape, and its gradcheck; with no op, the list of ops");
  cmd->add_option("op", args->op, "The op, as gradcheck --list names it");
  cmd->add_option("--case", args->options.case_name, "The gradcheck case to explain (default: the op's first)");
  cmd->add_option("--shape", args->shapes,
                  "An input's shape in place of the case's (or, with --trace, the worked example's), NAME=D,D,... "
                  "(repeatable; NAME= for a scalar)");
  cmd->add_flag("--json", args->json, "Print the same as one JSON object");
  cmd->add_flag("--trace", args->trace,
                "The op's worked example: each formula of its forward and VJP with its shape and the matrix it "
                "produces on a tiny seeded input (--shape for another), the node's Jacobian where it is small with "
                "x̄ = Jᵀȳ, the gradients against the node's own VJP, and the node's gradcheck there (softmax, "
                "attention, layer_norm, row_normalize; exit 1 if they disagree)");
  cmd->add_option("--seed", args->options.gradcheck.seed, "With --trace: the seed of the example's inputs and ȳ")
      ->capture_default_str();
  cmd->add_flag("--index-markdown", args->index_markdown,
                "Print every op's formulas as one markdown table: file, forward, VJP, JVP, second order, sections");
  cmd->callback([args] {
    if (args->index_markdown) {
      fmt::print("{}", index_markdown(builtin_registry()));
      return;
    }
    if (args->op.empty()) {
      GradcheckRun list;
      list.list = true;
      list.json = args->json;
      run_gradcheck(builtin_registry(), list);
      return;
    }
    for (const std::string& s : args->shapes) args->options.shapes.push_back(parse_named_shape("--shape", s));
    if (args->trace) {
      if (!args->options.case_name.empty())
        throw CLI::ValidationError("--trace", "runs the op's own worked example: --case does not apply");
      const OpTraceRun run = trace_op(builtin_registry(), args->op, args->options.gradcheck, args->options.shapes);
      if (args->json) fmt::print("{}\n", trace_json(run).dump(2));
      else fmt::print("{}", format_trace(run));
      if (!run.passed) set_exit_code(1);
      return;
    }
    try {  // without it, explain names the sections by number only
      args->options.derivations_path = shared_file("docs/derivations.md");
    } catch (const Error& missing) {
      fmt::print(stderr, "tapegrad: warning: {}\n", missing.what());
    }
    const Explanation e = explain(builtin_registry(), args->op, args->options);
    if (args->json) fmt::print("{}\n", explanation_json(e).dump(2));
    else fmt::print("{}", format_explanation(e));
    if (!e.check.passed || !e.check_second_order.passed) set_exit_code(1);
  });
}

}  // namespace tapegrad::cli
