// SGD and AdamW over any parameters: steps against hand-computed values, PyTorch's defaults, state round trips.
#include <doctest/doctest.h>

#include "models/checkpoint.hpp"
#include "models/optim.hpp"
#include "models/trainer.hpp"
#include "training_test_util.hpp"

using namespace tapegrad;

namespace {

// A weight (decayed) and a bias (not), one element each, with the gradients given.
std::vector<Parameter> two_parameters(float w, float b) {
  std::vector<Parameter> ps;
  ps.push_back({"w", Tensor::from<float>({1}, {w}), Tensor::zeros(DType::f32, {1}), true});
  ps.push_back({"b", Tensor::from<float>({1}, {b}), Tensor::zeros(DType::f32, {1}), false});
  return ps;
}

void set_grads(std::vector<Parameter>& ps, float g) {
  for (auto& p : ps) p.grad.data<float>()[0] = g;
}

}  // namespace

TEST_CASE("the optimizers' defaults are PyTorch's") {
  CHECK(SGDOptions{}.lr == 1e-3);
  CHECK(SGDOptions{}.momentum == 0);
  CHECK(SGDOptions{}.weight_decay == 0);
  CHECK_FALSE(SGDOptions{}.nesterov);
  const AdamWOptions a;
  CHECK(a.lr == 1e-3);
  CHECK(a.beta1 == 0.9);
  CHECK(a.beta2 == 0.999);
  CHECK(a.eps == 1e-8);
  CHECK(a.weight_decay == 0.01);
}

TEST_CASE("plain SGD: p ← p − lr·g") {
  auto ps = two_parameters(1.0f, 3.0f);
  SGD opt(ps, {.lr = 0.1});
  set_grads(ps, 0.5f);
  opt.step();
  CHECK(ps[0].value.item() == doctest::Approx(0.95).epsilon(1e-7));
  CHECK(ps[1].value.item() == doctest::Approx(2.95).epsilon(1e-7));
}

TEST_CASE("SGD with momentum and weight decay, two steps written out by hand") {
  auto ps = two_parameters(1.0f, 3.0f);
  SGD opt(ps, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  set_grads(ps, 0.5f);
  opt.step();
  // w: g = 0.5 + 0.01·1 = 0.51, b = 0.51, w = 1 − 0.051 = 0.949.   bias: no decay, b = 0.5, 3 − 0.05 = 2.95
  CHECK(ps[0].value.item() == doctest::Approx(0.949).epsilon(1e-7));
  CHECK(ps[1].value.item() == doctest::Approx(2.95).epsilon(1e-7));
  opt.step();
  // w: g = 0.5 + 0.01·0.949 = 0.50949, b = 0.9·0.51 + 0.50949 = 0.96849, w = 0.949 − 0.096849 = 0.852151
  // bias: b = 0.9·0.5 + 0.5 = 0.95, 2.95 − 0.095 = 2.855
  CHECK(ps[0].value.item() == doctest::Approx(0.852151).epsilon(1e-6));
  CHECK(ps[1].value.item() == doctest::Approx(2.855).epsilon(1e-6));
}

TEST_CASE("SGD with Nesterov momentum steps along g + μb") {
  auto ps = two_parameters(1.0f, 3.0f);
  SGD opt(ps, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  set_grads(ps, 0.5f);
  opt.step();  // b = 0.5, step g + μb = 0.95: 1 − 0.095
  CHECK(ps[0].value.item() == doctest::Approx(0.905).epsilon(1e-7));
  opt.step();  // b = 0.9·0.5 + 0.5 = 0.95, step 0.5 + 0.9·0.95 = 1.355: 0.905 − 0.1355
  CHECK(ps[0].value.item() == doctest::Approx(0.7695).epsilon(1e-6));
  CHECK_THROWS_WITH_AS(SGD(ps, {.nesterov = true}), doctest::Contains("nesterov needs a positive momentum"), Error);
}

TEST_CASE("AdamW at PyTorch's defaults, two steps written out by hand") {
  auto ps = two_parameters(1.0f, 3.0f);
  AdamW opt(ps);
  set_grads(ps, 0.5f);
  opt.step();
  // t = 1: w·(1 − 1e-3·0.01), then m̂ = g, v̂ = g²: a step of lr·sign(g).  0.99999 − 0.001
  CHECK(ps[0].value.item() == doctest::Approx(0.99899000002).epsilon(1e-7));
  CHECK(ps[1].value.item() == doctest::Approx(2.99900000002).epsilon(1e-7));
  set_grads(ps, -1.0f);
  opt.step();
  // t = 2: m = 0.9·0.05 − 0.1 = −0.055, v = 0.999·0.00025 + 0.001 = 0.00124975,
  // m̂ = −0.055/0.19, v̂ = 0.00124975/0.001999: a step of −0.000366103...
  CHECK(ps[0].value.item() == doctest::Approx(0.9993461136424056).epsilon(1e-7));
  CHECK(ps[1].value.item() == doctest::Approx(2.999366103542406).epsilon(1e-7));
  CHECK(opt.steps() == 2);
}

TEST_CASE("zero_grad zeroes every parameter's gradient, through the optimizer's own handles") {
  auto ps = two_parameters(1.0f, 3.0f);
  SGD opt(ps);
  set_grads(ps, 2.0f);
  opt.zero_grad();
  CHECK(ps[0].grad.item() == 0);
  CHECK(ps[1].grad.item() == 0);
}

TEST_CASE("an optimizer's state round-trips through a checkpoint file: the next step is the same, bit for bit") {
  testing::ScratchDir dir;
  for (const std::string kind : {"SGD", "AdamW"}) {
    CAPTURE(kind);
    auto make = [&](std::vector<Parameter> ps) -> std::unique_ptr<Optimizer> {
      if (kind == "SGD") return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1, .momentum = 0.9});
      return std::make_unique<AdamW>(ps, AdamWOptions{.lr = 0.01});
    };
    auto ps = two_parameters(1.0f, 3.0f);
    auto opt = make(ps);
    for (float g : {0.5f, -0.25f, 1.5f}) {
      set_grads(ps, g);
      opt->step();
    }
    Checkpoint ck;
    for (const auto& p : ps) ck.tensors.push_back({p.name, p.value});
    opt->save_state(ck);
    save_checkpoint(dir.file(kind + ".safetensors"), ck);

    const Checkpoint loaded = load_checkpoint(dir.file(kind + ".safetensors"));
    auto qs = two_parameters(0.0f, 0.0f);
    for (auto& q : qs) q.value.copy_from(loaded.at(q.name));
    auto restored = make(qs);
    restored->load_state(loaded, dir.file(kind + ".safetensors"));
    CHECK(restored->steps() == 3);
    set_grads(ps, 0.75f);
    set_grads(qs, 0.75f);
    opt->step();
    restored->step();
    CHECK(qs[0].value.item() == ps[0].value.item());
    CHECK(qs[1].value.item() == ps[1].value.item());
  }
}

