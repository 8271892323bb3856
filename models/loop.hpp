// Training loops and the pieces they are built from. A run takes steps (record the loss of a batch on a tape,
// differentiate it, clip the gradients, update) and, every eval_interval steps and at the end, evaluates and
// writes a checkpoint; losses.csv and losses.svg are rewritten (atomically) at each evaluation, so a long run can
// be watched and a killed one keeps its curve.
//
// train_loop runs such a loop for any module, around the caller's loss of a step:
//
//   MLP mlp("mlp", {2, 16, 16, 2}, 42);
//   SGD opt(mlp.parameters(), {.lr = 0.1, .momentum = 0.9});
//   LoopConfig cfg{.max_steps = 500, .eval_interval = 50, .dir = "runs/mlp"};
//   LoopFunctions fn;
//   fn.loss = [&](Tape& tape, int64_t) { return cross_entropy(mlp(tape, tape.constant(x)), tape.constant(y)); };
//   fn.evaluate = [&](int64_t step) { return Evaluation{train_loss(), val_loss()}; };   // optional
//   LoopResult r = train_loop(mlp, opt, cfg, fn);
//
// `tapegrad train` (models/trainer.cpp) writes its GPT's step out in full and uses the same pieces: TrainingRun
// keeps the run's record, writes its files, prints its progress and resumes it.
//
// The run directory holds checkpoint.safetensors (the module's parameters under their names, the optimizer's
// state, the step, the evaluations and the log), losses.csv (models/plot.hpp) and losses.svg. With resume, the
// loop continues from the checkpoint there; the same steps then give the same numbers as a run that was never
// stopped, provided the caller's loss of step `it` depends only on `it` and on what save/restore keep.
// Temporaries left in the directory by a write that was killed (".checkpoint.safetensors.tmp-*", ...) are removed
// when a run starts there.
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../inspect/profile.hpp"
#include "../engine/rng.hpp"
#include "checkpoint.hpp"
#include "files.hpp"
#include "module.hpp"
#include "optim.hpp"
#include "plot.hpp"

