// tapegrad gradcheck: every registered op (or one) in float64, as a table or as JSON.
#include <chrono>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "engine/gradcheck.hpp"
#include "ops/ops.hpp"
#include "tools/commands.hpp"

namespace tapegrad::cli {

namespace {
int g_exit_code = 0;

struct GradcheckArgs {
  std::vector<std::string> ops;
  bool list = false;
  bool json = false;
  bool verbose = false;
  GradcheckOptions opt;
};

void list_ops(const Registry& reg) {
  for (const OpInfo& op : reg.ops()) {
    fmt::print("{:<16} {:<14} {} case{}   {}\n", op.name, op.family, op.cases.size(), op.cases.size() == 1 ? " " : "s",
               op.equation);
  }
}

void run(const GradcheckArgs& a) {
  const Registry& reg = builtin_registry();
  if (a.list) return list_ops(reg);
  std::vector<const OpInfo*> selected;
  for (const auto& name : a.ops) {
    const OpInfo* op = reg.find(name);
    if (!op) fail("gradcheck: no op named '{}' (tapegrad gradcheck --list shows them)", name);
    selected.push_back(op);
  }
  if (selected.empty())
    for (const auto& op : reg.ops()) selected.push_back(&op);

  auto t0 = std::chrono::steady_clock::now();
  nlohmann::json rows = nlohmann::json::array();
  int cases = 0, failed = 0;
  if (!a.json)
    fmt::print("{:<16} {:<22} {:<8} {:<10} {:>11} {:>11}  {}\n", "op", "case", "input", "check", "max_abs_err",
               "max_rel_err", "result");
  for (const OpInfo* op : selected) {
    for (const auto& c : op->cases) {
      GradcheckReport r = gradcheck(c, a.opt, op->name);
      ++cases;
      failed += !r.passed();
      for (const auto& ch : r.checks) {
        if (a.json) {
          rows.push_back({{"op", op->name}, {"case", c.name}, {"input", ch.input}, {"check", ch.check},
                          {"max_abs_err", ch.max_abs_err}, {"max_rel_err", ch.max_rel_err}, {"passed", ch.passed}});
        } else if (a.verbose || !ch.passed) {
          fmt::print("{:<16} {:<22} {:<8} {:<10} {:>11.2e} {:>11.2e}  {}{}\n", op->name, c.name, ch.input, ch.check,
                     ch.max_abs_err, ch.max_rel_err, ch.passed ? "ok" : "FAIL at ", ch.passed ? "" : ch.worst);
        }
      }
      if (!a.json && !a.verbose && r.passed()) {
        double worst = 0;
        for (const auto& ch : r.checks)
          if (ch.check == "vjp" || ch.check == "jvp") worst = std::max(worst, ch.max_abs_err);
        fmt::print("{:<16} {:<22} {:<8} {:<10} {:>11.2e} {:>11}  ok\n", op->name, c.name, "all", "all", worst, "");
      }
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.json) fmt::print("{}\n", rows.dump(2));
  else fmt::print("\n{} ops, {} cases: {} passed, {} failed ({:.2f} s)\n", selected.size(), cases, cases - failed, failed,
                  secs);
  if (failed) set_exit_code(1);
}
}  // namespace

int exit_code() { return g_exit_code; }
void set_exit_code(int code) { g_exit_code = code; }

void add_gradcheck_command(CLI::App& app) {
  auto args = std::make_shared<GradcheckArgs>();
  CLI::App* cmd = app.add_subcommand(
      "gradcheck", "Check every op's VJP and JVP against central finite differences in float64 (exit 1 on a failure)");
  cmd->add_option("--op", args->ops, "Only these ops (repeatable)");
  cmd->add_flag("--list", args->list, "List the registered ops and their cases");
  cmd->add_flag("--json", args->json,
                "Print a JSON list of {op, case, input, check, max_abs_err, max_rel_err, passed}");
  cmd->add_flag("-v,--verbose", args->verbose, "One row per input and check instead of one per case");
  cmd->add_option("--atol", args->opt.atol, "Absolute tolerance")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--rtol", args->opt.rtol, "Relative tolerance")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--eps", args->opt.eps, "Finite-difference step")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--seed", args->opt.seed, "Seed of the random inputs and projections")->capture_default_str();
  cmd->callback([args] { run(*args); });
}

}  // namespace tapegrad::cli
