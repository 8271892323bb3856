#include "models/loop.hpp"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <numeric>

#include <nlohmann/json.hpp>

#include "inspect/anomaly.hpp"
#include "models/stats.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

using json = nlohmann::json;

// The files a run writes into its directory.
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
    for (const char* file : kRunFiles)
      if (name.starts_with(fmt::format(".{}.tmp-", file)) && e.is_regular_file(ec)) {
        removed += fs::remove(e.path(), ec) ? 1 : 0;
        break;
      }
  }
  return removed;
}

// Clipping's norm, then the update, with the clipping scale and the zeroing of the gradients folded into its one
// pass over the parameters (Optimizer::step_and_zero_grad).
void optimizer_step(Optimizer& opt, double lr, double grad_clip, Profile* profile) {
  const float scale = grad_clip > 0 ? clip_scale(grad_norm(opt.parameters()), grad_clip) : 1.0f;
  if (profile) profile->mark("optimizer: clip grad norm");
  opt.set_lr(lr);
  opt.step_and_zero_grad(scale);
  if (profile) profile->mark(fmt::format("optimizer: {}, zero grad", opt.name()));
}

TrainingRun::TrainingRun(const LoopConfig& cfg, Module& model, Optimizer& opt, LoopResult& result, Rng* batch_rng)
    : cfg_(cfg),
      model_(model),
      opt_(opt),
      result_(result),
      batch_rng_(batch_rng),
      checkpoint_path_(cfg.dir + "/" + kCheckpointFile),
      kept_(cfg.dir.empty() ? "; stopped"
                            : fmt::format("; stopped, the last good checkpoint {} is kept", checkpoint_path_)),
      tty_(isatty(fileno(cfg.out)) != 0) {
  if (cfg.profile) result_.profile.emplace(&builtin_registry());
  if (cfg.dir.empty()) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  if (cfg.resume && !fs::is_directory(cfg.dir, ec))
    fail("--resume: there is no run to continue in '{}' (the directory does not exist)", cfg.dir);
  fs::create_directories(cfg.dir, ec);
  if (ec) fail("cannot make the run directory '{}': {}", cfg.dir, ec.message());
  lock_ = DirectoryLock(cfg.dir, "wait for that run to end, or give this one another --name");
  if (!cfg.resume && !cfg.overwrite && fs::exists(checkpoint_path_, ec))
    fail(
        "'{}' holds a run already ({}): --resume continues it, --overwrite starts it over, --name NAME starts "
        "another beside it",
        cfg.dir, kCheckpointFile);
}

void TrainingRun::resume(std::string_view flag, const std::function<void(const Checkpoint&)>& same_model,
                         const std::function<void(const Checkpoint&)>& restore) {
  if (cfg_.dir.empty()) fail("train_loop: resume needs a run directory");
  const std::string& path = checkpoint_path_;
  const Checkpoint ck = load_checkpoint(path);
  if (same_model) same_model(ck);
  // A count the writer writes as decimal digits; "20abc", "-5", " 7" or "1e3" is a damaged or edited checkpoint.
  auto count = [&](const std::string& key, uint64_t max) {
    const std::string& text = training_metadata(ck, key, path);
    if (const std::optional<uint64_t> v = metadata_count(text, max)) return *v;
    fail("{}: {}: its training state cannot be read: '{}' is '{}', not a whole number from 0 to {}", flag, path, key,
         text.substr(0, 40), max);
  };
  const auto step = static_cast<int64_t>(count("tapegrad.step", static_cast<uint64_t>(INT64_MAX)));
  // A run continued to fewer steps than it has taken would be written back as an earlier step with later weights and
  // optimizer state, its log going back in time.
  if (step > cfg_.max_steps)
    fail(
        "{}: {} is at step {}, past the run's last step {} (--max-iters): a run's step cannot move backwards; "
        "continue it with --max-iters {} or more, or start another run with --name",
        flag, path, step, cfg_.max_steps, step);
  const uint64_t rng_state = batch_rng_ ? count("tapegrad.rng", UINT64_MAX) : 0;
  static constexpr std::string_view kOptimizerState[] = {"optimizer."};
  load_parameters(ck, model_, path, kOptimizerState);  // all names and shapes checked before any is copied
  opt_.load_state(ck, path);
  if (opt_.steps() != step)
    fail(
        "{}: {}: its state disagrees with itself: the run is at step {} ('tapegrad.step') and the optimizer has "
        "taken {} steps",
        flag, path, step, opt_.steps());
  try {
    result_.first_step = step;
    auto step_of = [&](const json& v) {  // a JSON integer (a float out of int64's range would not convert)
      if (!v.is_number_integer()) fail("{}: {}: a step in its log is {}, not an integer", flag, path, v.dump());
      return v.get<int64_t>();
    };
    // The evaluations and the log: lists (not objects), their steps never going back (a resumed run logs its first
    // step's evaluation and its training on two rows) and none past the run's step (a log of steps 0 to 40 under a
    // step of 0 would be written twice over), and the log reaching the step before the run's.
    auto list_of = [&](const char* key) {
      json list = json::parse(training_metadata(ck, key, path));
      if (!list.is_array()) fail("{}: {}: its '{}' is {}, not a list", flag, path, key, list.type_name());
      return list;
    };
    auto in_order = [&](const char* what, int64_t at, int64_t before) {
      if (at > step) fail("{}: {}: its {} has a row at step {}, past the run's step {}", flag, path, what, at, step);
      if (at < before) fail("{}: {}: its {} goes back from step {} to step {}", flag, path, what, before, at);
      return at;
    };
    int64_t last = -1;
    for (const auto& e : list_of("tapegrad.evals")) {
      last = in_order("evaluations", step_of(e[0]), last);
      result_.evals.push_back({last, e[1].get<double>(), e[2].get<double>()});
    }
    last = -1;
    for (const auto& r : list_of("tapegrad.log")) {
      last = in_order("log", step_of(r[0]), last);
      result_.rows.push_back({last, r[1].get<double>(), r[2].is_null() ? NAN : r[2].get<double>(),
                              r[3].is_null() ? std::nullopt : std::optional<double>(r[3].get<double>()),
                              r[4].is_null() ? NAN : r[4].get<double>()});
    }
    if (step > 0 && last < step - 1)
      fail("{}: {}: its state disagrees with itself: the run is at step {} and its log ends at step {}", flag, path,
           step, last);
    if (batch_rng_) batch_rng_->set_state(rng_state);
    if (restore) restore(ck);
  } catch (const json::exception& e) {
    fail("{}: {}: its training state (evaluations, log) cannot be read: {}", flag, path, e.what());
  } catch (const std::logic_error& e) {  // a std::stoll of `restore`: invalid_argument, out_of_range
    fail("{}: {}: its training state cannot be read: {}", flag, path, e.what());
  }
}