namespace tapegrad {

struct Evaluation {
  double train_loss, val_loss;
};

struct EvalPoint {
  int64_t step;
  double train_loss, val_loss;
};

// The options of a training loop: train_loop's, and the GPT trainer's (TrainConfig::loop).
struct LoopConfig {
  int64_t max_steps = 1000;
  int64_t eval_interval = 100;             // evaluation, checkpoint and logs every this many steps, and at the end
  double grad_clip = 0;                    // clip the gradients' global norm to this; 0: no clipping
  std::function<double(int64_t)> lr = {};  // the learning rate of step `it`; empty: the optimizer's, constant
  std::string dir = {};                    // run directory; empty: no files
  std::string title = "training loss";     // of losses.svg
  bool resume = false;                     // continue from dir/checkpoint.safetensors
  int64_t stop_after = 0;       // stop, with a checkpoint, after this many steps of this call; 0: run to max_steps
                                // (the command line's --stop-after must be at least 1)
  int64_t tokens_per_step = 0;  // for tok/s in the progress line; 0: not shown
  int64_t log_interval = 100;   // a plain progress line every this many steps when `out` is not a terminal
  bool quiet = false;
  bool detect_anomaly = false;  // stop at the first NaN or ±∞ a node produces, naming its op and the step
  bool profile = false;         // time the training steps' ops and what lies between them (inspect/profile.hpp)
  // A run directory that holds a checkpoint already is refused unless the run resumes it or overwrite says to
  // start it over.
  bool overwrite = false;
  // When set and non-zero (a signal handler stores its signal there), the run stops after the step in progress, as
  // stop_after does: a checkpoint to resume from, the logs, LoopResult::interrupted_by.
  const volatile std::sig_atomic_t* interrupt = nullptr;
  std::FILE* out = stdout;
};

// Whether a signal handler has asked a run to stop (LoopConfig::interrupt holds the signal, or 0).
inline bool stop_requested(const volatile std::sig_atomic_t* interrupt) { return interrupt && *interrupt != 0; }

struct LoopFunctions {
  // Records the loss of step `step` (a scalar) on `tape`. Required.
  std::function<Var(Tape& tape, int64_t step)> loss;
  // Losses on fixed data, recording nothing (use a NoGradGuard); optional.
  std::function<Evaluation(int64_t step)> evaluate;
  // Adds to each checkpoint (metadata of the caller's own: data, generator state); optional.
  std::function<void(Checkpoint&)> save;
  // Reads it back on resume, after the parameters and the optimizer; optional.
  std::function<void(const Checkpoint&)> restore;
  // Called once the run is set up (resumed, if asked), before its first step, with that step: for a header; optional.
  std::function<void(int64_t first_step)> started;
  // Called after step `step` (its update done, its progress printed), with the learning rate it used: for
  // measurements of the model as it trains (models/sharpness.hpp); optional.
  std::function<void(int64_t step, double lr)> after_step;
};

struct LoopResult {
  std::vector<EvalPoint> evals;     // every evaluation of the run, resumed ones included
  std::vector<LossRow> rows;        // the log of the run, as losses.csv holds it
  std::vector<double> step_losses;  // training loss of every step run by this call
  double ms_per_step = 0;           // median over the steps of this call; NaN if it ran none
  double mean_ms_per_step = 0;      // mean of the same (0 if none)
  double wall_seconds = 0;
  int64_t first_step = 0;          // where this call began (after a resume, the checkpoint's step)
  bool stopped_early = false;      // by stop_after or an interrupt: no final evaluation
  int interrupted_by = 0;          // the signal LoopConfig::interrupt held when the run stopped; 0: none
  std::optional<Profile> profile;  // with LoopConfig::profile: the training steps of this call (not evaluation)
};

// The end of a training step, after backward: clip the gradients' global norm to `grad_clip` (0: no clipping), an
// optimizer step at `lr`, zero the gradients; each charged to `profile` as a section when given.
void optimizer_step(Optimizer& opt, double lr, double grad_clip, Profile* profile);

LoopResult train_loop(Module& model, Optimizer& opt, const LoopConfig& cfg, const LoopFunctions& fn);

// One run as its steps go: its record (evaluations, log, step times, in a LoopResult), its files, its progress
// output, and resuming it. A loop of steps uses it so (train_loop in models/loop.cpp, the GPT's in
// models/trainer.cpp):
//
//   TrainingRun run(cfg, model, opt, result);
//   if (cfg.resume) run.resume("resume");
//   run.start();
//   for (int64_t it = run.first_step(); it < run.stop_step(); ++it) {
//     if (it % cfg.eval_interval == 0) {
//       run.evaluate(it, losses);
//       run.save_checkpoint(it);
//     }
//     run.step_started();
//     Var loss = run.at_step(it, [&] { return forward(tape); });
//     const double loss_value = run.finite_loss(it, loss);
//     run.at_step(it, [&] { tape.backward(loss); });
//     tape.clear();
//     optimizer_step(opt, lr, cfg.grad_clip, run.profile());
//     run.step_done(it, lr, loss_value);
//   }
//   run.finish(lr_after_the_last_step, losses);
class TrainingRun {
 public:
  // `result` receives the record as the run goes. `batch_rng`, when given, draws the training batches: checkpoints
  // keep its state ("tapegrad.rng") and resume restores it. With a run directory, the constructor makes it (it must
  // exist to resume), locks it for this run alone (a second run there is refused, naming the process that holds
  // it) and refuses a directory that holds a run already unless cfg.resume or cfg.overwrite.
  TrainingRun(const LoopConfig& cfg, Module& model, Optimizer& opt, LoopResult& result, Rng* batch_rng = nullptr);

  // Continues from dir/checkpoint.safetensors. Loads it, and refuses it, changing nothing, when `same_model` (if
  // given) throws: a checkpoint of another model. Its step and batch generator state must be whole decimal numbers
  // (a step from 0 to max_steps: a run's step never moves backwards). Then restores the parameters (every name and shape checked before
  // any is copied), the optimizer's state, the step, the evaluations and the log, the batch generator's state, and
  // what `restore` (if given) reads: the caller's own. Errors name the checkpoint and begin with `flag` ("--resume"
  // on the command line).
  void resume(std::string_view flag, const std::function<void(const Checkpoint&)>& same_model = {},
              const std::function<void(const Checkpoint&)>& restore = {});
  // Before the first step: removes what killed writes left in the run directory (and with cfg.overwrite the old
  // run's files, its checkpoint last), starts the clock.
  void start();

