#include "models/loop.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <optional>

#include <nlohmann/json.hpp>

#include "engine/anomaly.hpp"
#include "models/stats.hpp"

namespace tapegrad {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// The files the loop writes into its directory.
constexpr const char* kCheckpointFile = "checkpoint.safetensors";
constexpr const char* kCsvFile = "losses.csv";
constexpr const char* kSvgFile = "losses.svg";

}  // namespace

std::string format_duration(double s) {
  if (s >= 3600) return fmt::format("{}h{:02}m", static_cast<int>(s / 3600), static_cast<int>(std::fmod(s, 3600) / 60));
  if (s >= 60) return fmt::format("{}m{:02}s", static_cast<int>(s / 60), static_cast<int>(std::fmod(s, 60)));
  return fmt::format("{:.1f}s", s);
}

int remove_stale_temporaries(const std::string& dir) {
  namespace fs = std::filesystem;
  int removed = 0;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    for (const char* file : {kCheckpointFile, kCsvFile, kSvgFile})  // write_file_atomic's ".NAME.tmp-XXXXXX"
      if (name.starts_with(fmt::format(".{}.tmp-", file)) && e.is_regular_file(ec)) {
        removed += fs::remove(e.path(), ec) ? 1 : 0;
        break;
      }
  }
  return removed;
}

void optimizer_step(Optimizer& opt, double lr, double grad_clip, Profile* profile) {
  if (grad_clip > 0) clip_grad_norm(opt.parameters(), grad_clip);
  if (profile) profile->mark("optimizer: clip grad norm");
  opt.set_lr(lr);
  opt.step();
  if (profile) profile->mark(fmt::format("optimizer: {}", opt.name()));
  opt.zero_grad();
  if (profile) profile->mark("optimizer: zero grad");
}