void TrainingRun::start() {
  if (!cfg_.dir.empty()) remove_stale_temporaries(cfg_.dir);  // the directory is locked: no other writer's
  if (!cfg_.dir.empty() && cfg_.overwrite && !cfg_.resume) remove_old_run();
  start_ = last_print_ = Clock::now();
}

// --overwrite: the old run's files go before the new run writes its first, its logs first and its checkpoint last.
// A kill at any point then leaves the old run (its checkpoint holds its log: --resume writes losses.csv again), an
// empty directory, or the new run; never the new run's checkpoint beside the old run's losses.csv.
void TrainingRun::remove_old_run() const {
  namespace fs = std::filesystem;
  for (auto file = std::rbegin(kRunFiles); file != std::rend(kRunFiles); ++file) {
    const fs::path path = fs::path(cfg_.dir) / *file;
    std::error_code ec;
    fs::remove(path, ec);
    if (ec) fail("--overwrite: cannot remove the old run's {}: {}", path.string(), ec.message());
  }
}

bool TrainingRun::interrupted(int64_t next_step) {
  if (!stop_requested(cfg_.interrupt)) return false;
  interrupted_at_ = next_step;
  result_.interrupted_by = static_cast<int>(*cfg_.interrupt);
  return true;
}

int64_t TrainingRun::stop_step() const {
  // first_step() ≤ max_steps (resume refuses a step past it), so the difference cannot overflow; the sum could.
  if (cfg_.stop_after <= 0 || cfg_.stop_after >= cfg_.max_steps - first_step()) return cfg_.max_steps;
  return first_step() + cfg_.stop_after;
}

void TrainingRun::evaluate(int64_t step, const std::function<Evaluation(int64_t)>& losses) {
  if (!losses || (!result_.evals.empty() && result_.evals.back().step == step)) return;
  EvalPoint e{step, 0, 0};
  try {
    const Evaluation ev = losses(step);
    e.train_loss = ev.train_loss;
    e.val_loss = ev.val_loss;
  } catch (const Error& err) {
    fail("evaluation at step {}: {}{}", step, err.what(), kept_);
  }
  // A signal during the evaluation may have cut it short (its losses are then any value): it is dropped, and the
  // caller stops (interrupted()); a resumed run evaluates this step again.
  if (stop_requested(cfg_.interrupt)) return;
  if (!std::isfinite(e.train_loss) || !std::isfinite(e.val_loss))
    fail("the evaluation loss became {} (train) / {} (val) at step {}{}", e.train_loss, e.val_loss, step, kept_);
  result_.evals.push_back(e);
  if (!result_.rows.empty() && result_.rows.back().step == step) result_.rows.back().val_loss = e.val_loss;
  if (!cfg_.quiet) {
    fmt::print(cfg_.out, "{}step {:>5}: train loss {:.4f}, val loss {:.4f}\n", line_start(), step, e.train_loss,
               e.val_loss);
    std::fflush(cfg_.out);
  }
}