  int64_t first_step() const { return result_.first_step; }  // 0, or the step a resumed checkpoint holds
  // Where this call stops: max_steps, or first_step + stop_after when that is sooner (without overflow: a stop_after
  // near 2⁶³ means max_steps).
  int64_t stop_step() const;
  // After step next_step − 1: true when cfg.interrupt asks the run to stop (the loop then breaks, and finish() keeps
  // a checkpoint at next_step).
  bool interrupted(int64_t next_step);
  Profile* profile() { return result_.profile ? &*result_.profile : nullptr; }
  const std::string& checkpoint_path() const { return checkpoint_path_; }

  // The losses on fixed data before step `step`, losses(step), checked finite, kept and printed. Nothing when
  // `losses` is empty, or when the run has them already (resumed from the checkpoint written at that step). When
  // cfg.interrupt is set by the time `losses` returns, the evaluation is dropped (a long one may stop early when it
  // sees the signal, returning anything) and the caller stops: interrupted(step), then finish().
  void evaluate(int64_t step, const std::function<Evaluation(int64_t)>& losses);
  // Writes dir/checkpoint.safetensors (nothing without a directory): the parameters under their names, the
  // optimizer's state, `step` (the step to continue from), the evaluations and the log, the batch generator's
  // state, and what `add` (if given) adds: the caller's own. A weight or optimizer state that is not finite stops
  // the run, the checkpoint before kept as it is.
  void save_checkpoint(int64_t step, const std::function<void(Checkpoint&)>& add = {});

  void step_started();  // the step's clock (and profile) starts
  // pass(): the forward or the backward pass of step `step`. With detect_anomaly the tape throws at the first NaN
  // or ±∞ a node makes, naming the node: the error then names the step and the checkpoint kept too.
  template <class Pass>
  auto at_step(int64_t step, Pass&& pass) const -> decltype(pass()) {
    try {
      return pass();
    } catch (const Error& e) {
      step_failed(step, e);
    }
  }
  // The value of the scalar `loss` of step `step`; a NaN or ±∞ stops the run, keeping the last good checkpoint.
  double finite_loss(int64_t step, const Var& loss) const;
  // After the update of step `step`: its loss and time into the log, the progress line; after the step of an
  // evaluation, losses.csv and losses.svg rewritten with it.
  void step_done(int64_t step, double lr, double loss);

  // After the steps of this call. Stopped by stop_after or a signal: a checkpoint to resume from. Otherwise: the
  // final evaluation, losses(max_steps), its row in the log (at `final_lr`, the learning rate a next step would
  // have) and the final checkpoint (a signal during that evaluation stops the run as one during a step does). Then
  // the step times and the logs.
  void finish(double final_lr, const std::function<Evaluation(int64_t)>& losses,
              const std::function<void(Checkpoint&)>& add = {});

  // "\r\033[K" when the output is a terminal (clears the progress line before a line of text), else "".
  const char* line_start() const { return tty_ ? "\r\033[K" : ""; }

 private:
  void refuse_non_finite_state(const Checkpoint& ck, int64_t step) const;
  void remove_old_run() const;
  // In the catch block of an error from a step: with detect_anomaly, the message with the step and the checkpoint
  // kept; otherwise the error rethrown as it is.
  [[noreturn]] void step_failed(int64_t step, const Error& e) const;
  void write_logs() const;
  void print_progress(int64_t step, double lr, double loss);

  using Clock = std::chrono::steady_clock;
  const LoopConfig& cfg_;
  Module& model_;
  Optimizer& opt_;
  LoopResult& result_;
  Rng* batch_rng_;
  std::string checkpoint_path_;
  std::string kept_;             // how messages end when a run stops on bad numbers: what is left to resume from
  DirectoryLock lock_;           // the run directory's, held for the run's life
  int64_t interrupted_at_ = -1;  // the step an interrupted run stopped before; −1: not interrupted
  bool tty_;
  std::vector<double> step_ms_;
  Clock::time_point start_, step_start_, last_print_;
};

// The files a run writes into its directory (the GPT trainer's sharpness and profile files included).
inline constexpr const char* kRunFiles[] = {"checkpoint.safetensors", "losses.csv",    "losses.svg",
                                            "sharpness.csv",          "sharpness.svg", "profile.json"};

// Removes the temporaries that killed atomic writes of the run's files (kRunFiles) left in `dir`; returns how many.
int remove_stale_temporaries(const std::string& dir);

// "12.3s", "4m05s", "1h02m".
std::string format_duration(double seconds);

}  // namespace tapegrad
