// train_loop on a model of the user's own: the loss falls, the logs are written as the run goes, resume is exact,
// and temporaries of killed writes are cleaned up.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>

#include "models/layers.hpp"
#include "models/loop.hpp"
#include "ops/ops.hpp"
#include "training_test_util.hpp"

using namespace tapegrad;

namespace {

// Four points of XOR: class 1 where exactly one coordinate is 1.
struct Xor {
  Tensor x = Tensor::from<float>({4, 2}, {0, 0, 0, 1, 1, 0, 1, 1});
  Tensor y = Tensor::from<int32_t>({4}, {0, 1, 1, 0});
};

LoopFunctions xor_functions(const MLP& mlp, const Xor& data) {
  LoopFunctions fn;
  fn.loss = [&](Tape& tape, int64_t) { return cross_entropy(mlp(tape, tape.constant(data.x)), tape.constant(data.y)); };
  fn.evaluate = [&](int64_t) {
    Tape tape;
    NoGradGuard no_grad(tape);
    const double l = cross_entropy(mlp(tape, tape.constant(data.x)), tape.constant(data.y)).value().item();
    return Evaluation{l, l};
  };
  return fn;
}

}  // namespace

TEST_CASE("train_loop fits an MLP to XOR with SGD: the loss falls") {
  Xor data;
  MLP mlp("mlp", {2, 16, 2}, 7, {.activation = Activation::tanh});
  SGD opt(mlp.parameters(), {.lr = 0.5, .momentum = 0.9});
  LoopFunctions fn = xor_functions(mlp, data);
  LoopResult r = train_loop(mlp, opt, {.max_steps = 200, .eval_interval = 50, .quiet = true}, fn);
  REQUIRE(r.step_losses.size() == 200);
  CHECK(r.step_losses.front() > 0.5);
  CHECK(r.step_losses.back() < 0.05);
  REQUIRE(r.evals.size() == 5);  // steps 0, 50, 100, 150 and the end
  CHECK(r.evals.back().step == 200);
  CHECK(r.evals.back().val_loss < r.evals.front().val_loss);
}

TEST_CASE("losses.csv and losses.svg are written at each evaluation, while the run goes on") {
  testing::ScratchDir dir;
  Xor data;
  MLP mlp("mlp", {2, 8, 2}, 1);
  AdamW opt(mlp.parameters(), {.lr = 0.01});
  LoopFunctions fn = xor_functions(mlp, data);
  std::string csv_at_step_7;
  auto loss = fn.loss;
  fn.loss = [&](Tape& tape, int64_t step) {
    if (step == 7) csv_at_step_7 = testing::slurp(dir.file("losses.csv"));
    return loss(tape, step);
  };
  train_loop(mlp, opt, {.max_steps = 12, .eval_interval = 5, .dir = dir.path.string(), .quiet = true}, fn);
  // After the evaluation at step 5 and that step: the header and rows 0 … 5, validation losses at 0 and 5.
  std::vector<std::string> lines;
  for (size_t a = 0, b; (b = csv_at_step_7.find('\n', a)) != std::string::npos; a = b + 1)
    lines.push_back(csv_at_step_7.substr(a, b - a));
  REQUIRE(lines.size() == 7);
  CHECK(lines[0] == "step,lr,train_loss,val_loss,ms_per_step");
  CHECK(lines[1].starts_with("0,0.01,"));
  CHECK(lines[6].starts_with("5,0.01,"));
  auto val_of = [](const std::string& row) {  // the fourth column
    size_t p = 0;
    for (int i = 0; i < 3; ++i) p = row.find(',', p) + 1;
    return row.substr(p, row.find(',', p) - p);
  };
  CHECK_FALSE(val_of(lines[1]).empty());
  CHECK(val_of(lines[2]).empty());
  CHECK_FALSE(val_of(lines[6]).empty());
  CHECK(std::filesystem::exists(dir.file("losses.svg")));
  CHECK(std::filesystem::exists(dir.file("checkpoint.safetensors")));
}

TEST_CASE("train_loop resumes exactly: 6 steps, then 6 more from the checkpoint, equal 12 straight") {
  testing::ScratchDir straight_dir, parts_dir;
  Xor data;
  auto run = [&](const std::string& dir, int64_t stop_after, bool resume, uint64_t seed) {
    MLP mlp("mlp", {2, 8, 2}, seed);
    SGD opt(mlp.parameters(), {.lr = 0.2, .momentum = 0.9, .weight_decay = 0.01});
    LoopFunctions fn = xor_functions(mlp, data);
    LoopConfig cfg{
        .max_steps = 12, .eval_interval = 4, .dir = dir, .resume = resume, .stop_after = stop_after, .quiet = true};
    cfg.lr = [](int64_t it) { return 0.2 / static_cast<double>(it + 1); };
    LoopResult r = train_loop(mlp, opt, cfg, fn);
    return std::make_pair(r, mlp.parameters()[0].value.to_vector());
  };
  auto [straight, w_straight] = run(straight_dir.path.string(), 0, false, 3);
  run(parts_dir.path.string(), 6, false, 3);
  auto [second, w_parts] = run(parts_dir.path.string(), 0, true, 99);  // other initial weights: the checkpoint's win
  CHECK(second.first_step == 6);
  CHECK(w_parts == w_straight);
  CHECK(second.evals.size() == straight.evals.size());
  CHECK(testing::slurp(parts_dir.file("losses.csv")).size() > 0);
}

