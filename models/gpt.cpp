#include "models/gpt.hpp"

#include <cmath>

#include "engine/rng.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

void GPTConfig::validate() const {
  attention_kind(attention);  // throws for an unknown kind, listing the known ones
  if (vocab_size <= 0 || block_size <= 0 || n_layer <= 0 || n_head <= 0 || n_embd <= 0)
    fail("model sizes must be positive: vocab {}, block_size {}, n_layer {}, n_head {}, n_embd {}", vocab_size,
         block_size, n_layer, n_head, n_embd);
  if (n_embd % n_head != 0) fail("n_embd ({}) must be divisible by n_head ({})", n_embd, n_head);
  if (!(dropout >= 0 && dropout < 1)) fail("dropout must be in [0, 1), got {}", dropout);
}

namespace {

// nanoGPT's initialisation: N(0, 0.02²), and 0.02/√(2·n_layer) for the projections that end a residual branch.
constexpr double kStd = 0.02;
double proj_std(const GPTConfig& cfg) { return kStd / std::sqrt(2.0 * static_cast<double>(cfg.n_layer)); }

// module() with the nodes it records named under nanoGPT's module name (for tape_to_dot's grouping; no number
// changes).
template <class Module>
Var in_scope(Tape& tape, const char* name, Module&& module) {
  TapeScope scope(tape, name);
  return module();
}

}  // namespace

GPTBlock::GPTBlock(std::string name, const GPTConfig& cfg, uint64_t seed) : Module(std::move(name)) {
  ln_1 = LayerNorm(child("ln_1"), cfg.n_embd, cfg.bias);
  seed += adopt(ln_1);
  attn = CausalSelfAttention(child("attn"), {cfg.n_embd, cfg.n_head, cfg.block_size, cfg.attention, cfg.bias}, seed,
                             kStd, proj_std(cfg));
  seed += adopt(attn);
  ln_2 = LayerNorm(child("ln_2"), cfg.n_embd, cfg.bias);
  seed += adopt(ln_2);
  mlp = FeedForward(child("mlp"), cfg.n_embd, seed, cfg.bias, kStd, proj_std(cfg), cfg.gelu);
  adopt(mlp);
}

// Parameter k of the model (in the order of parameters()) is drawn from Rng(seed + k).
GPT::GPT(const GPTConfig& cfg, uint64_t seed) : cfg_(cfg) {
  cfg_.validate();
  wte_ = Embedding("transformer.wte", cfg.vocab_size, cfg.n_embd, seed, kStd);
  seed += adopt(wte_);
  wpe_ = Embedding("transformer.wpe", cfg.block_size, cfg.n_embd, seed, kStd);
  seed += adopt(wpe_);
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    h_.emplace_back(fmt::format("transformer.h.{}", l), cfg_, seed);
    seed += adopt(h_.back());
  }
  ln_f_ = LayerNorm("transformer.ln_f", cfg.n_embd, cfg.bias);
  adopt(ln_f_);
}

std::vector<std::pair<std::string, int64_t>> GPT::parameter_summary() const {
  std::vector<std::pair<std::string, int64_t>> rows;
  rows.emplace_back("embeddings (wte, wpe)", wte_.num_parameters() + wpe_.num_parameters());
  for (size_t l = 0; l < h_.size(); ++l) {
    rows.emplace_back(fmt::format("block {} attention", l), h_[l].attn.num_parameters());
    rows.emplace_back(fmt::format("block {} mlp", l), h_[l].mlp.num_parameters());
    rows.emplace_back(fmt::format("block {} norms", l), h_[l].ln_1.num_parameters() + h_[l].ln_2.num_parameters());
  }
  rows.emplace_back("final norm", ln_f_.num_parameters());
  return rows;
}

uint64_t dropout_seed(const GPTConfig& cfg, uint64_t seed, int64_t step) {
  return cfg.dropout > 0 ? seed * 1000003ULL + static_cast<uint64_t>(step) + 1 : 0;
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

// x ← x + attn(ln_1(x)); x ← x + mlp(ln_2(x)). Without dropout each add happens in the branch's last node (c_proj's
// linear, the mlp's): x + branch(a) with the same numbers, one node and one (B, T, C) tensor fewer per add.
Var GPTBlock::operator()(Tape& tape, Var x, const BranchDropout& dropout) const {
  Var a = in_scope(tape, "ln_1", [&] { return ln_1(tape, x); });
  x = dropout ? x + in_scope(tape, "attn", [&] { return dropout(attn(tape, a)); })
              : in_scope(tape, "attn", [&] { return attn(tape, a, x); });
  a = in_scope(tape, "ln_2", [&] { return ln_2(tape, x); });
  x = dropout ? x + in_scope(tape, "mlp", [&] { return dropout(mlp(tape, a)); })
              : in_scope(tape, "mlp", [&] { return mlp(tape, a, x); });
  return x;
}

Var GPT::logits(Tape& tape, const Tensor& idx, uint64_t dropout_seed) const {
  if (idx.dtype() != DType::i32 || idx.rank() != 2)
    fail("gpt: token ids must be int32 of shape (B, T), got {} {}", idx.dtype(), idx.shape());
  const int64_t T = idx.shape()[1];
  if (T > cfg_.block_size || T < 1)
    fail("gpt: ids of shape {}: a context of {} tokens does not fit the model's block_size {}", idx.shape(), T,
         cfg_.block_size);
  Tensor positions = tape.empty(DType::i32, {T});
  for (int64_t t = 0; t < T; ++t) positions.data<int32_t>()[t] = static_cast<int32_t>(t);
  Var wte = wte_.weight().on(tape);  // one leaf for the embedding and the tied head
  Var tok = in_scope(tape, "transformer.wte", [&] { return wte_(tape.constant(idx), wte); });
  Var pos = in_scope(tape, "transformer.wpe", [&] { return wpe_(tape, positions); });
  Var x = dropout(tape, tok + pos, dropout_seed);  // (B, T, C)
  BranchDropout drop;                              // the next masks, drawn in order from dropout_seed, one per call
  if (cfg_.dropout > 0 && dropout_seed != 0) drop = [&](Var v) { return dropout(tape, v, dropout_seed); };
  for (size_t l = 0; l < h_.size(); ++l) {
    TapeScope block(tape, fmt::format("transformer.h.{}", l));
    x = h_[l](tape, x, drop);
  }
  x = in_scope(tape, "transformer.ln_f", [&] { return ln_f_(tape, x); });
  return in_scope(tape, "lm_head", [&] { return linear(x, wte); });  // tied head: logits = x·wteᵀ  (B, T, V)
}

Var GPT::loss(Tape& tape, const Tensor& idx, const Tensor& targets, uint64_t dropout_seed) const {
  if (targets.dtype() != DType::i32 || !(targets.shape() == idx.shape()))
    fail("gpt: targets must be int32 of the ids' shape {}, got {} {}", idx.shape(), targets.dtype(), targets.shape());
  return cross_entropy(logits(tape, idx, dropout_seed), tape.constant(targets));
}

}  // namespace tapegrad
