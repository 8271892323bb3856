// tapegrad compare: the same model, seed and data trained with several attention kinds, side by side.
#include <fmt/core.h>

#include "ops/products/blas_info.hpp"
#include "ops/products/products.hpp"
#include "engine/parallel.hpp"
#include "models/files.hpp"
#include "models/gpt.hpp"
#include "models/plot.hpp"
#include "models/trainer.hpp"
#include "tools/commands.hpp"

namespace tapegrad::cli {

namespace {

struct CompareArgs {
  TrainConfig base;
  std::vector<std::string> kinds = compared_attention_kinds();
};

void run(const CompareArgs& a) {
  struct Row {
    std::string kind;
    TrainResult r;
  };
  // Before the first run: a kind named twice would train once and then be refused, its directory holding a run.
  for (size_t i = 0; i < a.kinds.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (a.kinds[i] == a.kinds[j]) fail("compare: --attention names {} twice; give each kind once", a.kinds[i]);
  validate_run_name(a.base.name);
  const std::string dir = a.base.out_dir + "/" + (a.base.name.empty() ? "compare" : a.base.name);
  refuse_replacing_run_files(dir + "/val_loss.svg", "compare's plot");
  std::vector<Row> rows;
  std::vector<PlotSeries> curves;
  fmt::print("compare: {} threads; BLAS {}\n{}\n", num_threads(), blas_summary(blas_info()), products_summary());
  for (const auto& kind : a.kinds) {
    TrainConfig c = a.base;
    c.model.attention = kind;
    c.out_dir = dir;  // one run directory per kind, DIR/KIND
    c.name = kind;
    c.config_files = config_files_read();
    c.loop.quiet = true;
    fmt::print("training {} attention ({} steps)...\n", kind, c.loop.max_steps);
    std::fflush(stdout);
    TrainResult r = train(c, stdout);
    PlotSeries s;
    s.label = kind;
    for (const auto& e : r.evals) s.points.emplace_back(static_cast<double>(e.step), e.val_loss);
    curves.push_back(s);
    rows.push_back({kind, r});
    fmt::print("  {}: val loss {:.4f}, {:.1f} ms/step\n", kind, r.evals.back().val_loss, r.ms_per_step);
  }
  write_loss_svg(dir + "/val_loss.svg", "validation loss by attention kind", curves);
  fmt::print("\n| attention | parameters | ms/step | train loss | val loss |\n|---|---:|---:|---:|---:|\n");
  for (const auto& [kind, r] : rows)
    fmt::print("| {} | {} | {:.1f} | {:.4f} | {:.4f} |\n", kind, r.parameters, r.ms_per_step, r.evals.back().train_loss,
               r.evals.back().val_loss);
  fmt::print("\nwrote {}/val_loss.svg and one run directory per kind under {}/\n", dir, dir);
}

}  // namespace

void add_compare_command(CLI::App& app) {
  auto args = std::make_shared<CompareArgs>();
  CLI::App* cmd = app.add_subcommand(
      "compare", "Train one model per attention kind with the same seed and data; a table and one plot");
  add_train_options(cmd, args->base, false);
  cmd->add_option("--attention", args->kinds,
                  "Attention kinds to compare, comma-separated (" + attention_kind_list() + ")")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::IsMember(attention_kinds()));
  cmd->add_option("--iters", args->base.loop.max_steps, "Training steps per kind")
      ->capture_default_str()
      ->check(positive());
  cmd->callback([args] { run(*args); });
}

}  // namespace tapegrad::cli
