#include "models/gpt.hpp"

#include <cmath>

#include "engine/rng.hpp"
#include "ops/attention.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

const std::vector<std::string>& attention_kinds() {
  static const std::vector<std::string> kinds{"softmax", "tiled", "beta", "linear", "optimised", "efficient", "super"};
  return kinds;
}

void GPTConfig::validate() const {
  bool known = false;
  for (const auto& k : attention_kinds()) known = known || k == attention;
  if (!known) fail("unknown attention kind '{}' (one of softmax, tiled, beta, linear, optimised, efficient, super)", attention);
  if (vocab_size <= 0 || block_size <= 0 || n_layer <= 0 || n_head <= 0 || n_embd <= 0)
    fail("model sizes must be positive: vocab {}, block_size {}, n_layer {}, n_head {}, n_embd {}", vocab_size,
         block_size, n_layer, n_head, n_embd);
  if (n_embd % n_head != 0) fail("n_embd ({}) must be divisible by n_head ({})", n_embd, n_head);
  if (!(dropout >= 0 && dropout < 1)) fail("dropout must be in [0, 1), got {}", dropout);
}

size_t GPT::add(std::string name, Shape shape, double std, bool decay, uint64_t& seed, double fill) {
  Tensor value = Tensor::empty(DType::f32, shape);
  float* p = value.data<float>();
  Rng rng(seed++);
  for (int64_t i = 0; i < value.numel(); ++i) p[i] = static_cast<float>(std > 0 ? std * rng.normal() : fill);
  params_.push_back({std::move(name), value, Tensor::zeros(DType::f32, shape), decay});
  return params_.size() - 1;
}

GPT::GPT(const GPTConfig& cfg, uint64_t seed) : cfg_(cfg) {
  cfg_.validate();
  const int64_t C = cfg.n_embd, T = cfg.block_size;
  const double std = 0.02, proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg.n_layer));
  wte_ = add("transformer.wte.weight", {cfg.vocab_size, C}, std, true, seed);
  wpe_ = add("transformer.wpe.weight", {T, C}, std, true, seed);
  auto norm = [&](const std::string& name, size_t& w, size_t& b) {
    w = add(name + ".weight", {C}, 0, false, seed, 1.0);
    b = cfg.bias ? add(name + ".bias", {C}, 0, false, seed) : kNone;
  };
  auto dense = [&](const std::string& name, int64_t out, int64_t in, double s, size_t& w, size_t& b) {
    w = add(name + ".weight", {out, in}, s, true, seed);
    b = cfg.bias ? add(name + ".bias", {out}, 0, false, seed) : kNone;
  };
  // Rows of c_attn: q, k, v (softmax, tiled, beta, linear); q, k (optimised); q (efficient, super).
  const int64_t projections = cfg.attention == "optimised" ? 2 : (cfg.attention == "efficient" || cfg.attention == "super") ? 1 : 3;
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    const std::string h = fmt::format("transformer.h.{}.", l);
    Block blk{};
    norm(h + "ln_1", blk.ln_1_w, blk.ln_1_b);
    dense(h + "attn.c_attn", projections * C, C, std, blk.c_attn_w, blk.c_attn_b);
    blk.w_a = cfg.attention == "super" ? add(h + "attn.w_a", {T, T}, std, true, seed) : kNone;
    dense(h + "attn.c_proj", C, C, proj_std, blk.attn_proj_w, blk.attn_proj_b);
    norm(h + "ln_2", blk.ln_2_w, blk.ln_2_b);
    dense(h + "mlp.c_fc", 4 * C, C, std, blk.c_fc_w, blk.c_fc_b);
    dense(h + "mlp.c_proj", C, 4 * C, proj_std, blk.mlp_proj_w, blk.mlp_proj_b);
    blocks_.push_back(blk);
  }
  norm("transformer.ln_f", ln_f_w_, ln_f_b_);
}

Parameter& GPT::parameter(std::string_view name) {
  for (auto& p : params_)
    if (p.name == name) return p;
  fail("the model has no parameter named '{}'", name);
}

int64_t GPT::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.value.numel();
  return n;
}

