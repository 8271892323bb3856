// tapegrad bench's matmul section: the default model's products and two square ones through the engine's matmul
// node, next to a raw cblas_sgemm on OpenBLAS' own threads and, with --vs-torch, PyTorch's matmul; the best rate
// of the section is the run's product ceiling, which the attention and training sections measure against.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "engine/parallel.hpp"
#include "ops/ops.hpp"
#include "ops/products/blas.hpp"
#include "tools/bench_harness.hpp"
#include "tools/bench_workloads.hpp"

namespace tapegrad::cli::bench {

TimedProduct::TimedProduct(int64_t m_, int64_t k_, int64_t n_, bool raw_)
    : m(m_),
      k(k_),
      n(n_),
      raw(raw_),
      x(random_tensor({m_, k_}, 21)),
      w(random_tensor({k_, n_}, 22)),
      c(Tensor::empty(DType::f32, {m_, n_})) {}

void TimedProduct::once() {
  if (raw) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, x.data<float>(), static_cast<int>(k), w.data<float>(), static_cast<int>(n),
                0.0f, c.data<float>(), static_cast<int>(n));
  } else {
    tape.clear();
    matmul(tape.constant(x), tape.constant(w));
  }
}

double TimedProduct::run(int reps, int warmup) {
  if (raw) openblas_set_num_threads(num_threads());
  for (int i = 0; i < warmup; ++i) once();
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) once();
  const double ms = ms_since(t0) / reps;
  if (raw) openblas_set_num_threads(1);
  return ms;
}

Peer TimedProduct::same_size_peer(std::shared_ptr<TimedProduct> p) {
  return {[p](int reps, int warmup) -> std::optional<double> { return p->run(reps, warmup); }, 200};
}

Peer TimedProduct::own_block_peer(std::shared_ptr<TimedProduct> p) {
  return {[p](int, int) -> std::optional<double> {
            const double one = std::max(p->run(1, 0), 1e-3);  // on the threads the block runs on
            return p->run(std::clamp(static_cast<int>(g_block_ms / one), 1, 100000),
                          std::clamp(static_cast<int>(10 / one), 1, 100000));
          },
          p->raw ? 200 : 1};
}

ProductCeiling matmul_section(Output& out, const BenchArgs& a, TorchSide* torch) {
  struct Mm {
    int64_t m, k, n;
    const char* what;
  };
  std::vector<Mm> shapes{{768, 128, 384, "c_attn"},     {768, 128, 128, "attn c_proj"}, {768, 128, 512, "c_fc"},
                         {768, 512, 128, "mlp c_proj"}, {768, 128, 65, "head"},         {512, 512, 512, "512³"},
                         {2048, 2048, 2048, "2048³"}};
  if (a.quick) shapes.pop_back();
  const bool vs = torch != nullptr;
  out.print(
      "matmul: engine (tape + matmul node, pool of {} threads, products in {} on the backend named) vs raw "
      "cblas_sgemm (OpenBLAS' own {} threads, f32), alternating; ratio = median of the per-block ratios "
      "engine / sgemm\n",
      num_threads(), precision_name(product_precision()), num_threads());
  out.print("  {:<12} {:<16} {:<9} {:>9} {:>7} {:>9} {:>7} {:>9}{}\n", "", "(m, k, n)", "backend", "engine ms",
            "GFLOP/s", "sgemm ms", "GFLOP/s", "ratio", vs ? fmt::format("  {:>9} {:>7}", "torch ms", "ratio") : "");
  ProductCeiling ceiling;
  ceiling.gflops = 0;
  int id = 0;
  for (const Mm& s : shapes) {
    TimedProduct engine_side(s.m, s.k, s.n, false);
    auto raw = std::make_shared<TimedProduct>(s.m, s.k, s.n, true);
    const std::string tid = fmt::format("mm{}", id++);
    const auto torch_peer_name = vs && torch->ok() ? torch->prepare(tid, "matmul", {s.m, s.k, s.n}) : std::nullopt;
    const bool torch_ready = torch_peer_name.has_value();
    std::vector<Peer> peers{TimedProduct::same_size_peer(raw)};
    if (torch_ready) peers.push_back(torch_peer(torch, tid));
    const PeerTimings p = measure_with([&] { engine_side.once(); }, a.rounds, peers);
    if (torch_ready) torch->release(tid);
    Timing engine = engine_timing(p, torch_ready ? 1 : -1);
    engine.peer = torch_peer_name.value_or("");
    const double raw_ms = p.peer_ms[0].value_or(NAN), overhead = p.ratio[0].value_or(NAN);
    const double gf_engine = engine_side.flops() / engine.ms / 1e6, gf_raw = engine_side.flops() / raw_ms / 1e6;
    for (const auto& [gf, is_raw] : {std::pair{gf_engine, false}, std::pair{gf_raw, true}})
      if (gf > ceiling.gflops) ceiling = {gf, s.m, s.k, s.n, is_raw};
    const std::string shape = fmt::format("({}, {}, {})", s.m, s.k, s.n);
    const blas_detail::Route via = blas_detail::route<float>(s.m, s.n, s.k, false);  // the matmul node: A as is
    const std::string backend = via == blas_detail::Route::onednn_bf16  ? "oneDNN bf16"
                                : via == blas_detail::Route::small_bf16 ? "engine bf16"
                                                                        : backend_name(product_backend(s.m, s.n, s.k));
    out.print("  {:<12} {:<16} {:<9} {:>9.3f} {:>7.1f} {:>9.3f} {:>7.1f} {:>8.3f}×{}\n", s.what, shape, backend,
              engine.ms, gf_engine, raw_ms, gf_raw, overhead, torch_cells(engine, vs));
    json& r = out.row("matmul", shape, engine.ms, &engine, std::nullopt, gf_engine);
    r["backend"] = backend;
    r["sgemm_ms"] = raw_ms;
    r["vs_sgemm"] = overhead;
  }
  out.print("  product ceiling (best GFLOP/s above, engine or raw): {:.1f}, {}\n\n", ceiling.gflops, ceiling.name());
  return ceiling;
}

}  // namespace tapegrad::cli::bench