void TrainingRun::save_checkpoint(int64_t step, const std::function<void(Checkpoint&)>& add) {
  if (cfg_.dir.empty()) return;
  Checkpoint ck;
  for (const auto& p : model_.parameters()) ck.tensors.push_back({p.name, p.value});
  opt_.save_state(ck);
  json evals = json::array(), rows = json::array();
  for (const auto& e : result_.evals) evals.push_back({e.step, e.train_loss, e.val_loss});
  for (const auto& r : result_.rows)
    rows.push_back({r.step, r.lr, r.train_loss, r.val_loss ? json(*r.val_loss) : json(nullptr), r.ms_per_step});
  ck.metadata["tapegrad.step"] = std::to_string(step);
  ck.metadata["tapegrad.evals"] = evals.dump();
  ck.metadata["tapegrad.log"] = rows.dump();
  if (batch_rng_) ck.metadata["tapegrad.rng"] = std::to_string(batch_rng_->state());
  if (add) add(ck);
  refuse_non_finite_state(ck, step);
  tapegrad::save_checkpoint(checkpoint_path_, ck);  // the free function: atomic, checksummed
}

// The checkpoint written is the one a run that stops keeps as its last good one, and the one --resume reads: a NaN
// or ±∞ in a weight or in the optimizer's state is never written over the one before. A finite loss does not
// vouch for it: a gradient of 1e30 squares to an infinite AdamW second moment while every weight stays finite.
void TrainingRun::refuse_non_finite_state(const Checkpoint& ck, int64_t step) const {
  auto refuse = [&](const std::string& name, const auto* v, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(v[i]))
        fail("the training state became non-finite by step {}: {} holds {} at element {}, and is not written{}", step,
             name, v[i], i, kept_);
  };
  for (const auto& [name, t] : ck.tensors) {
    if (t.dtype() == DType::f32) refuse(name, t.data<float>(), t.numel());
    else if (t.dtype() == DType::f64) refuse(name, t.data<double>(), t.numel());
  }
}

void TrainingRun::step_started() {
  step_start_ = Clock::now();
  if (Profile* prof = profile()) prof->start();
}

void TrainingRun::step_failed(int64_t step, const Error& e) const {
  if (!cfg_.detect_anomaly) throw;  // called in a catch block: the error caught, as it is
  fail("step {}: {}{}", step, e.what(), kept_);
}

double TrainingRun::finite_loss(int64_t step, const Var& loss) const {
  const double value = loss.value().item();
  if (!std::isfinite(value)) fail("the training loss became {} at step {}{}", value, step, kept_);
  return value;
}

void TrainingRun::step_done(int64_t step, double lr, double loss) {
  if (Profile* prof = profile()) {
    prof->end_step();
    prof->pause();
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - step_start_).count();
  step_ms_.push_back(ms);
  result_.step_losses.push_back(loss);
  result_.rows.push_back({step, lr, loss, std::nullopt, ms});
  const bool evaluated = !result_.evals.empty() && result_.evals.back().step == step;
  if (evaluated) result_.rows.back().val_loss = result_.evals.back().val_loss;
  if (step % cfg_.eval_interval == 0) write_logs();  // with this step's row, which holds the evaluation's val loss
  if (!cfg_.quiet) print_progress(step, lr, loss);
}

void TrainingRun::print_progress(int64_t step, double lr, double loss) {
  const auto recent = static_cast<std::ptrdiff_t>(std::min<size_t>(50, step_ms_.size()));
  const double med = median(std::vector<double>(step_ms_.end() - recent, step_ms_.end()));  // ms/step, last 50
  const double eta = med * static_cast<double>(cfg_.max_steps - step - 1) / 1000;
  const double tok_s = static_cast<double>(cfg_.tokens_per_step) / (med / 1000);
  if (tty_ && std::chrono::duration<double>(Clock::now() - last_print_).count() > 0.1) {
    fmt::print(cfg_.out, "\r\033[Kstep {:>5}/{} | loss {:.4f} | {:.1f} ms/step{} | ETA {}", step + 1, cfg_.max_steps,
               loss, med, cfg_.tokens_per_step > 0 ? fmt::format(" | {:.1f}k tok/s", tok_s / 1000) : "",
               format_duration(eta));
    std::fflush(cfg_.out);
    last_print_ = Clock::now();
  } else if (!tty_ && ((step + 1) % cfg_.log_interval == 0 || step + 1 == cfg_.max_steps)) {
    fmt::print(cfg_.out, "step {:>5}/{}: loss {:.4f}, lr {:.2e}, {:.1f} ms/step{}, ETA {}\n", step + 1, cfg_.max_steps,
               loss, lr, med, cfg_.tokens_per_step > 0 ? fmt::format(", {:.0f} tok/s", tok_s) : "",
               format_duration(eta));
    std::fflush(cfg_.out);
  }
}

