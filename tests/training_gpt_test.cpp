// The GPT, its optimizer and the training loop: parameter counts, schedule, AdamW, resume, learning.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>

#include "engine/parallel.hpp"
#include "engine/rng.hpp"
#include "models/gpt.hpp"
#include "models/optim.hpp"
#include "models/trainer.hpp"
#include "ops/products/products.hpp"
#include "ops/products/small_products.hpp"

using namespace tapegrad;

namespace {

// A small configuration that trains in well under a second per few dozen steps.
TrainConfig tiny(const std::string& kind, const std::string& dir) {
  TrainConfig c;
  c.model.attention = kind;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.n_embd = 32;
  c.model.block_size = 16;
  c.batch_size = 4;
  c.loop.max_steps = 40;
  c.warmup_iters = 5;
  c.loop.eval_interval = 10;
  c.eval_iters = 2;
  c.sample_tokens = 0;
  c.loop.quiet = true;
  c.out_dir = dir;
  c.name = kind;
  return c;
}

std::string temp_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("tapegrad_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

int64_t attention_params(const GPT& m, int layer) {
  for (const auto& [part, n] : m.parameter_summary())
    if (part == fmt::format("block {} attention", layer)) return n;
  return -1;
}

}  // namespace

TEST_CASE("the default model has nanoGPT's 804,096 parameters") {
  GPTConfig cfg;  // 4 layers, 4 heads, 128 wide, context 64, vocab 65, no biases
  GPT model(cfg, 1);
  CHECK(model.num_parameters() == 804096);
}

TEST_CASE("attention parameters per layer follow the better-attention post's formulas (docs/derivations.md §3)") {
  GPTConfig cfg;
  cfg.n_embd = 48;
  cfg.n_head = 4;
  cfg.block_size = 24;
  const int64_t dm = cfg.n_embd, l = cfg.block_size;
  for (auto [kind, expected] : {std::pair<const char*, int64_t>{"softmax", 4 * dm * dm},
                                {"optimised", 3 * dm * dm},
                                {"efficient", 2 * dm * dm},
                                {"super", 2 * dm * dm + l * l}}) {
    CAPTURE(kind);
    cfg.attention = kind;
    GPT model(cfg, 1);
    CHECK(attention_params(model, 0) == expected);
    CHECK(attention_params(model, 1) == expected);
  }
}

TEST_CASE("inconsistent configurations are refused with a one-line reason") {
  GPTConfig cfg;
  cfg.n_embd = 130;
  CHECK_THROWS_WITH_AS(cfg.validate(), doctest::Contains("divisible"), Error);
  cfg = {};
  cfg.attention = "sparse";
  CHECK_THROWS_WITH_AS(cfg.validate(), doctest::Contains("unknown attention kind"), Error);
  cfg = {};
  cfg.n_layer = 0;
  CHECK_THROWS_AS(cfg.validate(), Error);
}

TEST_CASE("a context longer than the model's block size is an error naming both") {
  GPTConfig cfg;
  cfg.n_layer = 1;
  GPT model(cfg, 1);
  Tape tape;
  Tensor ids = Tensor::zeros(DType::i32, {1, cfg.block_size + 1});
  CHECK_THROWS_WITH_AS(model.logits(tape, ids), doctest::Contains("65 tokens does not fit the model's block_size 64"),
                       Error);
}

TEST_CASE("warm-up then cosine decay, as nanoGPT schedules it") {
  CHECK(learning_rate(0, 1e-3, 1e-4, 100, 2000) == doctest::Approx(1e-3 / 101));
  CHECK(learning_rate(99, 1e-3, 1e-4, 100, 2000) == doctest::Approx(1e-3 * 100 / 101));
  CHECK(learning_rate(100, 1e-3, 1e-4, 100, 2000) == doctest::Approx(1e-3));
  CHECK(learning_rate(1050, 1e-3, 1e-4, 100, 2000) == doctest::Approx(5.5e-4));
  CHECK(learning_rate(2000, 1e-3, 1e-4, 100, 2000) == doctest::Approx(1e-4));
  CHECK(learning_rate(2500, 1e-3, 1e-4, 100, 2000) == doctest::Approx(1e-4));
}

TEST_CASE("one AdamW step matches the update written out by hand; decay only where asked") {
  std::vector<Parameter> ps;
  ps.push_back({"w", Tensor::from<float>({2}, {1.0f, -2.0f}), Tensor::from<float>({2}, {0.5f, 0.1f}), true});
  ps.push_back({"b", Tensor::from<float>({1}, {3.0f}), Tensor::from<float>({1}, {-1.0f}), false});
  const double lr = 0.01;
  AdamW opt(ps, {.lr = lr, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1});
  opt.step();
  // t = 1: m̂ = g, v̂ = g², so the step is lr·g/(|g| + ε) = lr·sign(g); decay multiplies by (1 − lr·λ) first.
  CHECK(ps[0].value.item(0) == doctest::Approx(1.0 * (1 - lr * 0.1) - lr).epsilon(1e-6));
  CHECK(ps[0].value.item(1) == doctest::Approx(-2.0 * (1 - lr * 0.1) - lr).epsilon(1e-6));
  CHECK(ps[1].value.item(0) == doctest::Approx(3.0 + lr).epsilon(1e-6));
}

TEST_CASE("gradient clipping scales the global norm down to the limit and leaves small gradients alone") {
  std::vector<Parameter> ps;
  ps.push_back({"a", Tensor::zeros(DType::f32, {2}), Tensor::from<float>({2}, {3.0f, 4.0f}), true});
  CHECK(clip_grad_norm(ps, 1.0) == doctest::Approx(5.0));
  CHECK(ps[0].grad.item(0) == doctest::Approx(0.6).epsilon(1e-5));
  CHECK(ps[0].grad.item(1) == doctest::Approx(0.8).epsilon(1e-5));
  CHECK(clip_grad_norm(ps, 10.0) == doctest::Approx(1.0).epsilon(1e-5));
  CHECK(ps[0].grad.item(1) == doctest::Approx(0.8).epsilon(1e-5));
}

TEST_CASE("every attention kind trains: the loss falls and stays finite") {
  const std::string dir = temp_dir("kinds");
  for (const auto& kind : attention_kinds()) {
    CAPTURE(kind);
    TrainConfig c = tiny(kind, dir);
    c.loop.max_steps = 30;
    TrainResult r = train(c, stdout);
    REQUIRE(r.step_losses.size() == 30);
    for (double l : r.step_losses) CHECK(std::isfinite(l));
    CHECK(r.evals.back().train_loss < r.evals.front().train_loss - 0.3);
    CHECK(std::filesystem::exists(dir + "/" + kind + "/checkpoint.safetensors"));
    CHECK(std::filesystem::exists(dir + "/" + kind + "/losses.csv"));
    CHECK(std::filesystem::exists(dir + "/" + kind + "/losses.svg"));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("resume is exact: 40 steps straight equal 20 + resume + 20, bit for bit") {
  const std::string dir = temp_dir("resume");
  for (const char* kind : {"softmax", "beta"}) {
    CAPTURE(kind);
    TrainConfig straight = tiny(kind, dir);
    straight.name = std::string(kind) + "-straight";
    TrainResult full = train(straight, stdout);

    TrainConfig part = tiny(kind, dir);
    part.name = std::string(kind) + "-parts";
    part.loop.stop_after = 20;
    TrainResult first = train(part, stdout);
    part.loop.stop_after = 0;
    part.loop.resume = true;
    TrainResult second = train(part, stdout);

    std::vector<double> joined = first.step_losses;
    joined.insert(joined.end(), second.step_losses.begin(), second.step_losses.end());
    REQUIRE(joined.size() == full.step_losses.size());
    for (size_t i = 0; i < joined.size(); ++i) {
      CAPTURE(i);
      CHECK(joined[i] == full.step_losses[i]);  // exact equality, not approximate
    }
    CHECK(second.evals.back().val_loss == full.evals.back().val_loss);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("the same seed gives the same run; another seed another") {
  const std::string dir = temp_dir("seed");
  TrainConfig c = tiny("softmax", dir);
  c.loop.max_steps = 10;
  c.loop.overwrite = true;  // the three runs share one run directory
  TrainResult a = train(c, stdout);
  TrainResult b = train(c, stdout);
  c.seed = 7;
  TrainResult other = train(c, stdout);
  CHECK(a.step_losses == b.step_losses);
  CHECK(a.step_losses != other.step_losses);
  std::filesystem::remove_all(dir);
}

TEST_CASE("sampling from a checkpoint continues the prompt with characters of the vocabulary") {
  const std::string dir = temp_dir("sample");
  TrainConfig c = tiny("softmax", dir);
  c.loop.max_steps = 10;
  train(c, stdout);
  SampleConfig sc;
  sc.prompt = "ROMEO:";
  sc.tokens = 40;
  sc.top_k = 5;
  std::string text = sample_from_checkpoint(dir + "/softmax/checkpoint.safetensors", sc);
  CHECK(text.rfind("ROMEO:", 0) == 0);
  CHECK(text.size() == 6 + 40);
  CHECK(sample_from_checkpoint(dir + "/softmax/checkpoint.safetensors", sc) == text);  // seeded
  std::filesystem::remove_all(dir);
}

// One training step of the default model (4 layers, 4 heads of 32, T = 64, causal softmax attention, batch 3) packs
// each shared operand once per use: Kᵀ once per (sequence, head, layer) in the forward and Vᵀ once in the backward,
// 2·B·h·L packings; and where the layers' products x·Wᵀ run on the engine's kernel, each weight's Wᵀ once for all
// the threads that share the product (c_attn, the attention's c_proj, c_fc and the MLP's c_proj: 4 per layer). The
// same count on one thread and on two. (Every other operand of the engine's products is read where it lies: the
// backward's ȳ·W reads W as it is. The weight gradients ȳᵀ·x, which the rule gives to oneDNN, are not counted:
// oneDNN packs their B inside each call, so once in each thread that takes a block of their rows.)
TEST_CASE("a training step packs each shared operand once per use, on one thread and on two") {
  const int saved = num_threads();
  GPTConfig cfg;
  const int64_t batch = 3;
  GPT model(cfg, 1);
  const bool on_engine = product_backend(32, 64, 32) == ProductBackend::engine;
  Rng rng(4);
  Tensor idx = Tensor::empty(DType::i32, {batch, cfg.block_size});
  Tensor targets = Tensor::empty(DType::i32, {batch, cfg.block_size});
  for (int64_t i = 0; i < idx.numel(); ++i) {
    idx.data<int32_t>()[i] = static_cast<int32_t>(rng.below(65));
    targets.data<int32_t>()[i] = static_cast<int32_t>(rng.below(65));
  }
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    set_num_threads(threads);
    Tape tape;
    const uint64_t before = small_kernel_packings();
    Var loss = model.loss(tape, idx, targets);
    tape.backward(loss);
    const int64_t rows = batch * cfg.block_size, c = cfg.n_embd;
    int64_t weights = 0;  // the layer's x·Wᵀ products (m, n, k) that run on the engine's kernel
    for (auto [n, k] : {std::pair{3 * c, c}, std::pair{c, c}, std::pair{4 * c, c}, std::pair{c, 4 * c}})
      weights += product_backend(rows, n, k, false) == ProductBackend::engine ? 1 : 0;
    const uint64_t expected =
        static_cast<uint64_t>((on_engine ? 2 * batch * cfg.n_head * cfg.n_layer : 0) + weights * cfg.n_layer);
    CHECK(small_kernel_packings() - before == expected);
  }
  set_num_threads(saved);
}