LoopResult train_loop(Module& model, Optimizer& opt, const LoopConfig& cfg, const LoopFunctions& fn) {
  if (!fn.loss) fail("train_loop: no loss function");
  if (cfg.max_steps < 0 || cfg.eval_interval <= 0)
    fail("train_loop: max_steps must not be negative and eval_interval must be positive, got {} and {}", cfg.max_steps,
         cfg.eval_interval);
  const bool files = !cfg.dir.empty();
  const std::string ck_path = cfg.dir + "/" + kCheckpointFile;
  // How messages end when a run stops on bad numbers: what is left to resume from.
  const std::string kept = files ? fmt::format("; stopped, the last good checkpoint {} is kept", ck_path) : "; stopped";
  std::FILE* out = cfg.out;
  LoopResult res;
  int64_t step = 0;

  if (files) {
    std::filesystem::create_directories(cfg.dir);
    remove_stale_temporaries(cfg.dir);
  }
  if (cfg.resume) {
    if (!files && !cfg.resume_from) fail("train_loop: resume needs a run directory");
    std::optional<Checkpoint> read;
    if (!cfg.resume_from) read = load_checkpoint(ck_path);
    const Checkpoint& ck = cfg.resume_from ? *cfg.resume_from : *read;
    static constexpr std::string_view kOptimizerState[] = {"optimizer."};
    load_parameters(ck, model, ck_path, kOptimizerState);
    opt.load_state(ck, ck_path);
    try {
      step = std::stoll(training_metadata(ck, "tapegrad.step", ck_path));
      auto step_of = [&](const json& v) {  // a JSON integer (a float out of int64's range would not convert)
        if (!v.is_number_integer()) fail("{}: {}: a step in its log is {}, not an integer", cfg.resume_flag, ck_path, v.dump());
        return v.get<int64_t>();
      };
      for (const auto& e : json::parse(training_metadata(ck, "tapegrad.evals", ck_path)))
        res.evals.push_back({step_of(e[0]), e[1].get<double>(), e[2].get<double>()});
      for (const auto& r : json::parse(training_metadata(ck, "tapegrad.log", ck_path)))
        res.rows.push_back({step_of(r[0]), r[1].get<double>(), r[2].is_null() ? NAN : r[2].get<double>(),
                            r[3].is_null() ? std::nullopt : std::optional<double>(r[3].get<double>()),
                            r[4].is_null() ? NAN : r[4].get<double>()});
      if (fn.restore) fn.restore(ck);
    } catch (const json::exception& e) {
      fail("{}: {}: its training state (evaluations, log) cannot be read: {}", cfg.resume_flag, ck_path, e.what());
    } catch (const std::logic_error& e) {  // std::stoll's invalid_argument and out_of_range
      fail("{}: {}: its training state (step, optimizer, batches) cannot be read: {}", cfg.resume_flag, ck_path, e.what());
    }
  }
  res.first_step = step;
  if (fn.started) fn.started(step);

  auto save = [&] {
    if (!files) return;
    Checkpoint ck;
    for (const auto& p : model.parameters()) ck.tensors.push_back({p.name, p.value});
    opt.save_state(ck);
    json evals = json::array(), rows = json::array();
    for (const auto& e : res.evals) evals.push_back({e.step, e.train_loss, e.val_loss});
    for (const auto& r : res.rows)
      rows.push_back({r.step, r.lr, r.train_loss, r.val_loss ? json(*r.val_loss) : json(nullptr), r.ms_per_step});
    ck.metadata["tapegrad.step"] = std::to_string(step);
    ck.metadata["tapegrad.evals"] = evals.dump();
    ck.metadata["tapegrad.log"] = rows.dump();
    if (fn.save) fn.save(ck);
    save_checkpoint(ck_path, ck);
  };
  auto write_logs = [&] {
    if (!files) return;
    write_loss_csv(cfg.dir + "/" + kCsvFile, res.rows);
    std::vector<PlotSeries> series(3);
    series[0].label = "train (batch)";
    series[1].label = "train (eval)";
    series[2].label = "validation (eval)";
    for (const auto& r : res.rows)
      if (std::isfinite(r.train_loss)) series[0].points.emplace_back(static_cast<double>(r.step), r.train_loss);
    for (const auto& e : res.evals) {
      series[1].points.emplace_back(static_cast<double>(e.step), e.train_loss);
      series[2].points.emplace_back(static_cast<double>(e.step), e.val_loss);
    }
    if (!fn.evaluate) series.resize(1);
    write_loss_svg(cfg.dir + "/" + kSvgFile, cfg.title, series);
  };

  const bool tty = isatty(fileno(out)) != 0;
  auto run_eval = [&](int64_t at) {
    if (!fn.evaluate || (!res.evals.empty() && res.evals.back().step == at)) return;
    EvalPoint e{at, 0, 0};
    try {
      const Evaluation ev = fn.evaluate(at);
      e.train_loss = ev.train_loss;
      e.val_loss = ev.val_loss;
    } catch (const Error& err) {
      fail("evaluation at step {}: {}{}", at, err.what(), kept);
    }
    if (!std::isfinite(e.train_loss) || !std::isfinite(e.val_loss))
      fail("the evaluation loss became {} (train) / {} (val) at step {}{}", e.train_loss, e.val_loss, at, kept);
    res.evals.push_back(e);
    if (!res.rows.empty() && res.rows.back().step == at) res.rows.back().val_loss = e.val_loss;
    if (!cfg.quiet) {
      fmt::print(out, "{}step {:>5}: train loss {:.4f}, val loss {:.4f}\n", tty ? "\r\033[K" : "", at, e.train_loss,
                 e.val_loss);
      std::fflush(out);
    }
  };
  auto lr_at = [&](int64_t it) { return cfg.lr ? cfg.lr(it) : opt.lr(); };

  Tape tape;
  AnomalyCheck anomaly(tape, cfg.detect_anomaly);
  Profile* prof = cfg.profile;
  if (prof) tape.add_observer(prof);
  std::vector<double> ms;
  const auto t_start = Clock::now();
  auto last_print = t_start;
  const int64_t first = step;
  const int64_t last = cfg.stop_after > 0 ? std::min(cfg.max_steps, first + cfg.stop_after) : cfg.max_steps;
  for (int64_t it = first; it < last; ++it) {
    const bool eval_step = it % cfg.eval_interval == 0;
    if (eval_step) {
      run_eval(it);
      step = it;
      save();
    }
    const double lr = lr_at(it);
    const auto t0 = Clock::now();
    if (prof) prof->start();
    Var loss;
    try {  // with detect_anomaly, the first non-finite value throws here, naming its op: add the step
      loss = fn.loss(tape, it);
    } catch (const Error& err) {
      if (!cfg.detect_anomaly) throw;
      fail("step {}: {}{}", it, err.what(), kept);
    }
    const double lv = loss.value().item();
    if (!std::isfinite(lv)) fail("the training loss became {} at step {}{}", lv, it, kept);
    try {
      tape.backward(loss);
    } catch (const Error& err) {
      if (!cfg.detect_anomaly) throw;
      fail("step {}: {}{}", it, err.what(), kept);
    }
    tape.clear();
    optimizer_step(opt, lr, cfg.grad_clip, prof);
    if (prof) {
      prof->end_step();
      prof->pause();
    }
    const double step_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    ms.push_back(step_ms);
    res.step_losses.push_back(lv);
    res.rows.push_back({it, lr, lv, std::nullopt, step_ms});
    if (!res.evals.empty() && res.evals.back().step == it) res.rows.back().val_loss = res.evals.back().val_loss;
    step = it + 1;
    if (eval_step) write_logs();  // with this step's row, which holds the evaluation's validation loss

    if (!cfg.quiet) {
      const double med = median(std::vector<double>(ms.end() - std::min<std::ptrdiff_t>(50, static_cast<std::ptrdiff_t>(ms.size())), ms.end()));
      const double eta = med * static_cast<double>(cfg.max_steps - it - 1) / 1000;
      const double tok_s = static_cast<double>(cfg.tokens_per_step) / (med / 1000);
      if (tty && std::chrono::duration<double>(Clock::now() - last_print).count() > 0.1) {
        fmt::print(out, "\r\033[Kstep {:>5}/{} | loss {:.4f} | {:.1f} ms/step{} | ETA {}", it + 1, cfg.max_steps, lv, med,
                   cfg.tokens_per_step > 0 ? fmt::format(" | {:.1f}k tok/s", tok_s / 1000) : "", format_duration(eta));
        std::fflush(out);
        last_print = Clock::now();
      } else if (!tty && ((it + 1) % cfg.log_interval == 0 || it + 1 == cfg.max_steps)) {
        fmt::print(out, "step {:>5}/{}: loss {:.4f}, lr {:.2e}, {:.1f} ms/step{}, ETA {}\n", it + 1, cfg.max_steps, lv,
                   lr, med, cfg.tokens_per_step > 0 ? fmt::format(", {:.0f} tok/s", tok_s) : "", format_duration(eta));
        std::fflush(out);
      }
    }
    if (fn.after_step) fn.after_step(it, lr);
  }
  res.ms_per_step = median(ms);
  res.mean_ms_per_step = ms.empty() ? 0.0 : std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size());
  if (prof) tape.remove_observer(prof);
  if (last < cfg.max_steps) {  // stopped early: a checkpoint to resume from, no final evaluation
    res.stopped_early = true;
    save();
    write_logs();
    if (!cfg.quiet && files) fmt::print(out, "{}stopped after step {}; wrote {}\n", tty ? "\r\033[K" : "", last, ck_path);
    return res;
  }
  run_eval(cfg.max_steps);
  step = cfg.max_steps;
  if (fn.evaluate && (res.rows.empty() || res.rows.back().step != cfg.max_steps))
    res.rows.push_back({cfg.max_steps, lr_at(cfg.max_steps), NAN, res.evals.back().val_loss, NAN});
  save();
  res.wall_seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  write_logs();
  return res;
}

}  // namespace tapegrad