TEST_CASE("loading optimizer state that does not fit is refused and changes nothing") {
  auto ps = two_parameters(1.0f, 3.0f);
  AdamW opt(ps);
  set_grads(ps, 0.5f);
  opt.step();
  Checkpoint ck;
  opt.save_state(ck);
  std::vector<Parameter> other{ps[0], {std::string("c"), ps[1].value.clone(), ps[1].grad.clone(), false}};
  AdamW fresh(other);  // no state for "c" in the checkpoint
  CHECK_THROWS_WITH_AS(fresh.load_state(ck, "run.safetensors"),
                       doctest::Contains("run.safetensors: no AdamW state 'optimizer.exp_avg.c' for parameter 'c'"),
                       Error);
  CHECK(fresh.steps() == 0);
  CHECK(fresh.first_moments()[0].item() == 0);  // the moments of "w", present in the file, were not read either
  CHECK(fresh.second_moments()[0].item() == 0);
}

// The checkpoints of `tapegrad train` keep the layout they have always had (the parameters, then per parameter
// optimizer.exp_avg.NAME and optimizer.exp_avg_sq.NAME, the step count under tapegrad.adam_steps), so a run
// started before the optimizers were generalised resumes.
TEST_CASE("the trainer's checkpoint keeps its layout: parameters, then AdamW's moments per parameter") {
  testing::ScratchDir dir;
  TrainConfig c;
  c.model.n_layer = 1;
  c.model.n_embd = 16;
  c.model.n_head = 2;
  c.model.block_size = 8;
  c.batch_size = 2;
  c.loop.max_steps = 4;
  c.loop.eval_interval = 2;
  c.eval_iters = 1;
  c.sample_tokens = 0;
  c.loop.quiet = true;
  c.out_dir = dir.path.string();
  train(c, stdout);
  const Checkpoint ck = load_checkpoint(dir.file("softmax/checkpoint.safetensors"));
  GPT model(c.model, 0);
  const auto& ps = model.parameters();
  REQUIRE(ck.tensors.size() == 3 * ps.size());
  for (size_t k = 0; k < ps.size(); ++k) {
    CHECK(ck.tensors[k].name == ps[k].name);
    CHECK(ck.tensors[ps.size() + 2 * k].name == "optimizer.exp_avg." + ps[k].name);
    CHECK(ck.tensors[ps.size() + 2 * k + 1].name == "optimizer.exp_avg_sq." + ps[k].name);
  }
  CHECK(ck.metadata.at("tapegrad.adam_steps") == "4");
}

// The training loop's one pass (clipping's scale, the update, zeroing) against the three passes it replaces, on
// parameters large enough to split across the pool, with a norm that clips and one that does not.
TEST_CASE("step_and_zero_grad gives the bits of clip_grad_norm, step and zero_grad") {
  auto make = [] {
    std::vector<Parameter> ps;
    ps.push_back({"w", Tensor::randn(DType::f32, {300, 200}, 1), Tensor::randn(DType::f32, {300, 200}, 2), true});
    ps.push_back({"b", Tensor::randn(DType::f32, {200}, 3), Tensor::randn(DType::f32, {200}, 4), false});
    return ps;
  };
  for (double max_norm : {1.0, 1e6}) {
    CAPTURE(max_norm);
    auto check = [&](auto make_opt) {
      auto three = make(), one = make();
      auto opt3 = make_opt(three);
      auto opt1 = make_opt(one);
      for (int step = 0; step < 3; ++step) {
        for (size_t k = 0; k < three.size(); ++k) {  // the same fresh gradients on both sides
          const Tensor g = Tensor::randn(DType::f32, three[k].grad.shape(), 10 + step * 7 + k);
          three[k].grad.copy_from(g);
          one[k].grad.copy_from(g);
        }
        const double norm = clip_grad_norm(three, max_norm);
        opt3.step();
        opt3.zero_grad();
        CHECK(grad_norm(one) == norm);
        opt1.step_and_zero_grad(clip_scale(grad_norm(one), max_norm));
        for (size_t k = 0; k < three.size(); ++k) {
          CHECK(one[k].value.to_vector() == three[k].value.to_vector());
          CHECK(one[k].grad.to_vector() == three[k].grad.to_vector());
        }
      }
    };
    check([](std::vector<Parameter>& ps) { return AdamW(ps, {.weight_decay = 0.1}); });
    check([](std::vector<Parameter>& ps) { return SGD(ps, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01}); });
  }
}
