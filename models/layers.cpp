#include "models/layers.hpp"

#include <cmath>

#include "ops/attention/attention.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

// "(..., n)" for messages.
std::string last_axis(int64_t n) { return fmt::format("expected (..., {}) (float32)", n); }

}  // namespace

Linear::Linear(std::string name, int64_t in, int64_t out, uint64_t seed, LinearOptions opt)
    : Module(std::move(name)), in_(in), out_(out), has_bias_(opt.bias) {
  if (in <= 0 || out <= 0) fail("{}: Linear sizes must be positive, got in {} and out {}", this->name(), in, out);
  // PyTorch's default: U(±1/√in) for both, from kaiming_uniform(a = √5) and its bias rule.
  const double bound = 1 / std::sqrt(static_cast<double>(in));
  add_parameter("weight",
                opt.std > 0 ? Tensor::randn(DType::f32, {out, in}, seed, 0, opt.std)
                            : Tensor::uniform(DType::f32, {out, in}, seed, -bound, bound),
                true);
  if (opt.bias)
    add_parameter(
        "bias",
        opt.std > 0 ? Tensor::zeros(DType::f32, {out}) : Tensor::uniform(DType::f32, {out}, seed + 1, -bound, bound),
        false);
}

Var Linear::operator()(Tape& tape, Var x, Var residual) const {
  if (x.dtype() != DType::f32 || x.rank() < 1 || x.shape()[x.rank() - 1] != in_) bad_input(x.shape(), last_axis(in_));
  const Parameter* b = bias();
  return linear(x, weight().on(tape), b ? b->on(tape) : Var{}, residual);
}

Embedding::Embedding(std::string name, int64_t num, int64_t dim, uint64_t seed, double std)
    : Module(std::move(name)), num_(num), dim_(dim) {
  if (num <= 0 || dim <= 0) fail("{}: Embedding sizes must be positive, got {} rows of {}", this->name(), num, dim);
  add_parameter("weight", Tensor::randn(DType::f32, {num, dim}, seed, 0, std), true);
}

Var Embedding::operator()(Tape& tape, const Tensor& ids) const {
  return (*this)(tape.constant(ids), weight().on(tape));
}

Var Embedding::operator()(Var ids, Var table) const {
  if (ids.dtype() != DType::i32)
    bad_input(ids.shape(), fmt::format("expected int32 ids below {}, got {}", num_, ids.dtype()));
  return embedding(ids, table);  // the op names an id out of range, with its place
}

LayerNorm::LayerNorm(std::string name, int64_t dim, bool bias, double eps)
    : Module(std::move(name)), dim_(dim), has_bias_(bias), eps_(eps) {
  if (dim <= 0) fail("{}: LayerNorm size must be positive, got {}", this->name(), dim);
  add_parameter("weight", Tensor::full(DType::f32, {dim}, 1), false);
  if (bias) add_parameter("bias", Tensor::zeros(DType::f32, {dim}), false);
}

Var LayerNorm::operator()(Tape& tape, Var x) const {
  if (x.dtype() != DType::f32 || x.rank() < 1 || x.shape()[x.rank() - 1] != dim_) bad_input(x.shape(), last_axis(dim_));
  Var b = has_bias_ ? parameters()[1].on(tape) : tape.constant(tape.zeros(DType::f32, {dim_}));
  return layer_norm(x, parameters()[0].on(tape), b, eps_);
}

MLP::MLP(std::string name, const std::vector<int64_t>& sizes, uint64_t seed, MLPOptions opt)
    : Module(std::move(name)), activation_(opt.activation) {
  if (sizes.size() < 2)
    fail("{}: an MLP needs at least an input and an output size, got {}", this->name(), sizes.size());
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    layers_.emplace_back(child(std::to_string(i)), sizes[i], sizes[i + 1], seed, LinearOptions{.bias = opt.bias});
    seed += adopt(layers_.back());
  }
}

Var MLP::operator()(Tape& tape, Var x) const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    x = layers_[i](tape, x);
    if (i + 1 == layers_.size()) break;
    switch (activation_) {
      case Activation::relu: x = relu(x); break;
      case Activation::tanh: x = tanh(x); break;
      case Activation::gelu: x = gelu(x); break;
      case Activation::gelu_erf: x = gelu_erf(x); break;
    }
  }
  return x;
}

FeedForward::FeedForward(std::string name, int64_t C, uint64_t seed, bool bias, double std, double proj_std,
                         GeluForm gelu)
    : Module(std::move(name)), gelu_(gelu) {
  c_fc_ = Linear(child("c_fc"), C, 4 * C, seed, {.bias = bias, .std = std});
  seed += adopt(c_fc_);
  c_proj_ = Linear(child("c_proj"), 4 * C, C, seed, {.bias = bias, .std = proj_std});
  adopt(c_proj_);
}

