// tapegrad evaluate: the mean next-token loss of a text under a checkpoint, and the logits of its last position.
//
// The text's token ids t_0 … t_n (n ≤ block_size, ids from the checkpoint's vocabulary) form one batch row:
//   x = (t_0 … t_{n−1}),   logits = GPT(x)   (1, n, V),
//   loss = (1/n)·Σ_{i<n} −log softmax(logits_i)[t_{i+1}]       (the loss `tapegrad train` reports)
// --json also gives the ids and logits_{n−1}, the prediction of the character after the text, so that another
// implementation of the same model can be compared on the same checkpoint (tools/torch_checkpoint.py).
// --hvp-out FILE also writes one Hessian-vector product of that loss over the parameters θ (Tape::hvp, every op's
// second-order rule): for a direction v drawn from --hvp-seed (N(0, 1) per element, ‖v‖ = 1 over all parameters),
// the tensors "direction.NAME" (v) and "hvp.NAME" (H·v, H = ∇²_θ loss) per parameter NAME, so that PyTorch's double
// backward can be compared with it on the same checkpoint and text.
#include <cmath>

#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "models/checkpoint.hpp"
#include "models/data.hpp"
#include "models/files.hpp"
#include "models/gpt.hpp"
#include "models/sharpness.hpp"
#include "engine/rng.hpp"
#include "models/trainer.hpp"
#include "ops/ops.hpp"
#include "tools/commands.hpp"

namespace tapegrad::cli {

namespace {

struct EvaluateArgs {
  std::string checkpoint, text, hvp_out;
  uint64_t hvp_seed = 1;
  bool json = false;
};

void run_evaluate(const EvaluateArgs& a) {
  if (!a.hvp_out.empty()) {
    refuse_input_as_output(a.hvp_out, "--hvp-out", a.checkpoint, "--checkpoint");
    refuse_replacing_run_files(a.hvp_out, "--hvp-out");
  }
  const Checkpoint ck = load_checkpoint(a.checkpoint);
  const GPT model = model_from_checkpoint(ck, a.checkpoint);
  const TextData vocab = checkpoint_vocabulary(ck, model.config().vocab_size, a.checkpoint);
  const std::vector<int32_t> ids = vocab.encode(a.text);
  const auto n = static_cast<int64_t>(ids.size()) - 1;
  const int64_t context = model.config().block_size;
  if (n < 1) fail("evaluate: the text must have at least 2 characters (one prediction), got {}", ids.size());
  if (n > context)
    fail("evaluate: the text has {} characters, more than the model's context of {} plus one", ids.size(), context);

  const Tensor x = Tensor::from<int32_t>({1, n}, std::span<const int32_t>(ids.data(), static_cast<size_t>(n)));
  const Tensor y = Tensor::from<int32_t>({1, n}, std::span<const int32_t>(ids.data() + 1, static_cast<size_t>(n)));
  Tape tape;
  NoGradGuard no_grad(tape);
  Var logits = model.logits(tape, x);
  const double loss = cross_entropy(logits, tape.constant(y)).value().item();
  if (!a.hvp_out.empty()) {
    Rng rng(a.hvp_seed);
    std::vector<Tensor> v;
    double vv = 0;
    for (const Parameter& p : model.parameters()) {
      v.push_back(Tensor::randn(DType::f64, p.value.shape(), rng));
      for (int64_t k = 0; k < v.back().numel(); ++k) vv += v.back().item(k) * v.back().item(k);
    }
    for (Tensor& t : v) {
      for (int64_t k = 0; k < t.numel(); ++k) t.data<double>()[k] /= std::sqrt(vv);
      t = t.to(DType::f32);
    }
    const ParameterHvp h = parameter_hvp(
        model, [&](Tape& t) { return cross_entropy(model.logits(t, x), t.constant(y)); }, v);
    Checkpoint out;
    for (size_t p = 0; p < v.size(); ++p) {
      out.tensors.push_back({"direction." + model.parameters()[p].name, v[p]});
      out.tensors.push_back({"hvp." + model.parameters()[p].name, h.hvp[p]});
    }
    out.metadata["tapegrad.hvp"] =
        nlohmann::json{{"checkpoint", a.checkpoint}, {"text", a.text}, {"seed", a.hvp_seed}, {"loss", h.loss}}.dump();
    save_checkpoint(a.hvp_out, out);
  }

  if (!a.json) {
    fmt::print("loss {:.7f} (mean of {} next-token predictions; {} attention, {})\n", loss, n, model.config().attention,
               a.checkpoint);
    return;
  }
  const int64_t V = model.config().vocab_size;
  const float* last = logits.value().data<float>() + (n - 1) * V;
  nlohmann::json out = {{"checkpoint", a.checkpoint},
                        {"attention", model.config().attention},
                        {"tokens", ids},
                        {"predictions", n},
                        {"loss", loss},
                        {"logits", std::vector<double>(last, last + V)}};
  fmt::print("{}\n", out.dump());
}

}  // namespace

void add_evaluate_command(CLI::App& app) {
  auto args = std::make_shared<EvaluateArgs>();
  CLI::App* cmd = app.add_subcommand("evaluate",
                                     "Mean next-token loss of a text under a checkpoint (with --json: "
                                     "also the logits of the last position)");
  cmd->add_option("--checkpoint", args->checkpoint, "checkpoint.safetensors of a run")
      ->required()
      ->check(existing_file());
  cmd->add_option("--text", args->text, "Text in the checkpoint's vocabulary, 2 to block_size + 1 characters")
      ->required();
  cmd->add_flag("--json", args->json, "One JSON object: tokens, loss, logits of the last position");
  cmd->add_option("--hvp-out", args->hvp_out,
                  "Also write a Hessian-vector product of the loss over the parameters to this safetensors file "
                  "(direction.NAME and hvp.NAME per parameter); an existing file in a run's directory is not replaced");
  cmd->add_option("--hvp-seed", args->hvp_seed, "Seed of the direction of --hvp-out")
      ->capture_default_str()
      ->check(non_negative());
  cmd->callback([args] { run_evaluate(*args); });
}

}  // namespace tapegrad::cli
