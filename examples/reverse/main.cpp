// Reverse: a two-layer attention model learns to reverse sequences of digits. A sequence is n digits, a separator
// and the same digits reversed; the model reads it left to right with causal attention of any kind and predicts
// each next token, and it is trained and scored on the reversed half only. A sequence counts as right when every
// digit of that half is predicted right, which is exactly when greedy decoding would write it out.
//   reverse [attention kind] [steps]          defaults: softmax, 600 steps
#include <cstdio>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.hpp>

using namespace tapegrad;

constexpr int64_t kDigits = 6, kT = 2 * kDigits + 1, kSeparator = 10, kVocab = 11, kWidth = 64;

// A transformer block as in GPT-2: x + attn(ln_1(x)), then x + mlp(ln_2(x)).
struct Block {
  LayerNorm ln_1, ln_2;
  CausalSelfAttention attn;
  FeedForward mlp;
};

class Reverser : public Module {
 public:
  Reverser(const std::string& kind, uint64_t seed) {
    const AttentionConfig cfg{.n_embd = kWidth, .n_head = 4, .block_size = kT, .kind = kind};
    tok_ = Embedding("tok", kVocab, kWidth, seed, 0.02);
    seed += adopt(tok_);
    pos_ = Embedding("pos", kT, kWidth, seed, 0.02);
    seed += adopt(pos_);
    for (int l = 0; l < 2; ++l) {
      const std::string h = fmt::format("h.{}.", l);
      blocks_.push_back({LayerNorm(h + "ln_1", kWidth), LayerNorm(h + "ln_2", kWidth),
                         CausalSelfAttention(h + "attn", cfg, seed, 0.02, 0.01),
                         FeedForward(h + "mlp", kWidth, seed + 100, true, 0.02, 0.01)});
      const Block& b = blocks_.back();
      adopt(b.ln_1);
      adopt(b.attn);
      adopt(b.ln_2);
      adopt(b.mlp);
      seed += 200;
    }
    ln_f_ = LayerNorm("ln_f", kWidth);
    adopt(ln_f_);
    head_ = Linear("head", kWidth, kVocab, seed);
    adopt(head_);
  }

  // ids (B, T) → logits (B, T, kVocab)
  Var operator()(Tape& tape, const Tensor& ids) const {
    std::vector<int32_t> positions(kT);
    for (int32_t t = 0; t < kT; ++t) positions[static_cast<size_t>(t)] = t;
    Var x = tok_(tape, ids) + pos_(tape, Tensor::from<int32_t>({kT}, positions));
    for (const Block& b : blocks_) {
      x = x + b.attn(tape, b.ln_1(tape, x));
      x = x + b.mlp(tape, b.ln_2(tape, x));
    }
    return head_(tape, ln_f_(tape, x));
  }

 private:
  Embedding tok_, pos_;
  std::vector<Block> blocks_;
  LayerNorm ln_f_;
  Linear head_;
};

// B random sequences "d_1 … d_n | d_n … d_1" (B, T), and the targets of the reversed half: the token after each
// position n … 2n − 1 (B, n).
void make_batch(int64_t B, Rng& rng, Tensor& ids, Tensor& targets) {
  std::vector<int32_t> seq(static_cast<size_t>(B * kT)), next(static_cast<size_t>(B * kDigits));
  for (int64_t b = 0; b < B; ++b) {
    int32_t* s = seq.data() + b * kT;
    for (int64_t i = 0; i < kDigits; ++i) s[i] = static_cast<int32_t>(rng.below(10));
    s[kDigits] = kSeparator;
    for (int64_t i = 0; i < kDigits; ++i) s[kDigits + 1 + i] = s[kDigits - 1 - i];
    for (int64_t i = 0; i < kDigits; ++i) next[static_cast<size_t>(b * kDigits + i)] = s[kDigits + 1 + i];
  }
  ids = Tensor::from<int32_t>({B, kT}, seq);
  targets = Tensor::from<int32_t>({B, kDigits}, next);
}

// The logits of positions n … 2n − 1, which predict the reversed digits: (B, n, kVocab).
Var reversed_half(const Reverser& model, Tape& tape, const Tensor& ids) {
  return slice(model(tape, ids), 1, kDigits, 2 * kDigits);
}

// The share of sequences whose reversed half is predicted right in every digit.
double exact_match(const Reverser& model, const Tensor& ids, const Tensor& targets) {
  Tape tape;
  NoGradGuard no_grad(tape);
  const Tensor logits = reversed_half(model, tape, ids).value();
  const int64_t B = ids.shape()[0];
  int64_t right = 0;
  for (int64_t b = 0; b < B; ++b) {
    bool all = true;
    for (int64_t i = 0; i < kDigits; ++i) {
      const int64_t row = (b * kDigits + i) * kVocab;
      int64_t best = 0;
      for (int64_t v = 1; v < kVocab; ++v)
        if (logits.item(row + v) > logits.item(row + best)) best = v;
      all = all && best == targets.data<int32_t>()[b * kDigits + i];
    }
    right += all;
  }
  return static_cast<double>(right) / static_cast<double>(B);
}

int main(int argc, char** argv) {
  const std::string kind = argc > 1 ? argv[1] : "softmax";
  const int64_t steps = argc > 2 ? std::stoll(argv[2]) : 600;
  Reverser model(kind, 1);
  AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.0});
  Rng data(2), held_out(3);
  Tensor test_ids, test_targets;
  make_batch(1000, held_out, test_ids, test_targets);
  std::printf("%s attention, %lld parameters, sequences of %lld digits\n", kind.c_str(),
              static_cast<long long>(model.num_parameters()), static_cast<long long>(kDigits));

  Tape tape;
  for (int64_t step = 1; step <= steps; ++step) {
    Tensor ids, targets;
    make_batch(64, data, ids, targets);
    Var loss = cross_entropy(reversed_half(model, tape, ids), tape.constant(targets));
    tape.backward(loss);
    const double value = loss.value().item();
    tape.clear();
    opt.set_lr(3e-3 * std::min(1.0, 2.0 - 2.0 * static_cast<double>(step) / static_cast<double>(steps)));
    opt.step();
    opt.zero_grad();
    if (step % 250 == 0 || step == steps)
      std::printf("step %5lld  loss %.4f  exact match %.1f%%\n", static_cast<long long>(step), value,
                  100 * exact_match(model, test_ids, test_targets));
  }
  const double acc = exact_match(model, test_ids, test_targets);
  std::printf("exact match on 1000 new sequences: %.1f%%\n", 100 * acc);
  return acc >= 0.95 ? 0 : 1;
}
