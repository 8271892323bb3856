// A training loop for any module and data: at each step the caller's loss of a batch is recorded on a tape,
// differentiated, and the optimizer steps (clipping and the learning-rate schedule on the way); every
// eval_interval steps the caller's evaluation runs, a checkpoint is written, and losses.csv and losses.svg are
// rewritten (atomically), so a long run can be watched and a killed one keeps its curve. `tapegrad train` is this
// loop around a GPT.
//
//   MLP mlp("mlp", {2, 16, 16, 2}, 42);
//   SGD opt(mlp.parameters(), {.lr = 0.1, .momentum = 0.9});
//   LoopConfig cfg{.max_steps = 500, .eval_interval = 50, .dir = "runs/mlp"};
//   LoopFunctions fn;
//   fn.loss = [&](Tape& tape, int64_t) { return cross_entropy(mlp(tape, tape.constant(x)), tape.constant(y)); };
//   fn.evaluate = [&](int64_t step) { return Evaluation{train_loss(), val_loss()}; };   // optional
//   LoopResult r = train_loop(mlp, opt, cfg, fn);
//
// The run directory holds checkpoint.safetensors (the module's parameters under their names, the optimizer's
// state, the step, the evaluations and the log), losses.csv (models/plot.hpp) and losses.svg. With resume, the
// loop continues from the checkpoint there; the same steps then give the same numbers as a run that was never
// stopped, provided the caller's loss of step `it` depends only on `it` and on what save/restore keep.
// Temporaries left in the directory by a write that was killed (".checkpoint.safetensors.tmp-*", ...) are removed
// when a run starts there.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "../engine/profile.hpp"
#include "checkpoint.hpp"
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

struct LoopConfig {
  int64_t max_steps = 1000;
  int64_t eval_interval = 100;  // evaluation, checkpoint and logs every this many steps, and at the end
  double grad_clip = 0;         // clip the gradients' global norm to this; 0: no clipping
  std::function<double(int64_t)> lr = {};  // the learning rate of step `it`; empty: the optimizer's, constant
  std::string dir = {};         // run directory; empty: no files
  std::string title = "training loss";  // of losses.svg
  bool resume = false;          // continue from dir/checkpoint.safetensors
  const Checkpoint* resume_from = nullptr;  // with resume: that checkpoint, already read (else the loop reads it)
  std::string resume_flag = "resume";       // how errors name resuming ("--resume" for the command line)
  int64_t stop_after = 0;       // stop, with a checkpoint, after this many steps of this call; 0: run to max_steps
  int64_t tokens_per_step = 0;  // for tok/s in the progress line; 0: not shown
  int64_t log_interval = 100;   // a plain progress line every this many steps when `out` is not a terminal
  bool quiet = false;
  bool detect_anomaly = false;  // stop at the first NaN or ±∞ a node produces, naming its op and the step
  Profile* profile = nullptr;   // charge the training steps to this profile (engine/profile.hpp)
  std::FILE* out = stdout;
};

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
  int64_t first_step = 0;           // where this call began (after a resume, the checkpoint's step)
  bool stopped_early = false;       // by stop_after: no final evaluation
};

// The end of a training step, after backward: clip the gradients' global norm to `grad_clip` (0: no clipping), an
// optimizer step at `lr`, zero the gradients; each charged to `profile` as a section when given.
void optimizer_step(Optimizer& opt, double lr, double grad_clip, Profile* profile);

LoopResult train_loop(Module& model, Optimizer& opt, const LoopConfig& cfg, const LoopFunctions& fn);

// Removes the temporaries that killed atomic writes of checkpoint.safetensors, losses.csv and losses.svg left in
// `dir`; returns how many.
int remove_stale_temporaries(const std::string& dir);

// "12.3s", "4m05s", "1h02m".
std::string format_duration(double seconds);

}  // namespace tapegrad
