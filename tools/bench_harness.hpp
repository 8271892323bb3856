// What tapegrad bench measures with: block timing that alternates the engine with its peers (raw sgemm, PyTorch),
// the PyTorch process it speaks to, child processes for peak RSS, and the table / JSON output.
//
// Timing. Each workload runs once to warm up and to size a block (enough runs for ~40 ms, 5 with --quick), then
// `rounds` blocks; a figure is the median over the blocks of the block's time per run. With peers, each engine
// block is followed by one block of each peer, of the same workload and size, so all see the same state of the
// machine; a ratio is the median of the per-block ratios engine / peer.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "ops/products/products.hpp"
#include "engine/tensor.hpp"
#include "models/gpt.hpp"
#include "models/stats.hpp"

namespace tapegrad::cli::bench {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct BenchArgs {
  bool quick = false, json = false, vs_torch = false, torch_compile = false, profile = false;
  int threads = 0;  // 0: the engine's default
  int rounds = 0;   // 0: 10 (2 with --quick)
  std::string python = "/usr/bin/python3";
  std::string torch_script;       // empty: the shipped tools/torch_bench.py (models/files.hpp's shared_file)
  double torch_timeout = 600;     // seconds the PyTorch side may take to answer one request (--torch-timeout)
  std::string child_memory;       // internal: one forward + backward in a fresh process, for its peak RSS
  int64_t child_train = 0;        // internal: a training run of this many steps in a fresh process, for its peak RSS
  std::string child_dir;          // its run directory
  std::vector<std::string> only;  // sections to run; empty: all
  GPTConfig model;                // the training step's and the profile's model
  int64_t batch = 12;             // and its batch
  ProductPrecision precision = ProductPrecision::f32;
  std::string torch_autocast;  // "bf16": PyTorch's training step under torch.autocast("cpu", torch.bfloat16)
};

double ms_since(Clock::time_point t0);

// ---- the machine ----------------------------------------------------------------------------------------------

int64_t proc_status_kb(const std::string& key);  // "VmHWM", "VmRSS", ... of /proc/self/status in kB; 0 if absent
std::string first_line_with(const std::string& path, const std::string& key);  // the value after "key ...:"
std::vector<std::string> mapped_libraries(const std::string& part);  // shared objects mapped whose path has `part`
std::string load_average();

// ---- child processes ------------------------------------------------------------------------------------------

struct ChildResult {
  int status = -1;
  std::string out;  // its standard output
};
// `argv` run to its end, its standard output read. With timeout_s > 0, a child that has not ended by then is killed
// and an Error names it.
ChildResult run_child(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env = {},
                      double timeout_s = 0);

// ---- the PyTorch side -----------------------------------------------------------------------------------------

// tools/torch_bench.py serve, spoken to in JSON lines through two pipes. info() holds its answer to "info":
// PyTorch's version, threads, BLAS, whether it has scaled_dot_product_attention and torch.compile.
// Each answer must come within BenchArgs::torch_timeout seconds: a script that hangs (or takes longer) is killed and
// the bench stops with an Error naming the request and --torch-timeout.
class TorchSide {
 public:
  TorchSide(const BenchArgs& a, int threads);
  ~TorchSide();
  TorchSide(const TorchSide&) = delete;
  TorchSide& operator=(const TorchSide&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  const json& info() const { return info_; }

  // Builds a workload under `id`; returns what PyTorch will time for it (its "peer"), or nothing if it failed.
  std::optional<std::string> prepare(const std::string& id, const std::string& workload, const json& args);
  // `warmup` untimed runs, then `reps` timed ones; the time per timed run.
  std::optional<double> run(const std::string& id, int reps, int warmup = 0);
  void release(const std::string& id);

 private:
  json ask(const json& cmd);
  bool report(const json& a);

  // The answer line, read within the timeout; throws after killing the process when none comes.
  std::string read_line(const std::string& request);
  void stop_process();

  pid_t pid_ = 0;
  FILE* to_ = nullptr;
  int from_ = -1;
  std::string pending_;  // bytes read past the last answer line
  std::string script_;   // for messages
  double timeout_s_ = 600;
  bool ok_ = false;
  std::string why_;
  json info_;
};

// ---- timing ---------------------------------------------------------------------------------------------------

struct Timing {
  double ms = NAN;                        // tapegrad, per run
  std::optional<double> torch_ms, ratio;  // PyTorch per run; median of the per-block ratios
  std::string peer;                       // what PyTorch ran ("" when it did not)
};

inline double g_block_ms = 40;  // a block's length: long against timer and wake-up noise, short against drift
// The pause before a block that follows the engine's or PyTorch's: their threads poll for up to milliseconds.
constexpr int kSettleMs = 30;

// Something timed block by block in turn with the engine: `warmup` untimed runs, then `reps` timed ones; returns
// the ms per timed run (nothing if it failed). `settle_ms`: how long its threads keep polling after a block.
struct Peer {
  std::function<std::optional<double>(int reps, int warmup)> run;
  int settle_ms = kSettleMs;
};

struct PeerTimings {
  double ms = NAN;                                    // the engine, per run
  std::vector<std::optional<double>> peer_ms, ratio;  // per peer: ms per run, median of the per-block ratios
};

PeerTimings measure_with(const std::function<void()>& run, int rounds, const std::vector<Peer>& peers);
Peer torch_peer(TorchSide* torch, const std::string& id);
// The engine's figures, with PyTorch's from peer `torch_index` (negative: none).
Timing engine_timing(const PeerTimings& p, int torch_index);
// The engine's timing of `run`, alternating with PyTorch's workload (prepared by the caller as `id`) when `torch`
// is given.
Timing measure(const std::function<void()>& run, int rounds, TorchSide* torch = nullptr, const std::string& id = "");

// ---- output ---------------------------------------------------------------------------------------------------

// The table on stdout, or with --json one object {"header": {...}, "rows": [...]} at the end: the header holds the
// machine, the threads, the BLAS core in use (blas_json) and PyTorch's side.
struct Output {
  bool json_mode;
  json header = json::object();
  json rows = json::array();

  template <class... Args>
  void print(fmt::format_string<Args...> f, Args&&... args) {
    if (!json_mode) {
      fmt::print(f, std::forward<Args>(args)...);
      std::fflush(stdout);
    }
  }
  // Adds a row {workload, shape, tapegrad_ms, torch_ms, ratio, torch_peer, bytes_saved, gflops}.
  json& row(const std::string& workload, const std::string& shape, double tapegrad_ms, const Timing* t,
            std::optional<int64_t> bytes_saved, std::optional<double> gflops);
};

std::string torch_cells(const Timing& t, bool vs_torch);
std::string mib(int64_t bytes);
Tensor random_tensor(Shape shape, uint64_t seed, double scale = 1.0);

}  // namespace tapegrad::cli::bench
