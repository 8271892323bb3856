// tapegrad bench, section "products": the matrix products of one training step, shape by shape, each against its
// own ceiling measured in the same run, so that a reader sees which products are far from the units.
//
// The step's products are read through a ProductLog (ops/products/products.hpp) over a few steps: per shape (m, k, n,
// the transposes, whether the pool split it, f32 or bf16), the calls per step and their time. A split product's
// time is its wall time on all the threads; a product run whole inside an op's parallel loop is timed on its own
// thread while the other threads run products of their own, so its rate is one thread's.
//
// The ceiling of a shape is the best rate of the same product alone, in the same precision, on the threads it had:
//   split:  the engine's own gemm (the pool), oneDNN on an OpenMP team of all the threads, and for f32 OpenBLAS on
//           its own threads;
//   whole:  oneDNN on one thread, and for f32 OpenBLAS on one thread.
// bf16 ceilings are taken on operands already rounded (the units' pace); the step's bf16 products include their
// rounding, which is part of what the step pays.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include <cblas.h>

#include "ops/products/blas.hpp"
#include "ops/products/onednn_gemm.hpp"
#include "engine/parallel.hpp"
#include "tools/bench_workloads.hpp"

namespace tapegrad::cli::bench {

namespace {

struct ShapeKey {
  int64_t m, k, n;
  bool trans_a, trans_b, split, bf16;
  auto operator<=>(const ShapeKey&) const = default;
};

struct Calls {
  int64_t calls = 0;
  double seconds = 0;
};

class StepProducts : public ProductLog {
 public:
  void record(const ProductRun& r) override {
    std::lock_guard lock(mutex_);
    Calls& c = by_shape_[{r.m, r.k, r.n, r.trans_a, r.trans_b, r.split, r.bf16}];
    ++c.calls;
    c.seconds += r.seconds;
  }
  std::map<ShapeKey, Calls> by_shape() const { return by_shape_; }

 private:
  std::mutex mutex_;
  std::map<ShapeKey, Calls> by_shape_;
};

struct Ceiling {
  double gflops = 0;
  std::string by;  // which of the candidates reached it
};

Ceiling ceiling_of(const ShapeKey& s, int rounds) {
  const int threads = s.split ? num_threads() : 1;
  // op(A) (m, k) stored (m, k), or (k, m) when transposed; op(B) (k, n) stored (k, n) or (n, k).
  const int64_t lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n;
  Tensor a = random_tensor({s.trans_a ? s.k : s.m, lda}, 31), b = random_tensor({s.trans_b ? s.n : s.k, ldb}, 32);
  Tensor c = Tensor::empty(DType::f32, {s.m, s.n});
  const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
  Ceiling best;
  auto consider = [&](const std::string& by, const std::function<void()>& call) {
    const double gf = flops / measure(call, rounds).ms / 1e6;
    if (gf > best.gflops) best = {gf, by};
  };
  const float* ap = a.data<float>();
  const float* bp = b.data<float>();
  float* cp = c.data<float>();
  // The engine's product, in the step's precision: on the pool where the step split it, else on this thread (a
  // product the step ran whole but that gemm() would split here is left to the libraries' single-thread rates).
  if (s.split || !blas_detail::splits(s.m, s.n, s.k)) {
    const PrecisionScope precision(s.bf16 ? ProductPrecision::bf16 : ProductPrecision::f32);
    consider(s.split ? "engine" : "engine, 1 thr", [&] {
      gemm(s.m, s.n, s.k, 1.0f, MatrixOperand<float>{ap, lda, s.trans_a}, MatrixOperand<float>{bp, ldb, s.trans_b},
           0.0f, cp, s.n);
    });
  }
  if (!s.bf16) {
    consider(fmt::format("OpenBLAS, {} thr", threads), [&] {
      openblas_set_num_threads(threads);
      cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans,
                  static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, ap, static_cast<int>(lda),
                  bp, static_cast<int>(ldb), 0.0f, cp, static_cast<int>(s.n));
      openblas_set_num_threads(1);
    });
  }
  if (onednn_built()) {
    if (s.bf16) {
      std::vector<uint16_t> a16(static_cast<size_t>(a.numel())), b16(static_cast<size_t>(b.numel()));
      onednn_detail::round_to_bf16_rows(a16.data(), ap, 1, a.numel(), a.numel());
      onednn_detail::round_to_bf16_rows(b16.data(), bp, 1, b.numel(), b.numel());
      consider(fmt::format("oneDNN, {} thr", threads), [&] {
        onednn_detail::team_bf16_gemm(threads, s.trans_a, s.trans_b, s.m, s.n, s.k, a16.data(), lda, b16.data(), ldb,
                                      cp, s.n);
      });
    } else if (onednn_detail::team_sgemm(threads, s.trans_a, s.trans_b, s.m, s.n, s.k, ap, lda, bp, ldb, cp, s.n)) {
      consider(fmt::format("oneDNN, {} thr", threads), [&] {
        onednn_detail::team_sgemm(threads, s.trans_a, s.trans_b, s.m, s.n, s.k, ap, lda, bp, ldb, cp, s.n);
      });
    }
  }
  return best;
}

}  // namespace

