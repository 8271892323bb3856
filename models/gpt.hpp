// A nanoGPT-style character model: token + position embeddings, n_layer pre-norm blocks
//   x ← x + attn(ln_1(x));   x ← x + mlp(ln_2(x))        mlp(x) = c_proj(gelu(c_fc(x)))
// and ln_f, with the output head tied to the token embedding (logits = ln_f(x)·wteᵀ).
// Parameter names and layouts are nanoGPT's, so checkpoints load into its PyTorch model.
#pragma once

#include <string>
#include <vector>

#include "../engine/tape.hpp"

namespace tapegrad {

// The attention kinds a block can use (the posts, by title: docs/derivations.md, "Sources").
//   softmax    standard multi-head attention, one fused node          (attention-gradient, attention-bias posts)
//   tiled      the same map, memory-lean tiled node                    (attention-bias post)
//   beta       softmax replaced by β(x) = x/(1+‖x‖)                    (β-attention post)
//   linear     φ(q)ᵀS / φ(q)ᵀz with φ = elu + 1                        (linear-attention post)
//   optimised  no W^V: values are the input sliced per head            (better-attention post)
//   efficient  no W^V, no W^K: keys and values are the input per head  (better-attention post)
//   super      efficient, and values W^A·x with a learned lower-triangular W^A (T×T) per layer
//                                                                      (better-attention post)
const std::vector<std::string>& attention_kinds();

struct GPTConfig {
  int64_t vocab_size = 65;
  int64_t block_size = 64;  // context length T
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0.0;
  bool bias = false;  // biases in Linear and LayerNorm (nanoGPT's `bias`)
  std::string attention = "softmax";

  void validate() const;  // throws a one-line Error for an inconsistent configuration
};

struct Parameter {
  std::string name;  // nanoGPT's name, e.g. transformer.h.0.attn.c_attn.weight
  Tensor value, grad;
  bool decay;        // weight decay applies (matrices and embeddings, not norms or biases)
};

class GPT {
 public:
  GPT(const GPTConfig& cfg, uint64_t seed);

  // idx, targets: int32 (B, T) with T ≤ block_size. Returns logits (B, T, V).
  Var logits(Tape& tape, const Tensor& idx, uint64_t dropout_seed = 0) const;
  // Mean cross-entropy of the next-token predictions: a scalar.
  Var loss(Tape& tape, const Tensor& idx, const Tensor& targets, uint64_t dropout_seed = 0) const;

  const GPTConfig& config() const { return cfg_; }
  std::vector<Parameter>& parameters() { return params_; }
  const std::vector<Parameter>& parameters() const { return params_; }
  Parameter& parameter(std::string_view name);
  int64_t num_parameters() const;
  // Parameters per part: embeddings, each block's attention and MLP and norms, the final norm.
  std::vector<std::pair<std::string, int64_t>> parameter_summary() const;
  void zero_grad();

 private:
  struct Block {
    size_t ln_1_w, ln_1_b, ln_2_w, ln_2_b;
    size_t c_attn_w, c_attn_b;  // q, k, v projections (fewer for the slimmer kinds); b only with bias
    size_t attn_proj_w, attn_proj_b;
    size_t w_a;                 // super: Θ of W^A = tril(Θ)
    size_t c_fc_w, c_fc_b, mlp_proj_w, mlp_proj_b;
  };
  static constexpr size_t kNone = static_cast<size_t>(-1);

  size_t add(std::string name, Shape shape, double std, bool decay, uint64_t& seed, double fill = 0);
  Var attention_block(Tape& tape, const std::vector<Var>& p, const Block& blk, Var x) const;
  Var dropout(Tape& tape, Var x, uint64_t& seed) const;

  GPTConfig cfg_;
  std::vector<Parameter> params_;
  std::vector<Block> blocks_;
  size_t wte_, wpe_, ln_f_w_, ln_f_b_;
};

}  // namespace tapegrad