Var FeedForward::operator()(Tape& tape, Var x, Var residual) const {
  const int64_t C = c_fc_.in_features();
  if (x.dtype() != DType::f32 || x.rank() < 2 || x.shape()[x.rank() - 1] != C) bad_input(x.shape(), last_axis(C));
  auto bias = [&](const Linear& l) { return l.bias() ? l.bias()->on(tape) : Var{}; };
  return mlp(x, c_fc_.weight().on(tape), bias(c_fc_), c_proj_.weight().on(tape), bias(c_proj_), gelu_, residual);
}

CausalSelfAttention::CausalSelfAttention(std::string name, const AttentionConfig& cfg, uint64_t seed, double std,
                                         double proj_std)
    : Module(std::move(name)), cfg_(cfg), kind_(&attention_kind(cfg.kind)) {
  const int64_t C = cfg.n_embd, T = cfg.block_size;
  if (C <= 0 || cfg.n_head <= 0 || T <= 0 || C % cfg.n_head != 0)
    fail("{}: n_embd ({}) must be a positive multiple of n_head ({}), and block_size ({}) positive", this->name(), C,
         cfg.n_head, T);
  c_attn_ = Linear(child("c_attn"), C, kind_->projections * C, seed, {.bias = cfg.bias, .std = std});
  seed += adopt(c_attn_);
  if (kind_->mixing_matrix()) {
    w_a_index_ = parameters().size();
    add_parameter("w_a", Tensor::randn(DType::f32, {T, T}, seed++, 0, std), true);
  }
  c_proj_ = Linear(child("c_proj"), C, C, seed, {.bias = cfg.bias, .std = proj_std});
  adopt(c_proj_);
}

Var CausalSelfAttention::operator()(Tape& tape, Var x, Var residual) const {
  const int64_t C = cfg_.n_embd, H = cfg_.n_head;
  if (x.dtype() != DType::f32 || x.rank() != 3 || x.shape()[2] != C || x.shape()[1] > cfg_.block_size)
    bad_input(x.shape(), fmt::format("expected (B, T, {}) float32 with T ≤ block_size {}", C, cfg_.block_size));
  const int64_t T = x.shape()[1];
  using KV = AttentionKind::KeysValues;
  // Columns [offset, offset + C) of a (B, T, ·) tensor as H heads (B, h, T, d), one copy (ops/heads.cpp).
  auto heads = [&](Var t, int64_t offset) { return split_heads(t, H, offset, C); };

  // The better-attention post (docs/derivations.md §3), per head i, X the block input (T, C), X_i its columns i·d …
  // (i+1)·d − 1, W^Q and W^K the q and k rows of c_attn.weight transposed (linear computes X·Wᵀ), s = 1/√d:
  //   Q′_i = X W_i^Q,  S_i = softmax(s·Q′_i K′_iᵀ + M),  H_i = S_i V′_i,  and
  //   optimised  K′_i = X W_i^K,  V′_i = X_i;   efficient  K′_i = V′_i = X_i;   super  K′_i = X_i,  V′_i = (W^A X)_i.
  // The post writes the efficient score as Q W_i^Q W_i^K K; it is Q W_i^Q (W_i^K)ᵀ Kᵀ before the slice K_i replaces
  // K W_i^K. The derivatives are those of the primitive nodes below and of attention().
  Var a = c_attn_(tape, x);
  AttentionOptions ao;
  ao.causal = true;
  using AN = AttentionKind::Node;
  // Standard attention on c_attn's q | k | v: one node that splits and merges the heads itself (ops/attention/
  // softmax.cpp attention_qkv), the same numbers as split_heads ×3, attention, merge_heads below.
  if (kind_->packed_heads()) return c_proj_(tape, attention_qkv(a, H, ao), residual);
  Var q = heads(a, 0), k, v;
  switch (kind_->keys_values) {
    case KV::projected:
      k = heads(a, C);
      v = heads(a, 2 * C);
      break;
    case KV::values_input:
      k = heads(a, C);
      v = heads(x, 0);
      break;
    case KV::input: k = v = heads(x, 0); break;
    case KV::values_mixed: {
      k = heads(x, 0);
      // W^A = tril(Θ), cut to the first T rows and columns: causal because row i mixes only inputs j ≤ i. The
      // better-attention post asks for an upper-triangular W^A, which is causal only in the transposed layout VᵀW^A;
      // with tokens as rows an upper W^A lets token i read the values of tokens j > i.
      Tensor mask = tape.empty(DType::f32, {T, T});
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j) mask.data<float>()[i * T + j] = j <= i ? 1.0f : 0.0f;
      Var w_a = slice(slice(parameters()[w_a_index_].on(tape), 0, 0, T), 1, 0, T) * tape.constant(mask);
      v = heads(matmul(w_a, x), 0);
      break;
    }
  }
  Var y = kind_->node == AN::tiled    ? tiled_attention(q, k, v, ao)
          : kind_->node == AN::beta   ? beta_attention(q, k, v, ao)
          : kind_->node == AN::linear ? linear_attention(q, k, v, true)
                                      : attention(q, k, v, ao);
  y = merge_heads(y);  // (B, h, T, d) → (B, T, C)
  return c_proj_(tape, y, residual);
}

}  // namespace tapegrad