void TrainingRun::write_logs() const {
  if (cfg_.dir.empty()) return;
  write_loss_csv(cfg_.dir + "/" + kCsvFile, result_.rows);
  std::vector<PlotSeries> series(3);
  series[0].label = "train (batch)";
  series[1].label = "train (eval)";
  series[2].label = "validation (eval)";
  for (const auto& r : result_.rows)
    if (std::isfinite(r.train_loss)) series[0].points.emplace_back(static_cast<double>(r.step), r.train_loss);
  for (const auto& e : result_.evals) {
    series[1].points.emplace_back(static_cast<double>(e.step), e.train_loss);
    series[2].points.emplace_back(static_cast<double>(e.step), e.val_loss);
  }
  if (result_.evals.empty()) series.resize(1);  // a run without evaluations
  write_loss_svg(cfg_.dir + "/" + kSvgFile, cfg_.title, series);
}

void TrainingRun::finish(double final_lr, const std::function<Evaluation(int64_t)>& losses,
                         const std::function<void(Checkpoint&)>& add) {
  result_.ms_per_step = median(step_ms_);
  const double total_ms = std::accumulate(step_ms_.begin(), step_ms_.end(), 0.0);
  result_.mean_ms_per_step = step_ms_.empty() ? 0.0 : total_ms / static_cast<double>(step_ms_.size());
  const int64_t stop = interrupted_at_ >= 0 ? interrupted_at_ : stop_step();
  auto stop_early = [&](int64_t at) {  // a checkpoint to resume from, no final evaluation
    result_.stopped_early = true;
    save_checkpoint(at, add);
    write_logs();
    if (!cfg_.quiet && !cfg_.dir.empty())
      fmt::print(cfg_.out, "{}stopped after step {}; wrote {}\n", line_start(), at, checkpoint_path_);
  };
  if (stop < cfg_.max_steps) return stop_early(stop);
  evaluate(cfg_.max_steps, losses);
  if (interrupted(cfg_.max_steps)) return stop_early(cfg_.max_steps);  // a signal during the final evaluation
  if (losses && (result_.rows.empty() || result_.rows.back().step != cfg_.max_steps))
    result_.rows.push_back({cfg_.max_steps, final_lr, NAN, result_.evals.back().val_loss, NAN});
  save_checkpoint(cfg_.max_steps, add);
  result_.wall_seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  write_logs();
}

LoopResult train_loop(Module& model, Optimizer& opt, const LoopConfig& cfg, const LoopFunctions& fn) {
  if (!fn.loss) fail("train_loop: no loss function");
  if (cfg.max_steps < 0 || cfg.eval_interval <= 0)
    fail("train_loop: max_steps must not be negative and eval_interval must be positive, got {} and {}", cfg.max_steps,
         cfg.eval_interval);
  LoopResult result;
  TrainingRun run(cfg, model, opt, result);
  if (cfg.resume) run.resume("resume", {}, fn.restore);
  run.start();
  if (fn.started) fn.started(run.first_step());

  auto lr_at = [&](int64_t it) { return cfg.lr ? cfg.lr(it) : opt.lr(); };
  Tape tape;
  AnomalyCheck anomaly(tape, cfg.detect_anomaly);
  if (Profile* prof = run.profile()) tape.add_observer(prof);
  for (int64_t it = run.first_step(); it < run.stop_step(); ++it) {
    if (it % cfg.eval_interval == 0) {
      run.evaluate(it, fn.evaluate);
      run.save_checkpoint(it, fn.save);
    }
    const double lr = lr_at(it);
    run.step_started();
    Var loss = run.at_step(it, [&] { return fn.loss(tape, it); });
    const double loss_value = run.finite_loss(it, loss);
    run.at_step(it, [&] { tape.backward(loss); });
    tape.clear();
    optimizer_step(opt, lr, cfg.grad_clip, run.profile());
    run.step_done(it, lr, loss_value);
    if (fn.after_step) fn.after_step(it, lr);
    if (run.interrupted(it + 1)) break;
  }
  if (Profile* prof = run.profile()) tape.remove_observer(prof);
  run.finish(lr_at(cfg.max_steps), fn.evaluate, fn.save);
  return result;
}

}  // namespace tapegrad
