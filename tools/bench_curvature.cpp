// tapegrad bench, section hvp: one Hessian-vector product of the default model's loss over its parameters
// (Tape::hvp through parameter_hvp: forward over reverse, each op's second-order rule) against a gradient of the
// same loss on the same batch, and against PyTorch's double backward.
//
// What to expect: for a product Y = A·B of cost F, a gradient costs 3F (forward, Ā = ȲBᵀ, B̄ = AᵀȲ) and the HVP
// 9F (forward F; tangent Ẏ = ȦB + AḂ, 2F; the VJP of Ȳ, 2F; the VJP of Ȳ̇ with the rule, Ā̇ = Ȳ̇Bᵀ + ȲḂᵀ and
// B̄̇ = AᵀȲ̇ + ȦᵀȲ, 4F): a model whose time is its products has an HVP of about three gradients.
#include <algorithm>
#include <cmath>

#include "models/sharpness.hpp"
#include "tools/bench_workloads.hpp"

namespace tapegrad::cli::bench {

void curvature_section(Output& out, const BenchArgs& a, TorchSide* torch) {
  TrainStep step(a.model, a.batch);  // the model and its batches; its optimizer is not used
  const Tensor &x = step.batches.front().first, &y = step.batches.front().second;
  const LossFunction loss = [&](Tape& tape) { return step.model.loss(tape, x, y); };
  std::vector<Tensor> direction;
  uint64_t seed = 31;
  for (const Parameter& p : step.model.parameters()) direction.push_back(random_tensor(p.value.shape(), seed++));

  Tape grad_tape, hvp_tape;
  const auto gradient = [&] {
    grad_tape.clear();
    grad_tape.backward(loss(grad_tape));
  };
  const auto product = [&] { parameter_hvp(step.model, loss, direction, hvp_tape); };
  gradient();
  product();
  const size_t grad_bytes = grad_tape.arena().high_water(), hvp_bytes = hvp_tape.arena().high_water();

  // Peers of the HVP, block by block: the gradient on this engine, then PyTorch's double backward and gradient.
  const bool vs = torch != nullptr && torch->ok();
  const json args = {{"model",
                      {{"n_layer", a.model.n_layer},
                       {"n_head", a.model.n_head},
                       {"n_embd", a.model.n_embd},
                       {"block_size", a.model.block_size},
                       {"vocab_size", a.model.vocab_size},
                       {"bias", a.model.bias},
                       {"attention", a.model.attention},
                       {"gelu", gelu_form_name(a.model.gelu)}}},
                     {"batch", a.batch}};
  std::vector<Peer> peers{{[&](int reps, int warmup) -> std::optional<double> {
    for (int i = 0; i < warmup; ++i) gradient();
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) gradient();
    return ms_since(t0) / reps;
  }}};
  std::optional<std::string> torch_hvp, torch_grad;
  if (vs) {
    torch_hvp = torch->prepare("hvp", "loss_hvp", args);
    torch_grad = torch_hvp ? torch->prepare("grad", "loss_gradient", args) : std::nullopt;
    if (torch_grad) {
      peers.push_back(torch_peer(torch, "hvp"));
      peers.push_back(torch_peer(torch, "grad"));
    }
  }
  const PeerTimings p = measure_with(product, a.rounds, peers);
  if (vs) {
    torch->release("hvp");
    torch->release("grad");
  }
  const double grad_ms = p.peer_ms[0].value_or(NAN), over_grad = p.ratio[0].value_or(NAN);
  const bool with_torch = peers.size() == 3;
  const std::string shape =
      fmt::format("B={} T={} C={} L={}", a.batch, a.model.block_size, a.model.n_embd, a.model.n_layer);

  out.print(
      "hvp: H·v of the training loss over the {} parameters ({} attention, {}), one random direction, on one "
      "batch, products in {}; against a gradient of the same loss (forward + backward) on this engine{}\n",
      step.model.num_parameters(), a.model.attention, shape, precision_name(product_precision()),
      with_torch ? " and PyTorch's double backward (autograd.grad with create_graph, then the gradient of ⟨g, v⟩)"
                 : "");
  out.print(
      "  tapegrad  gradient {:.2f} ms, HVP {:.2f} ms: HVP / gradient {:.2f}×; arena "
      "{} for the gradient, {} for the HVP\n",
      grad_ms, p.ms, over_grad, mib(static_cast<int64_t>(grad_bytes)), mib(static_cast<int64_t>(hvp_bytes)));
  if (with_torch) {
    const double th = p.peer_ms[1].value_or(NAN), tg = p.peer_ms[2].value_or(NAN);
    out.print("  PyTorch   gradient {:.2f} ms, HVP {:.2f} ms ({}): HVP / gradient {:.2f}×\n", tg, th, *torch_hvp,
              th / tg);
    out.print("  ratio tapegrad / PyTorch: HVP {:.2f}×, gradient {:.2f}×\n", p.ratio[1].value_or(NAN), grad_ms / tg);
  } else if (torch != nullptr) {
    out.print("  PyTorch —\n");
  }
  out.print("\n");

  Timing t = engine_timing(p, with_torch ? 1 : -1);
  if (with_torch) t.peer = *torch_hvp;
  json& r = out.row("hvp", shape, p.ms, &t, static_cast<int64_t>(hvp_bytes), std::nullopt);
  r["gradient_ms"] = grad_ms;
  r["hvp_over_gradient"] = over_grad;
  r["gradient_arena_bytes"] = grad_bytes;
  if (with_torch) {
    r["torch_gradient_ms"] = p.peer_ms[2].value_or(NAN);
    r["torch_gradient_peer"] = *torch_grad;
  }
}

}  // namespace tapegrad::cli::bench
