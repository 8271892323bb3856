// Training a GPT on a text file: batches, AdamW with nanoGPT's learning-rate schedule, evaluation on fixed batches.
// The step is written out in models/trainer.cpp (train_steps); the run's record, files, progress and resuming are
// TrainingRun's (models/loop.hpp), as for train_loop.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "../ops/products/products.hpp"
#include "data.hpp"
#include "gpt.hpp"
#include "loop.hpp"
#include "optim.hpp"

namespace tapegrad {

struct TrainConfig {
  GPTConfig model;
  std::string data;  // a UTF-8 text file; empty: the bundled Tiny Shakespeare
  int64_t batch_size = 12;
  // The loop's options: max_steps (--max-iters), eval_interval, grad_clip, log_interval, resume, stop_after (stop
  // with a checkpoint after this many steps of this call), quiet, detect_anomaly, profile (report at the end).
  // train() sets dir (run_dir()), title, tokens_per_step and out; it does not use lr: the schedule below is the rate.
  LoopConfig loop{.max_steps = 2000, .eval_interval = 250, .grad_clip = 1.0, .log_interval = 100};
  int64_t warmup_iters = 100;
  int64_t lr_decay_iters = 0;  // 0: loop.max_steps
  double learning_rate = 1e-3;
  double min_lr = 1e-4;
  double beta1 = 0.9, beta2 = 0.99;
  double weight_decay = 0.1;
  int64_t eval_iters = 50;      // fixed batches per split (38,400 tokens each at the defaults)
  int64_t sample_tokens = 300;  // at most kMaxSampleTokens; a signal stops the sampling at once
  uint64_t seed = 1337;
  std::string out_dir = "runs";
  std::string name;  // run directory runs/NAME; empty: the attention kind
  // Every this many steps (0: never), the sharpness of the training loss on one fixed batch (models/sharpness.hpp),
  // printed and written to sharpness.csv and sharpness.svg in the run directory. The batch is drawn from its own
  // generator, so the training losses are the same with or without it.
  int64_t sharpness_every = 0;
  int sharpness_iterations = 20;  // power-iteration steps at most (Hessian-vector products, ≈ 2 gradients each)
  ProductPrecision precision = ProductPrecision::f32;  // of the float32 products (ops/products/products.hpp)
  // With loop.resume: let the seed, the batch size and the precision differ from the checkpoint's (without it such a
  // resume is refused, naming the option: the run would go on as another run than the one it was).
  bool allow_change = false;
  // The --config files the options were read from: inputs, which no file of the run may be.
  std::vector<std::string> config_files;

  void validate() const;
  std::string run_dir() const;
};

// Refuses a run name that is not one path component below --out: empty is allowed (the attention kind), ".",
// "..", and a name with a '/' are not (`--name ../../x` would write outside --out).
void validate_run_name(const std::string& name);

// The loop's record (evaluations, log, step losses and times, the profile with loop.profile), and the run's own.
struct TrainResult : LoopResult {
  int64_t parameters = 0;
  std::string run_dir, sample;
};

// The text file to train on by default: the bundled Tiny Shakespeare, shared_file("data/tinyshakespeare.txt")
// (models/files.hpp). Throws an Error naming the places looked in when it is not there.
std::string default_data_path();

// Trains as configured, printing progress to `out`; writes checkpoint, CSV and SVG into the run directory (the CSV
// and SVG at each evaluation).
TrainResult train(const TrainConfig& cfg, std::FILE* out);

// The most characters one sample may ask for (--sample-tokens, sample --tokens): a million, minutes to hours of
// generation for a small model; a count beyond it is a slip, refused rather than run for ever.
inline constexpr int64_t kMaxSampleTokens = 1'000'000;

struct SampleConfig {
  std::string prompt;    // empty: a newline, or the vocabulary's first symbol when the text had no newline
  int64_t tokens = 300;  // at most kMaxSampleTokens
  double temperature = 0.8;
  int64_t top_k = 0;  // 0: all
  uint64_t seed = 1337;
};

struct Checkpoint;
// The model a checkpoint written by train() holds: configuration from "tapegrad.model", float32 weights by name.
GPT model_from_checkpoint(const Checkpoint& ck, const std::string& path);

// The vocabulary of a checkpoint written by train() ("tapegrad.vocab"): its distinct symbols in order, exactly
// `vocab_size` of them (the model's), or an Error naming the checkpoint.
TextData checkpoint_vocabulary(const Checkpoint& ck, int64_t vocab_size, const std::string& path);

// Generates text from a checkpoint written by train().
std::string sample_from_checkpoint(const std::string& path, const SampleConfig& sc);

}  // namespace tapegrad
