// tapegrad bench --profile: the training step of the default model, op by op, on one thread and on the engine's
// threads. A row's speedup (one thread's ms / the pool's ms) shows the parts of the step that do not use the cores.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/parallel.hpp"
#include "tools/bench_workloads.hpp"

namespace tapegrad::cli::bench {

namespace {

struct ThreadProfile {
  int threads = 0;
  Profile profile{&builtin_registry()};
  double measured_ms = 0;  // the mean of the profiled steps, timed around each step
};

ThreadProfile profile_steps(const BenchArgs& a, int threads, int steps) {
  set_num_threads(threads);
  ThreadProfile tp;
  tp.threads = threads;
  TrainStep step(a.model, a.batch);
  for (int i = 0; i < std::min(steps, 5); ++i) step.run();  // warm-up: the arena's pages, the pool's threads
  step.profile = &tp.profile;
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) {
    const auto t0 = Clock::now();
    step.run();
    ms.push_back(ms_since(t0));
  }
  tp.measured_ms = std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size());
  return tp;
}

}  // namespace

void profile_section(Output& out, const BenchArgs& a) {
  const int pool = num_threads();
  const int steps = a.quick ? 5 : 100;
  std::vector<ThreadProfile> runs;
  if (pool > 1) runs.push_back(profile_steps(a, 1, steps));
  runs.push_back(profile_steps(a, pool, steps));
  set_num_threads(pool);
  const ThreadProfile& one = runs.front();
  const ThreadProfile& all = runs.back();

  // Rows in the order of the pool's profile (ops by time, then sections), matched by name in the other.
  auto per_step = [](const ThreadProfile& tp, const Profile::Row& r) {
    return r.ms() / static_cast<double>(std::max<int64_t>(tp.profile.steps(), 1));
  };
  auto find = [](const ThreadProfile& tp, const Profile::Row& r) -> const Profile::Row* {
    for (const auto& o : tp.profile.rows())
      if (o.op == r.op && o.name == r.name) return &o;
    return nullptr;
  };
  std::vector<const Profile::Row*> rows;
  for (const auto& r : all.profile.rows()) rows.push_back(&r);
  std::stable_sort(rows.begin(), rows.end(), [](const Profile::Row* x, const Profile::Row* y) {
    return x->op != y->op ? x->op : x->ms() > y->ms();
  });
  const double steps_all = static_cast<double>(std::max<int64_t>(all.profile.steps(), 1));
  const double total_all = all.profile.total_ms() / steps_all;
  const double total_one = one.profile.total_ms() / static_cast<double>(std::max<int64_t>(one.profile.steps(), 1));

  const std::string shape =
      fmt::format("B={} T={} C={} L={}", a.batch, a.model.block_size, a.model.n_embd, a.model.n_layer);
  out.print(
      "profile: the training step ({}), op by op, per step ({} steps each{}); forward and backward at {} "
      "threads; GFLOP/s from the ops' registered costs; {}\n",
      shape, steps, pool > 1 ? fmt::format("; 1 thread and {} threads", pool) : "", pool, products_summary());
  out.print("  {:<28} {:>6} {:>8} {:>8} {:>9} {:>9} {:>8} {:>6} {:>8}\n", "op / outside ops", "calls", "fwd ms",
            "bwd ms", "1 thr ms", fmt::format("{} thr ms", pool), "speedup", "share", "GFLOP/s");
  bool sections = false;
  for (const Profile::Row* r : rows) {
    if (!r->op && !sections) {
      out.print("  outside ops:\n");
      sections = true;
    }
    const Profile::Row* r1 = find(one, *r);
    const double ms = per_step(all, *r), ms1 = r1 ? per_step(one, *r1) : NAN;
    const double flops = r->forward_flops + r->backward_flops;
    const double gflops = flops > 0 && r->ms() > 0 ? flops / r->ms() / 1e6 : NAN;
    out.print("  {:<28} {:>6.4g} {:>8} {:>8} {:>9.3f} {:>9.3f} {:>7.2f}× {:>5.1f}% {:>8}\n", r->name,
              static_cast<double>(r->calls) / steps_all, r->op ? fmt::format("{:.3f}", r->forward_ms / steps_all) : "",
              r->op ? fmt::format("{:.3f}", r->backward_ms / steps_all) : "", ms1, ms, ms1 / ms, 100 * ms / total_all,
              std::isnan(gflops) ? "" : fmt::format("{:.1f}", gflops));
    json& row = out.row("profile " + r->name, shape, ms, nullptr, std::nullopt,
                        std::isnan(gflops) ? std::nullopt : std::optional<double>(gflops));
    row["kind"] = r->op ? "op" : "outside";
    row["calls"] = static_cast<double>(r->calls) / steps_all;
    row["threads"] = pool;
    row["forward_ms"] = r->op ? json(r->forward_ms / steps_all) : json(nullptr);
    row["backward_ms"] = r->op ? json(r->backward_ms / steps_all) : json(nullptr);
    row["one_thread_ms"] = std::isnan(ms1) ? json(nullptr) : json(ms1);
    row["share"] = ms / total_all;
    if (flops > 0) row["products"] = products_summary();
  }
  out.print("  {:<28} {:>6} {:>8} {:>8} {:>9.3f} {:>9.3f} {:>7.2f}×\n", "sum of the rows", "", "", "", total_one,
            total_all, total_one / total_all);
  out.print("  {:<28} {:>6} {:>8} {:>8} {:>9.3f} {:>9.3f}   (rows {:+.1f}% / {:+.1f}%)\n\n", "measured step (mean)", "",
            "", "", one.measured_ms, all.measured_ms, 100 * (total_one / one.measured_ms - 1),
            100 * (total_all / all.measured_ms - 1));
  json& sum = out.row("profile: step", shape, all.measured_ms, nullptr, std::nullopt, std::nullopt);
  sum["threads"] = pool;
  sum["one_thread_ms"] = one.measured_ms;
  sum["rows_sum_ms"] = total_all;
  sum["one_thread_rows_sum_ms"] = total_one;
}

}  // namespace tapegrad::cli::bench