std::vector<std::pair<std::string, int64_t>> GPT::parameter_summary() const {
  std::vector<std::pair<std::string, int64_t>> rows;
  auto count = [&](std::string_view part) {
    int64_t n = 0;
    for (const auto& p : params_)
      if (p.name.find(part) != std::string::npos) n += p.value.numel();
    return n;
  };
  rows.emplace_back("embeddings (wte, wpe)", count("transformer.wte.") + count("transformer.wpe."));
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const std::string h = fmt::format("transformer.h.{}.", l);
    rows.emplace_back(fmt::format("block {} attention", l), count(h + "attn."));
    rows.emplace_back(fmt::format("block {} mlp", l), count(h + "mlp."));
    rows.emplace_back(fmt::format("block {} norms", l), count(h + "ln_"));
  }
  rows.emplace_back("final norm", count("transformer.ln_f."));
  return rows;
}

void GPT::zero_grad() {
  for (auto& p : params_) p.grad.fill_zero();
}

Var GPT::dropout(Tape& tape, Var x, uint64_t& seed) const {
  if (cfg_.dropout <= 0 || seed == 0) return x;
  // Inverted dropout: y = x ⊙ m / (1 − p), m ~ Bernoulli(1 − p), as a product with a constant mask.
  Tensor mask = tape.empty(DType::f32, x.shape());
  Rng rng(seed++);
  const float keep = static_cast<float>(1 - cfg_.dropout);
  float* m = mask.data<float>();
  for (int64_t i = 0; i < mask.numel(); ++i) m[i] = rng.uniform() < keep ? 1 / keep : 0.0f;
  return x * tape.constant(mask);
}

Var GPT::attention_block(Tape& tape, const std::vector<Var>& p, const Block& blk, Var x) const {
  const Shape s = x.shape();
  const int64_t T = s[1], C = cfg_.n_embd, H = cfg_.n_head;
  const std::string& kind = cfg_.attention;
  auto opt = [&](size_t i) { return i == kNone ? Var{} : p[i]; };
  // Columns [offset, offset + C) of a (B, T, ·) tensor as H heads (B, h, T, d), one copy (ops/heads.cpp).
  auto heads = [&](Var t, int64_t offset) { return split_heads(t, H, offset, C); };

  // The better-attention post (docs/derivations.md §3), per head i, X the block input (T, C), X_i its columns i·d …
  // (i+1)·d − 1, W^Q and W^K the q and k rows of c_attn.weight transposed (linear computes X·Wᵀ), s = 1/√d:
  //   Q′_i = X W_i^Q,  S_i = softmax(s·Q′_i K′_iᵀ + M),  H_i = S_i V′_i,  and
  //   optimised  K′_i = X W_i^K,  V′_i = X_i;   efficient  K′_i = V′_i = X_i;   super  K′_i = X_i,  V′_i = (W^A X)_i.
  // The post writes the efficient score as Q W_i^Q W_i^K K; it is Q W_i^Q (W_i^K)ᵀ Kᵀ before the slice K_i replaces
  // K W_i^K. The derivatives are those of the primitive nodes below and of attention().
  Var a = linear(x, p[blk.c_attn_w], opt(blk.c_attn_b));
  Var q = heads(a, 0), k, v;
  if (kind == "optimised") {
    k = heads(a, C);
    v = heads(x, 0);
  } else if (kind == "efficient") {
    k = v = heads(x, 0);
  } else if (kind == "super") {
    k = heads(x, 0);
    // W^A = tril(Θ), cut to the first T rows and columns: causal because row i mixes only inputs j ≤ i. The
    // better-attention post asks for an upper-triangular W^A, which is causal only in the transposed layout VᵀW^A; with
    // tokens as rows an upper W^A lets token i read the values of tokens j > i.
    Tensor mask = tape.empty(DType::f32, {T, T});
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j) mask.data<float>()[i * T + j] = j <= i ? 1.0f : 0.0f;
    Var w_a = slice(slice(p[blk.w_a], 0, 0, T), 1, 0, T) * tape.constant(mask);
    v = heads(matmul(w_a, x), 0);
  } else {
    k = heads(a, C);
    v = heads(a, 2 * C);
  }
  AttentionOptions ao;
  ao.causal = true;
  Var y = kind == "tiled"    ? tiled_attention(q, k, v, ao)
          : kind == "beta"   ? beta_attention(q, k, v, ao)
          : kind == "linear" ? linear_attention(q, k, v, true)
                             : attention(q, k, v, ao);
  y = merge_heads(y);  // (B, h, T, d) → (B, T, C)
  return linear(y, p[blk.attn_proj_w], opt(blk.attn_proj_b));
}

