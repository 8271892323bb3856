// Layers built on the ops: each owns its weights (initialised from a seed), puts them on the tape when it runs,
// and checks its input's shape, naming itself (its full name), the shape it got and the one it expects.
//
//   Tape tape;
//   MLP mlp("mlp", {2, 16, 16, 2}, 42);                     // Linear 2→16, relu, Linear 16→16, relu, Linear 16→2
//   Var x = tape.constant(Tensor::from<float>({4, 2}, {...}));
//   Var y = mlp(tape, x);                                   // (4, 2)
//   SGD opt(mlp.parameters(), {.lr = 0.1, .momentum = 0.9}); // models/optim.hpp
//
// A layer's k-th parameter is drawn from Rng(seed + k); a parent seeds its parts one after another (the GPT's
// initialisation is nanoGPT's: N(0, 0.02²) for matrices and embeddings, ones and zeros for norms, zero biases).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../ops/gelu.hpp"
#include "attention_kinds.hpp"
#include "module.hpp"

namespace tapegrad {

// y = x·Wᵀ + b over the last axis: x (..., in) → y (..., out); W (out, in), b (out).
struct LinearOptions {
  bool bias = true;
  double std = 0;  // > 0: W ~ N(0, std²) and b = 0 (nanoGPT); 0: W, b ~ U(±1/√in) (PyTorch's nn.Linear)
};
class Linear : public Module {
 public:
  Linear() = default;
  Linear(std::string name, int64_t in, int64_t out, uint64_t seed, LinearOptions opt = {});
  // With a residual r (the output's shape): (x·Wᵀ + b) + r in the one node (ops/ops.hpp linear).
  Var operator()(Tape& tape, Var x, Var residual = {}) const;
  const Parameter& weight() const { return parameters()[0]; }
  const Parameter* bias() const { return has_bias_ ? &parameters()[1] : nullptr; }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  int64_t in_ = 0, out_ = 0;
  bool has_bias_ = false;
};

// Rows of a table: ids int32 (...) → (..., dim); table (num, dim) ~ N(0, std²).
class Embedding : public Module {
 public:
  Embedding() = default;
  Embedding(std::string name, int64_t num, int64_t dim, uint64_t seed, double std = 1.0);
  Var operator()(Tape& tape, const Tensor& ids) const;
  // The same with the table already on the tape (a model whose output head reuses it passes the same Var).
  Var operator()(Var ids, Var table) const;
  const Parameter& weight() const { return parameters()[0]; }

 private:
  int64_t num_ = 0, dim_ = 0;
};

// y = (x − μ)/σ · w + b over the last axis of size dim; w = 1, b = 0 at first; no b without bias.
class LayerNorm : public Module {
 public:
  LayerNorm() = default;
  LayerNorm(std::string name, int64_t dim, bool bias = true, double eps = 1e-5);
  Var operator()(Tape& tape, Var x) const;

 private:
  int64_t dim_ = 0;
  bool has_bias_ = false;
  double eps_ = 1e-5;
};

enum class Activation { relu, tanh, gelu, gelu_erf };  // gelu: GPT-2's tanh form; gelu_erf: the exact x·Φ(x)

// A multi-layer perceptron, micrograd's MLP: Linear layers named NAME.0, NAME.1, ... of the sizes given
// (sizes[0] inputs, sizes.back() outputs), the activation between them and none after the last.
struct MLPOptions {
  Activation activation = Activation::relu;
  bool bias = true;
};
class MLP : public Module {
 public:
  MLP() = default;
  MLP(std::string name, const std::vector<int64_t>& sizes, uint64_t seed, MLPOptions opt = {});
  Var operator()(Tape& tape, Var x) const;
  const std::vector<Linear>& layers() const { return layers_; }

 private:
  std::vector<Linear> layers_;
  Activation activation_ = Activation::relu;
};

// A transformer block's feed-forward part, nanoGPT's MLP: c_proj(gelu(c_fc(x))), one fused node (ops/mlp.cpp).
// x (B, T, C) → (B, T, C); c_fc C → 4C, c_proj 4C → C, weights N(0, std²) and N(0, proj_std²), zero biases; the
// gelu exact as nanoGPT's nn.GELU(), or GPT-2's tanh form.
class FeedForward : public Module {
 public:
  FeedForward() = default;
  FeedForward(std::string name, int64_t C, uint64_t seed, bool bias, double std, double proj_std,
              GeluForm gelu = GeluForm::exact);
  // With a residual r (x's shape): c_proj(gelu(c_fc(x))) + r in the one node.
  Var operator()(Tape& tape, Var x, Var residual = {}) const;

 private:
  Linear c_fc_, c_proj_;
  GeluForm gelu_ = GeluForm::exact;
};

struct AttentionConfig {
  int64_t n_embd = 128, n_head = 4;
  int64_t block_size = 64;       // the longest context; super's W^A is block_size × block_size
  std::string kind = "softmax";  // a name in attention_kind_table()
  bool bias = false;
};

// Causal multi-head self-attention of one kind (models/attention_kinds.hpp): x (B, T, C) → (B, T, C), T ≤ block_size.
// Parameters: c_attn (q, k, v rows as the kind needs), w_a (super only), c_proj; weights N(0, std²) but c_proj
// N(0, proj_std²), zero biases.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention() = default;
  CausalSelfAttention(std::string name, const AttentionConfig& cfg, uint64_t seed, double std, double proj_std);
  // With a residual r (x's shape): c_proj(…) + r, added in c_proj's node.
  Var operator()(Tape& tape, Var x, Var residual = {}) const;
  const AttentionKind& kind() const { return *kind_; }

 private:
  AttentionConfig cfg_;
  const AttentionKind* kind_ = nullptr;
  Linear c_attn_, c_proj_;
  size_t w_a_index_ = 0;  // super: W^A = tril(Θ), Θ = parameters()[w_a_index_]
};

}  // namespace tapegrad
