// The workloads tapegrad bench times: an attention node on random inputs, one training step of the default model
// as tapegrad train runs it (without the logging), and one matrix product.
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "inspect/profile.hpp"
#include "engine/rng.hpp"
#include "models/gpt.hpp"
#include "models/optim.hpp"
#include "models/run_memory.hpp"
#include "models/trainer.hpp"
#include "ops/attention/attention.hpp"
#include "ops/ops.hpp"
#include "tools/bench_harness.hpp"

namespace tapegrad::cli::bench {

struct AttentionShape {
  int64_t B, H, T, d;
  std::string str() const { return fmt::format("({},{},{},{})", B, H, T, d); }
};

inline const std::vector<std::string>& attention_nodes() {
  static const std::vector<std::string> nodes{"attention", "beta_attention", "linear_attention", "tiled_attention"};
  return nodes;
}

inline Var apply_node(const std::string& node, Var q, Var k, Var v) {
  AttentionOptions opt;
  opt.causal = true;
  if (node == "attention") return attention(q, k, v, opt);
  if (node == "beta_attention") return beta_attention(q, k, v, opt);
  if (node == "linear_attention") return linear_attention(q, k, v, true);
  if (node == "tiled_attention") return tiled_attention(q, k, v, opt);
  fail("bench: unknown attention node '{}'", node);
}

// Inputs of one attention workload and the tape it records on.
struct AttentionRun {
  std::string node;
  Tensor q, k, v, g;
  Tape tape;
  AttentionRun(std::string n, const AttentionShape& s) : node(std::move(n)) {
    const Shape shape{s.B, s.H, s.T, s.d};
    q = random_tensor(shape, 11);
    k = random_tensor(shape, 12);
    v = random_tensor(shape, 13);
    g = random_tensor(shape, 14);
  }
  void forward() {
    tape.clear();
    NoGradGuard no_grad(tape);
    apply_node(node, tape.constant(q), tape.constant(k), tape.constant(v));
  }
  void forward_backward() {
    tape.clear();
    Var y = apply_node(node, tape.leaf(q), tape.leaf(k), tape.leaf(v));
    tape.backward(y, g);
  }
  // Arena bytes the node's forward allocates when recording: everything it keeps for backward, O included.
  int64_t bytes_kept() {
    tape.clear();
    Var qv = tape.leaf(q), kv = tape.leaf(k), vv = tape.leaf(v);
    const size_t before = tape.arena().bytes_in_use();
    apply_node(node, qv, kv, vv);
    const auto kept = static_cast<int64_t>(tape.arena().bytes_in_use() - before);
    tape.clear();
    return kept;
  }
};

// One training step of a GPT (by default the default model), as tapegrad train runs it (without the logging).
struct TrainStep {
  GPTConfig cfg;
  int64_t batch = 12;
  GPT model;
  AdamW opt;
  Tape tape;
  std::vector<std::pair<Tensor, Tensor>> batches;
  size_t next = 0;
  Profile* profile = nullptr;  // when set, the tape's events and the optimizer's sections are charged to it
  // The model's memory is estimated (and a run that cannot fit refused in one line) before anything is allocated.
  // The step's estimate: the training run's, and its 8 batches of token ids and targets.
  static double memory_needed(const GPTConfig& config, int64_t batch_size) {
    return estimate_training_memory(config, batch_size).total() +
           8.0 * 2 * static_cast<double>(batch_size) * static_cast<double>(config.block_size) * 4;
  }
  static std::string describe(const GPTConfig& config, int64_t batch_size) {
    return fmt::format("bench's training step (batch {}, context {}, {} layers, {} wide)", batch_size,
                       config.block_size, config.n_layer, config.n_embd);
  }
  static const GPTConfig& fits(const GPTConfig& config, int64_t batch_size) {
    require_memory(memory_needed(config, batch_size), describe(config, batch_size),
                   "make the model or the batch smaller");
    return config;
  }
  explicit TrainStep(const GPTConfig& config = {}, int64_t batch_size = 12)
      : cfg(fits(config, batch_size)),
        batch(batch_size),
        model(cfg, 1337),
        opt(model.parameters(), {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1}) {
    Rng rng(7);
    for (int i = 0; i < 8; ++i) {
      Tensor x = Tensor::empty(DType::i32, {batch, cfg.block_size}),
             y = Tensor::empty(DType::i32, {batch, cfg.block_size});
      for (int64_t j = 0; j < x.numel(); ++j) {
        x.data<int32_t>()[j] = static_cast<int32_t>(rng.below(cfg.vocab_size));
        y.data<int32_t>()[j] = static_cast<int32_t>(rng.below(cfg.vocab_size));
      }
      batches.emplace_back(x, y);
    }
  }
  void run() {
    const auto& [x, y] = batches[next++ % batches.size()];
    if (profile && tape.observers().empty()) tape.add_observer(profile);
    if (profile) profile->start();
    Var loss = model.loss(tape, x, y);
    tape.backward(loss);
    tape.clear();
    optimizer_step(opt, 1e-3, 1.0, profile);
    if (profile) {
      profile->end_step();
      profile->pause();
    }
  }
  // Multiply-adds ×2 of the step's matrix products, counted as PyTorch's path computes them (full T×T attention
  // products): forward 2·(Σ weights of the linear layers and the head + n_layer·2·T·C) per token, backward twice.
  double nominal_flops() const {
    const double C = static_cast<double>(cfg.n_embd), T = static_cast<double>(cfg.block_size);
    const double per_layer_weights = 3 * C * C + C * C + 4 * C * C + 4 * C * C;
    const double weights =
        static_cast<double>(cfg.n_layer) * per_layer_weights + C * static_cast<double>(cfg.vocab_size);
    const double attention = static_cast<double>(cfg.n_layer) * 2 * T * C;
    const double forward_per_token = 2 * (weights + attention);
    return 3 * forward_per_token * static_cast<double>(batch) * T;
  }
};

// One product, (m, k) times (k, n), as the engine's matmul node runs it (tape + node, the pool's threads) or as a raw
// cblas_sgemm on OpenBLAS' own threads (tools/bench_matmul.cpp): the matmul section's rows, and the product that set
// the product ceiling timed again beside the training step.
struct TimedProduct {
  int64_t m = 0, k = 0, n = 0;
  bool raw = false;
  Tensor x, w, c;
  Tape tape;
  TimedProduct(int64_t m_, int64_t k_, int64_t n_, bool raw_);
  double flops() const { return 2.0 * static_cast<double>(m * k * n); }
  void once();
  // `warmup` untimed runs, then `reps` timed ones: the ms per timed run. OpenBLAS' threads run only in the raw
  // product's blocks; they poll for ~0.1 s after a call.
  double run(int reps, int warmup);
  // As a peer of the matmul section's engine product, of the same size: the engine's block's runs.
  static Peer same_size_peer(std::shared_ptr<TimedProduct> p);
  // As a peer of a longer workload (the training step, a few runs a block): its own block of ~g_block_ms after
  // ~10 ms of untimed runs, whatever the workload's block holds. After it the pool's threads poll for 300 µs,
  // OpenBLAS' for ~0.1 s.
  static Peer own_block_peer(std::shared_ptr<TimedProduct> p);
};

// The product ceiling: the best GFLOP/s of the matmul section, through the engine (on the backend and in the
// precision its products use) or raw, and the product that reached it.
struct ProductCeiling {
  double gflops = NAN;
  int64_t m = 0, k = 0, n = 0;
  bool raw = false;
  bool measured() const { return !std::isnan(gflops); }
  std::string name() const { return fmt::format("({}, {}, {}) {}", m, k, n, raw ? "raw sgemm" : "through the engine"); }
};

// matmul through the engine next to a raw cblas_sgemm, shape by shape (tools/bench_matmul.cpp); returns the
// product ceiling.
ProductCeiling matmul_section(Output& out, const BenchArgs& a, TorchSide* torch);

// The training step profiled op by op (inspect/profile.hpp) on one thread and on the engine's threads: where the
// time goes, and which parts do not speed up with more threads.
void profile_section(Output& out, const BenchArgs& a);

// The training step's matrix products shape by shape, each against the ceiling of that shape alone in the same
// run and precision (tools/bench_products.cpp).
void products_section(Output& out, const BenchArgs& a);

// A Hessian-vector product of the training step's loss against its gradient and PyTorch's double backward
// (tools/bench_curvature.cpp).
void curvature_section(Output& out, const BenchArgs& a, TorchSide* torch);

}  // namespace tapegrad::cli::bench