Var GPT::logits(Tape& tape, const Tensor& idx, uint64_t dropout_seed) const {
  if (idx.dtype() != DType::i32 || idx.rank() != 2)
    fail("gpt: token ids must be int32 of shape (B, T), got {} {}", idx.dtype(), idx.shape());
  const int64_t T = idx.shape()[1];
  if (T > cfg_.block_size || T < 1)
    fail("gpt: ids of shape {}: a context of {} tokens does not fit the model's block_size {}", idx.shape(), T,
         cfg_.block_size);
  std::vector<Var> p;
  p.reserve(params_.size());
  for (const auto& prm : params_) p.push_back(tape.param(prm.value, prm.grad));
  Tensor zero_bias = cfg_.bias ? Tensor{} : tape.zeros(DType::f32, {cfg_.n_embd});
  auto norm = [&](Var x, size_t w, size_t b) {
    return layer_norm(x, p[w], b == kNone ? tape.constant(zero_bias) : p[b]);
  };
  Tensor positions = tape.empty(DType::i32, {T});
  for (int64_t t = 0; t < T; ++t) positions.data<int32_t>()[t] = static_cast<int32_t>(t);

  // Scopes name the nodes after nanoGPT's modules (for tape_to_dot's grouping); they change no number.
  Var tok, pos;
  {
    TapeScope scope(tape, "transformer.wte");
    tok = embedding(tape.constant(idx), p[wte_]);
  }
  {
    TapeScope scope(tape, "transformer.wpe");
    pos = embedding(tape.constant(positions), p[wpe_]);
  }
  Var x = tok + pos;  // (B,T,C)
  x = dropout(tape, x, dropout_seed);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const Block& blk = blocks_[l];
    TapeScope block(tape, fmt::format("transformer.h.{}", l));
    Var a;
    {
      TapeScope scope(tape, "ln_1");
      a = norm(x, blk.ln_1_w, blk.ln_1_b);
    }
    {
      TapeScope scope(tape, "attn");
      a = dropout(tape, attention_block(tape, p, blk, a), dropout_seed);
    }
    x = x + a;
    {
      TapeScope scope(tape, "ln_2");
      a = norm(x, blk.ln_2_w, blk.ln_2_b);
    }
    {
      TapeScope scope(tape, "mlp");
      // c_proj(gelu(c_fc(ln_2(x)))) as one node (ops/mlp.cpp)
      a = dropout(tape,
                  mlp(a, p[blk.c_fc_w], blk.c_fc_b == kNone ? Var{} : p[blk.c_fc_b], p[blk.mlp_proj_w],
                      blk.mlp_proj_b == kNone ? Var{} : p[blk.mlp_proj_b]),
                  dropout_seed);
    }
    x = x + a;
  }
  {
    TapeScope scope(tape, "transformer.ln_f");
    x = norm(x, ln_f_w_, ln_f_b_);
  }
  TapeScope scope(tape, "lm_head");
  return linear(x, p[wte_]);  // tied head: logits = x·wteᵀ  (B, T, V)
}

Var GPT::loss(Tape& tape, const Tensor& idx, const Tensor& targets, uint64_t dropout_seed) const {
  if (targets.dtype() != DType::i32 || !(targets.shape() == idx.shape()))
    fail("gpt: targets must be int32 of the ids' shape {}, got {} {}", idx.shape(), targets.dtype(), targets.shape());
  return cross_entropy(logits(tape, idx, dropout_seed), tape.constant(targets));
}

}  // namespace tapegrad