TEST_CASE("temporaries left by killed writes are removed when the next run in the directory starts") {
  testing::ScratchDir dir;
  for (const char* name : {".checkpoint.safetensors.tmp-a1b2c3", ".checkpoint.safetensors.tmp-d4e5f6",
                           ".losses.csv.tmp-g7h8i9", "notes.txt", ".other.tmp-j0k1l2"})
    testing::spit(dir.file(name), "partial");
  Xor data;
  MLP mlp("mlp", {2, 4, 2}, 1);
  SGD opt(mlp.parameters());
  std::vector<std::string> at_first_step;
  LoopFunctions fn = xor_functions(mlp, data);
  auto loss = fn.loss;
  fn.loss = [&](Tape& tape, int64_t step) {
    if (step == 0) at_first_step = dir.entries();
    return loss(tape, step);
  };
  train_loop(mlp, opt, {.max_steps = 2, .eval_interval = 10, .dir = dir.path.string(), .quiet = true}, fn);
  // At the first step, only the checkpoint of step 0 has been written next to the files that are not temporaries.
  CHECK(at_first_step == std::vector<std::string>{".other.tmp-j0k1l2", "checkpoint.safetensors", "notes.txt"});
  CHECK(remove_stale_temporaries(dir.path.string()) == 0);
}

TEST_CASE("--overwrite removes the old run's files, its checkpoint last, before the new run writes its first") {
  // A kill during the new run's first step would otherwise leave its checkpoint of step 0 beside the old run's
  // losses.csv (and sharpness.csv): one directory, two runs.
  testing::ScratchDir dir;
  Xor data;
  MLP mlp("mlp", {2, 4, 2}, 1);
  SGD opt(mlp.parameters());
  LoopFunctions fn = xor_functions(mlp, data);
  train_loop(mlp, opt, {.max_steps = 4, .eval_interval = 2, .dir = dir.path.string(), .quiet = true}, fn);
  testing::spit(dir.file("sharpness.csv"), "step,lr,sharpness\n2,0.1,3.5\n");  // as a GPT run with --sharpness-every
  testing::spit(dir.file("notes.txt"), "not the run's");
  REQUIRE(dir.entries() ==
          std::vector<std::string>{"checkpoint.safetensors", "losses.csv", "losses.svg", "notes.txt", "sharpness.csv"});
  std::vector<std::string> at_first_step;
  auto loss = fn.loss;
  fn.loss = [&](Tape& tape, int64_t step) {
    if (step == 0) at_first_step = dir.entries();
    return loss(tape, step);
  };
  CHECK_THROWS_WITH_AS(train_loop(mlp, opt, {.max_steps = 4, .dir = dir.path.string(), .quiet = true}, fn),
                       doctest::Contains("holds a run already"), Error);
  CHECK(at_first_step.empty());  // refused before any step: the old run as it was
  CHECK(dir.entries().size() == 5);
  train_loop(mlp, opt, {.max_steps = 4, .eval_interval = 2, .dir = dir.path.string(), .quiet = true, .overwrite = true},
             fn);
  // At the new run's first step: its checkpoint of step 0 alone, no file of the old run beside it.
  CHECK(at_first_step == std::vector<std::string>{"checkpoint.safetensors", "notes.txt"});
  CHECK(testing::slurp(dir.file("losses.csv")).find("step,") == 0);
}

TEST_CASE("train_loop refuses a run without a loss function, and names a non-finite loss with its step") {
  MLP mlp("mlp", {2, 2}, 1);
  SGD opt(mlp.parameters());
  CHECK_THROWS_WITH_AS(train_loop(mlp, opt, {.max_steps = 1, .quiet = true}, {}), doctest::Contains("no loss function"),
                       Error);
  LoopFunctions fn;
  fn.loss = [](Tape& tape, int64_t) { return log(tape.constant(Tensor::from<float>({}, {0.0f}))); };
  CHECK_THROWS_WITH_AS(train_loop(mlp, opt, {.max_steps = 3, .quiet = true}, fn),
                       doctest::Contains("the training loss became -inf at step 0; stopped"), Error);
}

TEST_CASE("a training state that turns non-finite is not written: the checkpoint kept is the last finite one") {
  // A loss of 1e30 per unit of output is finite, and so is every weight after AdamW's first step, but the squared
  // gradient overflows float32: the second moment is +inf. The checkpoint of step 1 would hold it.
  testing::ScratchDir dir;
  const Tensor x = Tensor::from<float>({4, 2}, {0, 0, 0, 1, 1, 0, 1, 1});
  MLP mlp("mlp", {2, 4, 2}, 3);
  AdamW opt(mlp.parameters(), {.lr = 1e-3});
  LoopFunctions fn;
  fn.loss = [&](Tape& tape, int64_t) { return scale(sum(mlp(tape, tape.constant(x))), 1e30); };
  const std::string path = dir.file("checkpoint.safetensors");
  std::string message;
  try {
    train_loop(mlp, opt, {.max_steps = 4, .eval_interval = 1, .dir = dir.path.string(), .quiet = true}, fn);
  } catch (const Error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("the training state became non-finite by step 1: optimizer.") == 0);
  CHECK(message.find("is not written; stopped, the last good checkpoint " + path + " is kept") != std::string::npos);
  // The checkpoint kept is step 0's, finite throughout, and resumes.
  const Checkpoint ck = load_checkpoint(path);
  CHECK(ck.metadata.at("tapegrad.step") == "0");
  for (const auto& t : ck.tensors)
    for (double v : t.tensor.to_vector()) REQUIRE(std::isfinite(v));
  MLP again("mlp", {2, 4, 2}, 3);
  AdamW fresh(again.parameters(), {.lr = 1e-3});
  CHECK_NOTHROW(fresh.load_state(ck, path));
}
