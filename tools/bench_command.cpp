// tapegrad bench: the engine's speed and memory on this machine, optionally side by side with PyTorch.
//
// Sections: matmul through the engine next to a raw cblas_sgemm (tools/bench_matmul.cpp); each attention node
// forward and forward + backward with the bytes it keeps; one training step of the default model, against the
// product ceiling and PyTorch; one Hessian-vector product of its loss against a gradient
// (tools/bench_curvature.cpp); the peak RSS of a 200-step training run; issue 3's memory table (bytes kept and
// peak RSS of one forward + backward at long contexts). How each is timed: tools/bench_harness.hpp. Peak RSS
// figures come from child processes (their VmHWM), one per measurement, since a process' peak never goes down.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>

#include "ops/products/blas.hpp"
#include "ops/products/blas_info.hpp"
#include "engine/parallel.hpp"
#include "engine/rng.hpp"
#include "models/files.hpp"
#include "models/gpt.hpp"
#include "models/optim.hpp"
#include "models/trainer.hpp"
#include "ops/attention/attention.hpp"
#include "ops/ops.hpp"
#include "tools/bench_harness.hpp"
#include "tools/bench_workloads.hpp"
#include "tools/commands.hpp"

namespace tapegrad::cli {

namespace {

using namespace bench;

// ---- sections -------------------------------------------------------------------------------------------------

// with_step: a section runs bench's training step, whose memory estimate the header shows.
void header(Output& out, const BenchArgs& a, TorchSide* torch, bool with_step) {
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  const std::string cpu = first_line_with("/proc/cpuinfo", "model name");
  const std::string mem = first_line_with("/proc/meminfo", "MemTotal");
  auto blas_libs = mapped_libraries("blas");
  const BlasInfo blas = blas_info();
  out.print("tapegrad bench, {}{}\n", date, a.quick ? " (--quick: fewer rounds, smaller shapes)" : "");
  out.print("machine   {}, {} CPUs available, {} memory, load average {}\n", blas.cpu,
            std::thread::hardware_concurrency(), mem, load_average());
  out.print("tapegrad  {} threads (the engine's pool); OpenBLAS single-threaded under it: {} kernels ({}), {}\n",
            num_threads(), blas.core, blas_summary(blas), blas_libs.empty() ? "?" : blas_libs.front());
  out.print("          {}\n", products_summary());
  if (with_step) {
    const double step_bytes = TrainStep::memory_needed(a.model, a.batch);
    out.print("memory    {}: {}\n", TrainStep::describe(a.model, a.batch), memory_outlook(step_bytes));
  }
  out.header = {{"date", date},
                {"machine",
                 {{"cpu", cpu},
                  {"cpus", std::thread::hardware_concurrency()},
                  {"memory", mem},
                  {"load_average", load_average()}}},
                {"threads", num_threads()},
                {"blas", blas_json(blas)},
                {"products", products_json()},
                {"blas_library", blas_libs.empty() ? json(nullptr) : json(blas_libs.front())},
                {"rounds", a.rounds},
                {"block_ms", g_block_ms},
                {"quick", a.quick}};
  if (torch) out.header["torch"] = torch->ok() ? torch->info() : json{{"error", torch->why()}};
  if (with_step) out.header["step_memory_estimate_bytes"] = TrainStep::memory_needed(a.model, a.batch);
  if (torch) {
    if (torch->ok()) {
      const json& i = torch->info();
      std::string libs;
      for (const auto& l : i["blas"]) libs += (libs.empty() ? "" : ", ") + l.get<std::string>();
      out.print(
          "pytorch   {} ({}), {} threads, float32; BLAS {}{}\n", i["torch"].get<std::string>(),
          i.value("python", std::string("?")), i["threads"].get<int>(), libs,
          i["openmp_blas"].get<bool>() ? "" : " (OpenBLAS-pthread: install libopenblas0-openmp for a fair figure)");
      out.print(
          "          peers: softmax attention {}; β and linear attention the composite (no fused kernel in "
          "PyTorch); training step eager{}\n",
          i.value("sdpa", false) ? "scaled_dot_product_attention(is_causal=True), in the training step too"
                                 : "the composite (this PyTorch has no scaled_dot_product_attention)",
          !a.torch_compile            ? " (--torch-compile adds torch.compile)"
          : i.value("compile", false) ? " and torch.compile"
                                      : " (this PyTorch has no torch.compile)");
    } else {
      out.print("pytorch   not available: {}\n", torch->why());
    }
  }
  out.print("method    median over {} blocks of ~{:.0f} ms after a warm-up{}\n", a.rounds, g_block_ms,
            torch && torch->ok() ? fmt::format("; tapegrad and PyTorch alternate block by block, each block after a "
                                               "{} ms pause and ~10 ms of untimed runs; ratio = median of the "
                                               "per-block ratios tapegrad / PyTorch",
                                               kSettleMs)
                                 : "");
  if (!a.json) out.print("\n");
}

// Keeps every engine thread busy with products for `ms` ms: the first measurement of a process otherwise runs on
// cores (virtual CPUs) that were idle and on pages not yet touched.
void warm_up_cores(double ms) {
  Tensor x = random_tensor({512, 512}, 23), c = Tensor::empty(DType::f32, {512, 512});
  for (const auto t0 = Clock::now(); ms_since(t0) < ms;)
    gemm(512, 512, 512, 1.0f, as_is(x.data<float>(), 512), as_is(x.data<float>(), 512), 0.0f, c.data<float>(), 512);
}

// GFLOP/s of a causal attention node whose products are the softmax family's (S = QKᵀ, O = AV; backward
// dV = AᵀG, dA = GVᵀ, dQ = dS·K, dK = dSᵀ·Q): 2·T²·d flops per product over the full T×T, half of that under the
// causal mask, counted once (a node that recomputes S in backward is not credited for it). Linear attention's
// products are of another shape: no figure.
std::optional<double> attention_gflops(const std::string& node, const AttentionShape& s, bool backward, double ms) {
  if (node == "linear_attention") return std::nullopt;
  const double products = backward ? 6 : 2;  // causal: 2 products forward and 4 backward, each T²·d flops
  const double flops = products * static_cast<double>(s.B * s.H) * static_cast<double>(s.T * s.T * s.d);
  return flops / ms / 1e6;
}

std::string gflops_cell(std::optional<double> g, double ceiling) {
  if (!g) return fmt::format("{:>14}", "—");
  return std::isnan(ceiling) ? fmt::format("{:>14.1f}", *g)
                             : fmt::format("{:>7.1f} ({:>3.0f}%)", *g, 100 * *g / ceiling);
}

void attention_section(Output& out, const BenchArgs& a, TorchSide* torch, double ceiling) {
  std::vector<AttentionShape> shapes{{12, 4, 64, 32}, {4, 4, 256, 64}, {1, 8, 1024, 64}};
  if (a.quick) shapes = {{12, 4, 64, 32}};
  const bool vs = torch != nullptr;
  out.print(
      "attention nodes: causal, float32 tensors, products in {}; forward alone and forward + backward, with "
      "GFLOP/s (causal products counted once{}); bytes the node keeps (O included)\n",
      precision_name(product_precision()),
      std::isnan(ceiling) ? "" : fmt::format(", % of the product ceiling {:.1f}", ceiling));
  out.print("  {:<17} {:<16} {:>9} {:>14}{} {:>10} {:>14}{} {:>11}{}\n", "node", "(B, h, T, d)", "fwd ms", "GFLOP/s",
            vs ? fmt::format("  {:>9} {:>7}", "torch ms", "ratio") : "", "fwd+bwd ms", "GFLOP/s",
            vs ? fmt::format("  {:>9} {:>7}", "torch ms", "ratio") : "", "kept", vs ? "  PyTorch peer" : "");
  int id = 0;
  for (const AttentionShape& s : shapes) {
    double fused_ms = NAN, tiled_ms = NAN;
    for (const std::string& node : attention_nodes()) {
      AttentionRun run(node, s);
      const int64_t kept = run.bytes_kept();
      const json args = {node, s.B, s.H, s.T, s.d};
      const std::string fid = fmt::format("af{}", id), bid = fmt::format("ab{}", id);
      ++id;
      const auto fwd_peer = vs && torch->ok() ? torch->prepare(fid, "attention_fwd", args) : std::nullopt;
      const auto bwd_peer = fwd_peer ? torch->prepare(bid, "attention_bwd", args) : std::nullopt;
      const bool torch_ready = fwd_peer && bwd_peer;
      Timing fwd = measure([&] { run.forward(); }, a.rounds, torch_ready ? torch : nullptr, fid);
      Timing both = measure([&] { run.forward_backward(); }, a.rounds, torch_ready ? torch : nullptr, bid);
      fwd.peer = torch_ready ? *fwd_peer : "";
      both.peer = torch_ready ? *bwd_peer : "";
      if (torch_ready) {
        torch->release(fid);
        torch->release(bid);
      }
      if (node == "attention") fused_ms = both.ms;
      if (node == "tiled_attention") tiled_ms = both.ms;
      const auto gf_fwd = attention_gflops(node, s, false, fwd.ms), gf_both = attention_gflops(node, s, true, both.ms);
      out.print("  {:<17} {:<16} {:>9.3f} {}{} {:>10.3f} {}{} {:>11}{}\n", node, s.str(), fwd.ms,
                gflops_cell(gf_fwd, ceiling), torch_cells(fwd, vs), both.ms, gflops_cell(gf_both, ceiling),
                torch_cells(both, vs), mib(kept), vs ? "  " + both.peer : "");
      for (auto [workload, t, gf] :
           {std::tuple{"attention_fwd ", &fwd, gf_fwd}, std::tuple{"attention_fwd_bwd ", &both, gf_both}}) {
        json& r = out.row(workload + node, s.str(), t->ms, t, kept, gf);
        r["share_of_product_ceiling"] = gf && !std::isnan(ceiling) ? json(*gf / ceiling) : json(nullptr);
      }
    }
    out.print("  {:<17} {:<16} tiled / fused forward + backward: {:.2f}×\n", "", s.str(), tiled_ms / fused_ms);
  }
  out.print("\n");
}

// The step's GFLOP/s against the product ceiling two ways: against the ceiling as the matmul section measured it, and
// against the product that set it, timed again here block by block in turn with the step (a peer, as PyTorch's
// step is): both then see the same state of a shared machine, whose pace moved by 10–20% within minutes (AMD EPYC
// Zen 5, 2 threads), and the share is the median of the per-block shares.
void training_section(Output& out, const BenchArgs& a, TorchSide* torch, const ProductCeiling& ceiling) {
  TrainStep step(a.model, a.batch);
  // The PyTorch mirror at the same shape (tools/torch_bench.py's train_step), in bf16 autocast if asked.
  const json step_args = {{"model",
                           {{"n_layer", a.model.n_layer},
                            {"n_head", a.model.n_head},
                            {"n_embd", a.model.n_embd},
                            {"block_size", a.model.block_size},
                            {"vocab_size", a.model.vocab_size},
                            {"dropout", a.model.dropout},
                            {"bias", a.model.bias},
                            {"attention", a.model.attention},
                            {"gelu", gelu_form_name(a.model.gelu)}}},
                          {"batch", a.batch},
                          {"autocast", a.torch_autocast.empty() ? json(nullptr) : json(a.torch_autocast)}};
  const bool vs = torch != nullptr && torch->ok();
  // PyTorch eager, and with --torch-compile the same step with the model under torch.compile, each a peer.
  std::vector<Peer> peers;
  std::vector<std::string> peer_names;
  for (const auto& [id, workload] :
       {std::pair{"train", "train_step"}, std::pair{"train_compiled", "train_step_compiled"}}) {
    if (!vs || (std::string(id) == "train_compiled" && !a.torch_compile)) continue;
    if (auto name = torch->prepare(id, workload, step_args)) {
      peers.push_back(torch_peer(torch, id));
      peer_names.push_back(*name);
    }
  }
  std::shared_ptr<TimedProduct> ceiling_product;
  if (ceiling.measured()) {
    ceiling_product = std::make_shared<TimedProduct>(ceiling.m, ceiling.k, ceiling.n, ceiling.raw);
    peers.push_back(TimedProduct::own_block_peer(ceiling_product));
  }
  const PeerTimings p = measure_with([&] { step.run(); }, a.rounds, peers);
  for (const char* id : {"train", "train_compiled"})
    if (vs) torch->release(id);
  std::vector<Timing> ts;
  for (size_t i = 0; i < peer_names.size(); ++i) {
    ts.push_back(engine_timing(p, static_cast<int>(i)));
    ts.back().peer = peer_names[i];
  }
  // share = (step flops / step ms) / (product flops / product ms), per block: the flops' ratio over the per-block
  // time ratio step / product, whose median measure_with gives.
  const std::optional<double> time_ratio = ceiling_product ? p.ratio.back() : std::nullopt;
  const double alternated_share = time_ratio ? step.nominal_flops() / ceiling_product->flops() / *time_ratio : NAN;
  const double ceiling_now =
      ceiling_product && p.peer_ms.back() ? ceiling_product->flops() / *p.peer_ms.back() / 1e6 : NAN;
  const Timing t = ts.empty() ? engine_timing(p, -1) : ts.front();
  const double tokens = static_cast<double>(step.batch * step.cfg.block_size);
  const double gflops = step.nominal_flops() / t.ms / 1e6;
  out.print(
      "training step: {} attention, {} parameters, {} layers, {} heads, {} wide, context {}, batch {}; "
      "forward + backward + clipping + AdamW, products in {}\n",
      step.cfg.attention, step.model.num_parameters(), step.cfg.n_layer, step.cfg.n_head, step.cfg.n_embd,
      step.cfg.block_size, step.batch, precision_name(product_precision()));
  out.print("  {:.2f} ms/step, {:.0f} tokens/s; {:.2f} GFLOP per step (nominal) → {:.1f} GFLOP/s{}\n", t.ms,
            tokens / t.ms * 1000, step.nominal_flops() / 1e9, gflops,
            !ceiling.measured() ? std::string(" (no product ceiling: the matmul section did not run)")
                                : fmt::format(" = {:.0f}% of the product ceiling {:.1f}", 100 * gflops / ceiling.gflops,
                                              ceiling.gflops));
  if (!std::isnan(alternated_share))
    out.print(
        "  against the ceiling's product {}, timed in turn with the step ({:.1f} GFLOP/s in these blocks): "
        "{:.0f}% (median of the per-block shares)\n",
        ceiling.name(), ceiling_now, 100 * alternated_share);
  if (torch != nullptr && ts.empty()) out.print("  PyTorch —\n");
  for (const Timing& pt : ts) {
    if (pt.torch_ms)
      out.print("  PyTorch ({}) {:.2f} ms/step, {:.0f} tokens/s; ratio tapegrad / PyTorch {:.2f}×\n", pt.peer,
                *pt.torch_ms, tokens / *pt.torch_ms * 1000, *pt.ratio);
    else out.print("  PyTorch ({}) —\n", pt.peer);
  }
  out.print("\n");
  const std::string shape =
      fmt::format("B={} T={} C={} L={}", step.batch, step.cfg.block_size, step.cfg.n_embd, step.cfg.n_layer);
  for (size_t i = 0; i < std::max<size_t>(ts.size(), 1); ++i) {
    json& r = out.row(i == 0 ? "train_step" : "train_step " + ts[i].peer, shape, t.ms, ts.empty() ? &t : &ts[i],
                      std::nullopt, gflops);
    r["tokens_per_s"] = tokens / t.ms * 1000;
    r["product_ceiling_gflops"] = ceiling.measured() ? json(ceiling.gflops) : json(nullptr);
    r["share_of_product_ceiling"] = ceiling.measured() ? json(gflops / ceiling.gflops) : json(nullptr);
    r["ceiling_product"] = ceiling.measured() ? json(ceiling.name()) : json(nullptr);
    r["ceiling_product_gflops_alternated"] = std::isnan(ceiling_now) ? json(nullptr) : json(ceiling_now);
    r["share_of_ceiling_alternated"] = std::isnan(alternated_share) ? json(nullptr) : json(alternated_share);
    r["precision"] = precision_name(product_precision());
    r["torch_autocast"] = a.torch_autocast.empty() ? json(nullptr) : json(a.torch_autocast);
  }
}

void peak_rss_section(Output& out, const BenchArgs& a, TorchSide* torch) {
  const int steps = a.quick ? 5 : 200;
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("tapegrad-bench-{}", getpid());
  fs::create_directories(dir);
  // The child reads its own VmHWM: a spawned child's ru_maxrss also counts the parent's peak (posix_spawn shares
  // the parent's memory until exec, and exec folds that memory's high-water mark into the child's).
  ChildResult ours =
      run_child({"/proc/self/exe", "bench", "--child-train", std::to_string(steps), "--child-dir", dir.string(),
                 "--threads", std::to_string(num_threads()), "--precision", precision_name(product_precision())});
  int64_t ours_kb = -1;
  try {
    if (ours.status == 0) ours_kb = json::parse(ours.out)["vmhwm_kb"].get<int64_t>();
  } catch (const std::exception&) {}
  std::error_code ec;
  fs::remove_all(dir, ec);
  std::optional<int64_t> theirs;
  if (torch && torch->ok()) {
    ChildResult t = run_child({a.python, a.torch_script, "train-rss", "--steps", std::to_string(steps), "--threads",
                               std::to_string(num_threads())},
                              {}, a.torch_timeout);
    try {
      if (t.status == 0) theirs = json::parse(t.out)["vmhwm_kb"].get<int64_t>() * 1024;
    } catch (const std::exception&) {}
  }
  const int64_t ours_bytes = ours_kb * 1024;
  out.print("peak RSS of a {}-step training run (a child process, its VmHWM): tapegrad {}{}\n", steps, mib(ours_bytes),
            ours_kb >= 0 ? "" : fmt::format(" (the training child failed: exit {})", ours.status));
  if (torch) {
    if (theirs)
      out.print("  PyTorch {}; ratio tapegrad / PyTorch {:.2f}×\n", mib(*theirs),
                static_cast<double>(ours_bytes) / static_cast<double>(*theirs));
    else out.print("  PyTorch —\n");
  }
  out.print("\n");
  Timing t;
  json& r = out.row("peak_rss_train", fmt::format("{} steps", steps), NAN, &t, std::nullopt, std::nullopt);
  r["peak_rss_bytes"] = ours_bytes;
  r["torch_peak_rss_bytes"] = theirs ? json(*theirs) : json(nullptr);
  r["ratio"] = theirs ? json(static_cast<double>(ours_bytes) / static_cast<double>(*theirs)) : json(nullptr);
}

void memory_section(Output& out, const BenchArgs& a) {
  std::vector<AttentionShape> shapes{{1, 8, 1024, 64}, {1, 8, 4096, 64}};
  if (a.quick) shapes = {{1, 8, 256, 64}};
  out.print(
      "memory (issue 3): bytes each node keeps for backward, and the peak RSS of one forward + backward in a "
      "fresh process\n");
  out.print("  {:<17} {:<16} {:>12} {:>12} {:>14}\n", "node", "(B, h, T, d)", "kept", "peak RSS", "above start");
  for (const AttentionShape& s : shapes)
    for (const std::string& node : attention_nodes()) {
      const std::string spec = fmt::format("{},{},{},{},{}", node, s.B, s.H, s.T, s.d);
      ChildResult c =
          run_child({"/proc/self/exe", "bench", "--child-memory", spec, "--threads", std::to_string(num_threads())});
      int64_t kept = -1, hwm = -1, start = -1;
      try {
        json j = json::parse(c.out);
        kept = j["bytes_kept"].get<int64_t>();
        hwm = j["vmhwm_kb"].get<int64_t>() * 1024;
        start = j["vmrss_start_kb"].get<int64_t>() * 1024;
      } catch (const std::exception&) {}
      if (kept < 0) {
        out.print("  {:<17} {:<16} failed (exit {})\n", node, s.str(), c.status);
        continue;
      }
      out.print("  {:<17} {:<16} {:>12} {:>12} {:>14}\n", node, s.str(), mib(kept), mib(hwm), mib(hwm - start));
      json& r = out.row("memory " + node, s.str(), NAN, nullptr, kept, std::nullopt);
      r["peak_rss_bytes"] = hwm;
      r["rss_start_bytes"] = start;
    }
  out.print("\n");
}

// The --child-memory process: inputs made, RSS noted, one forward + backward, peak RSS printed as JSON.
void child_memory(const std::string& spec) {
  std::vector<std::string> parts;
  std::stringstream ss(spec);
  for (std::string p; std::getline(ss, p, ',');) parts.push_back(p);
  if (parts.size() != 5) fail("bench: --child-memory wants NODE,B,H,T,D, got '{}'", spec);
  const AttentionShape s{std::stoll(parts[1]), std::stoll(parts[2]), std::stoll(parts[3]), std::stoll(parts[4])};
  AttentionRun run(parts[0], s);
  const int64_t start = proc_status_kb("VmRSS");
  Var qv = run.tape.leaf(run.q), kv = run.tape.leaf(run.k), vv = run.tape.leaf(run.v);
  const size_t before = run.tape.arena().bytes_in_use();
  Var y = apply_node(parts[0], qv, kv, vv);
  const auto kept = static_cast<int64_t>(run.tape.arena().bytes_in_use() - before);
  run.tape.backward(y, run.g);
  fmt::print("{}\n",
             json{{"bytes_kept", kept}, {"vmhwm_kb", proc_status_kb("VmHWM")}, {"vmrss_start_kb", start}}.dump());
}

// The --child-train process: what `tapegrad train --max-iters N --eval-interval N --eval-iters 2 --sample-tokens 0
// -q` runs, then its peak RSS printed as JSON.
void child_train(int64_t steps, const std::string& dir) {
  TrainConfig c;
  c.loop.max_steps = steps;
  c.loop.eval_interval = steps;
  c.eval_iters = 2;
  c.sample_tokens = 0;
  c.loop.quiet = true;
  c.out_dir = dir;
  c.precision = product_precision();
  train(c, stderr);
  fmt::print("{}\n", json{{"vmhwm_kb", proc_status_kb("VmHWM")}}.dump());
}

void run_bench(BenchArgs a) {
  if (a.threads > 0) set_num_threads(a.threads);
  const PrecisionScope precision(a.precision);  // refuses bf16 where the CPU has no bf16 units
  if (!a.child_memory.empty()) return child_memory(a.child_memory);
  if (a.child_train > 0) return child_train(a.child_train, a.child_dir);
  if (a.rounds <= 0) a.rounds = a.quick ? 2 : 10;
  if (a.quick) g_block_ms = 5;
  Output out{a.json};
  std::unique_ptr<TorchSide> torch;
  if (a.vs_torch && a.torch_script.empty()) a.torch_script = shared_file("tools/torch_bench.py");
  if (a.vs_torch) {
    torch = std::make_unique<TorchSide>(a, num_threads());
    if (!torch->ok()) fail("bench --vs-torch: PyTorch is not available: {}", torch->why());
  }
  // --profile runs the profile alone, or with the sections --only names; the profile is not among the defaults.
  if (a.profile && std::find(a.only.begin(), a.only.end(), "profile") == a.only.end()) a.only.push_back("profile");
  auto wanted = [&](const std::string& section) {
    if (a.only.empty()) return section != "profile";
    return std::find(a.only.begin(), a.only.end(), section) != a.only.end();
  };
  const bool steps = wanted("training") || wanted("products") || wanted("hvp") || wanted("profile");
  header(out, a, torch.get(), steps);
  if (steps || wanted("matmul") || wanted("attention")) warm_up_cores(a.quick ? 20 : 500);
  const ProductCeiling ceiling = wanted("matmul") ? matmul_section(out, a, torch.get()) : ProductCeiling{};
  if (wanted("attention")) attention_section(out, a, torch.get(), ceiling.gflops);
  if (wanted("training")) training_section(out, a, torch.get(), ceiling);
  if (wanted("products")) products_section(out, a);
  if (wanted("hvp")) curvature_section(out, a, torch.get());
  if (wanted("rss")) peak_rss_section(out, a, torch.get());
  if (wanted("memory")) memory_section(out, a);
  if (wanted("profile")) profile_section(out, a);
  if (a.json) fmt::print("{}\n", json{{"header", out.header}, {"rows", out.rows}}.dump(2));
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Measure matmul, the attention nodes, a training step, a Hessian-vector product and peak memory; --vs-torch runs "
      "PyTorch alongside");
  cmd->add_flag("--quick", args->quick, "Fewer rounds and smaller shapes: checks that the bench runs, in seconds");
  cmd->add_flag("--json", args->json,
                "Print JSON: {header: {machine, threads, blas (the core in use), torch}, rows: [{workload, shape, "
                "tapegrad_ms, torch_ms, ratio, torch_peer, bytes_saved, gflops}, ...]}");
  cmd->add_flag(
      "--vs-torch", args->vs_torch,
      "Run every workload in PyTorch too (tools/torch_bench.py), alternating, with the ratio tapegrad / PyTorch; "
      "fails when PyTorch cannot be started");
  cmd->add_option(
         "--threads", args->threads,
         fmt::format("Threads for tapegrad and PyTorch, at most {} (default: the CPUs available)", kMaxThreads))
      ->check(positive())
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            double n = 0;
            try {
              n = std::stod(s);
            } catch (const std::exception&) {
              return {};  // not a number: CLI11's conversion says so
            }
            if (n > kMaxThreads)
              return fmt::format("must be at most {} (the engine's pool takes at most {} threads), got {}", kMaxThreads,
                                 kMaxThreads, s);
            return {};
          },
          "", ""));
  cmd->add_option("--rounds", args->rounds, "Timed blocks per workload (default 10, 2 with --quick)")
      ->check(positive());
  cmd->add_option("--only", args->only, "Run only these sections (default: all)")
      ->check(CLI::IsMember({"matmul", "attention", "training", "products", "hvp", "rss", "memory", "profile"}))
      ->delimiter(',');
  cmd->add_flag("--profile", args->profile,
                "Profile the training step op by op on 1 thread and on --threads (alone, or with the --only sections)");
  cmd->add_flag("--torch-compile", args->torch_compile,
                "With --vs-torch: time PyTorch's training step under torch.compile too (PyTorch 2.0 and later)");
  cmd->add_option("--python", args->python, "Python with PyTorch for --vs-torch: a path, or a name found on PATH")
      ->capture_default_str();
  cmd->add_option("--torch-script", args->torch_script,
                  "The PyTorch side of --vs-torch (default: tools/torch_bench.py of tapegrad's share folder)");
  cmd->add_option("--torch-timeout", args->torch_timeout,
                  "Seconds the PyTorch side may take to answer one request (start-up, one workload's block, the "
                  "peak-RSS run); past it the bench stops it and fails")
      ->capture_default_str()
      ->check(positive());
  add_model_options(cmd, args->model, true, "Training step, hvp and profile: ");
  cmd->add_option("--batch-size", args->batch, "Training step, hvp and profile: sequences per step")
      ->capture_default_str()
      ->check(positive());
  add_precision_option(cmd, args->precision);
  cmd->add_option("--torch-autocast", args->torch_autocast,
                  "With --vs-torch: PyTorch's training step under torch.autocast(\"cpu\", torch.bfloat16), the peer "
                  "of --precision bf16")
      ->check(CLI::IsMember({"bf16"}));
  cmd->add_option("--child-memory", args->child_memory, "Internal: one attention forward + backward, NODE,B,H,T,D")
      ->group("");
  cmd->add_option("--child-train", args->child_train, "Internal: a training run of N steps")->group("");
  cmd->add_option("--child-dir", args->child_dir, "Internal: its run directory")->group("");
  cmd->callback([args] { run_bench(*args); });
}

}  // namespace tapegrad::cli
