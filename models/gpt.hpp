// A nanoGPT-style character model: token + position embeddings, n_layer pre-norm blocks
//   x ← x + attn(ln_1(x));   x ← x + mlp(ln_2(x))        mlp(x) = c_proj(gelu(c_fc(x))), gelu exact as nanoGPT's
// and ln_f, with the output head tied to the token embedding (logits = ln_f(x)·wteᵀ).
// Parameter names and layouts are nanoGPT's, so checkpoints load into its PyTorch model.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "../engine/tape.hpp"
#include "attention_kinds.hpp"
#include "layers.hpp"
#include "module.hpp"

namespace tapegrad {

struct GPTConfig {
  int64_t vocab_size = 65;
  int64_t block_size = 64;  // context length T
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0.0;
  bool bias = false;                  // biases in Linear and LayerNorm (nanoGPT's `bias`)
  std::string attention = "softmax";  // a kind of models/attention_kinds.hpp
  GeluForm gelu = GeluForm::exact;    // the MLP's: exact as nanoGPT's nn.GELU(), or GPT-2's tanh form

  void validate() const;  // throws a one-line Error for an inconsistent configuration
};

// What a block does to a branch's output before adding it to x: the GPT's dropout, or nothing (empty).
using BranchDropout = std::function<Var(Var)>;

// One pre-norm transformer block: x ← x + attn(ln_1(x)); x ← x + mlp(ln_2(x)).
struct GPTBlock : Module {
  GPTBlock() = default;
  GPTBlock(std::string name, const GPTConfig& cfg, uint64_t seed);
  Var operator()(Tape& tape, Var x, const BranchDropout& dropout) const;
  LayerNorm ln_1;
  CausalSelfAttention attn;
  LayerNorm ln_2;
  FeedForward mlp;
};

// The seed of the dropout masks of training step `step` in a run seeded `seed`: 0 (no masks) when the model has no
// dropout.
uint64_t dropout_seed(const GPTConfig& cfg, uint64_t seed, int64_t step);

class GPT : public Module {
 public:
  GPT(const GPTConfig& cfg, uint64_t seed);

  // idx, targets: int32 (B, T) with T ≤ block_size. Returns logits (B, T, V).
  Var logits(Tape& tape, const Tensor& idx, uint64_t dropout_seed = 0) const;
  // Mean cross-entropy of the next-token predictions: a scalar.
  Var loss(Tape& tape, const Tensor& idx, const Tensor& targets, uint64_t dropout_seed = 0) const;

  const GPTConfig& config() const { return cfg_; }
  // Parameters per part: embeddings, each block's attention and MLP and norms, the final norm.
  std::vector<std::pair<std::string, int64_t>> parameter_summary() const;

 private:
  Var dropout(Tape& tape, Var x, uint64_t& seed) const;

  GPTConfig cfg_;
  Embedding wte_, wpe_;  // wte is also the output head (tied)
  std::vector<GPTBlock> h_;
  LayerNorm ln_f_;
};

}  // namespace tapegrad