void products_section(Output& out, const BenchArgs& a) {
  const int steps = a.quick ? 2 : 5;
  TrainStep step(a.model, a.batch);
  for (int i = 0; i < 2; ++i) step.run();  // warm-up: the arena's pages, oneDNN's primitives
  StepProducts log;
  set_product_log(&log);
  try {
    for (int i = 0; i < steps; ++i) step.run();
  } catch (...) {
    set_product_log(nullptr);
    throw;
  }
  set_product_log(nullptr);

  const std::string shape =
      fmt::format("B={} T={} C={} L={}", a.batch, a.model.block_size, a.model.n_embd, a.model.n_layer);
  out.print(
      "products of the training step ({}; {} attention; products in {}; {} threads): per shape, GFLOP/s in the "
      "step against the ceiling of that shape alone in this run (the best of the engine's product, oneDNN on "
      "its own threads and, in f32, OpenBLAS on its own threads; a product run whole inside an op's loop "
      "against one thread)\n",
      shape, a.model.attention, precision_name(product_precision()), num_threads());
  out.print("  {:<18} {:<5} {:<6} {:>6} {:>9} {:>8} {:>8} {:<18} {:>6}\n", "(m, k, n)", "op", "run", "calls", "ms/step",
            "GFLOP/s", "ceiling", "reached by", "share");
  const int rounds = a.quick ? 3 : 5;
  double step_ms = 0, ideal_ms = 0;
  struct Row {
    ShapeKey s;
    Calls c;
    double ms, gflops;
    Ceiling ceiling;
  };
  std::vector<Row> rows;
  for (const auto& [s, c] : log.by_shape()) {
    const double ms = 1e3 * c.seconds / steps;
    const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k) *
                         static_cast<double>(c.calls) / steps;
    // A product inside a loop ran beside num_threads() − 1 others: its ms are one thread's, a 1/N share of the step.
    const double wall_ms = s.split ? ms : ms / num_threads();
    rows.push_back({s, c, wall_ms, flops / ms / 1e6, ceiling_of(s, rounds)});
    step_ms += wall_ms;
    ideal_ms += wall_ms * rows.back().gflops / rows.back().ceiling.gflops;
  }
  std::sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) { return x.ms > y.ms; });
  for (const Row& r : rows) {
    const std::string mkn = fmt::format("({}, {}, {})", r.s.m, r.s.k, r.s.n);
    const std::string op = fmt::format("{}{}", r.s.trans_a ? "Aᵀ" : "A", r.s.trans_b ? "Bᵀ" : "B");
    const std::string run = fmt::format("{}{}", r.s.split ? "split" : "whole", r.s.bf16 ? " bf16" : "");
    out.print("  {:<18} {:<5} {:<6} {:>6.4g} {:>9.3f} {:>8.1f} {:>8.1f} {:<18} {:>5.0f}%\n", mkn, op, run,
              static_cast<double>(r.c.calls) / steps, r.ms, r.gflops, r.ceiling.gflops, r.ceiling.by,
              100 * r.gflops / r.ceiling.gflops);
    json& row = out.row("step product " + mkn + " " + op, shape, r.ms, nullptr, std::nullopt, r.gflops);
    row["m"] = r.s.m, row["k"] = r.s.k, row["n"] = r.s.n;
    row["trans_a"] = r.s.trans_a, row["trans_b"] = r.s.trans_b;
    row["split"] = r.s.split;
    row["precision"] = r.s.bf16 ? "bf16" : "f32";
    row["calls_per_step"] = static_cast<double>(r.c.calls) / steps;
    row["ceiling_gflops"] = r.ceiling.gflops;
    row["ceiling_by"] = r.ceiling.by;
    row["share_of_ceiling"] = r.gflops / r.ceiling.gflops;
  }
  out.print("  the step's products: {:.2f} ms a step; at their ceilings {:.2f} ms: {:.0f}% of the ceilings\n\n",
            step_ms, ideal_ms, 100 * ideal_ms / step_ms);
  json& sum = out.row("step products", shape, step_ms, nullptr, std::nullopt, std::nullopt);
  sum["at_ceilings_ms"] = ideal_ms;
  sum["share_of_ceilings"] = ideal_ms / step_ms;
  sum["threads"] = num_threads();
}

}  // namespace tapegrad::cli::bench
