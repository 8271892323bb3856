// tapegrad bench: the engine's speed and memory on this machine, optionally side by side with PyTorch.
//
// Sections: matmul through the engine next to a raw cblas_sgemm; each attention node forward and forward +
// backward with the bytes it keeps; one training step of the default model; the peak RSS of a 200-step training
// run; issue 3's memory table (bytes kept and peak RSS of one forward + backward at long contexts).
//
// Timing. Each workload runs once to warm up and to size a block (enough runs for ~40 ms, 5 with --quick), then
// `rounds` blocks; a figure is the median over the blocks of the block's time per run. With --vs-torch, tools/torch_bench.py
// runs in a child process and each tapegrad block is followed by a PyTorch block of the same workload and size,
// so both see the same state of the machine; the ratio is the median of the per-block ratios tapegrad / PyTorch.
// Peak RSS figures come from child processes (their VmHWM), one per measurement, since a process' peak never
// goes down.
#include <sys/wait.h>
#include <spawn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <cblas.h>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "engine/blas.hpp"
#include "engine/parallel.hpp"
#include "engine/rng.hpp"
#include "models/gpt.hpp"
#include "models/optim.hpp"
#include "models/trainer.hpp"
#include "ops/attention.hpp"
#include "ops/ops.hpp"
#include "tools/commands.hpp"

extern char** environ;

#ifndef TAPEGRAD_SOURCE_DIR
#define TAPEGRAD_SOURCE_DIR "."
#endif

namespace tapegrad::cli {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct BenchArgs {
  bool quick = false, json = false, vs_torch = false;
  int threads = 0;  // 0: the engine's default
  int rounds = 0;   // 0: 10 (3 with --quick)
  std::string python = "/usr/bin/python3";
  std::string torch_script = std::string(TAPEGRAD_SOURCE_DIR) + "/tools/torch_bench.py";
  std::string child_memory;  // internal: one forward + backward in a fresh process, for its peak RSS
  int64_t child_train = 0;    // internal: a training run of this many steps in a fresh process, for its peak RSS
  std::string child_dir;      // its run directory
  std::vector<std::string> only;  // sections to run; empty: all
};

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// "VmHWM", "VmRSS", ... of /proc/self/status in kB; 0 if absent.
int64_t proc_status_kb(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1));
  return 0;
}

std::string first_line_with(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) {
      auto colon = line.find(':');
      std::string v = colon == std::string::npos ? line : line.substr(colon + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  return "?";
}

// The shared objects of this process whose path contains `part`.
std::vector<std::string> mapped_libraries(const std::string& part) {
  std::ifstream in("/proc/self/maps");
  std::string line;
  std::vector<std::string> found;
  while (std::getline(in, line)) {
    auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    if (path.find(part) != std::string::npos && std::find(found.begin(), found.end(), path) == found.end())
      found.push_back(path);
  }
  return found;
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  in >> a >> b >> c;
  return fmt::format("{:.2f} {:.2f} {:.2f}", a, b, c);
}

// ---- child processes ------------------------------------------------------------------------------------------

struct ChildResult {
  int status = -1;
  std::string out;  // its standard output; children that report a peak RSS read their own VmHWM (see peak_rss_section)
};

ChildResult run_child(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env = {}) {
  ChildResult r;
  int pipe_fd[2];
  if (pipe(pipe_fd) != 0) fail("bench: cannot create a pipe for {}", argv[0]);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fd[1], 1);
  posix_spawn_file_actions_addclose(&actions, pipe_fd[0]);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  for (const auto& e : extra_env) env_strings.push_back(e);
  std::vector<char*> env;
  for (auto& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  pid_t pid = 0;
  const int err = posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fd[1]);
  if (err != 0) {
    close(pipe_fd[0]);
    fail("bench: cannot start {}: {}", argv[0], std::strerror(err));
  }
  char buf[4096];
  for (ssize_t n; (n = read(pipe_fd[0], buf, sizeof buf)) > 0;) r.out.append(buf, static_cast<size_t>(n));
  close(pipe_fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// ---- the PyTorch side -----------------------------------------------------------------------------------------

// tools/torch_bench.py serve, spoken to in JSON lines through two pipes.
class TorchSide {
 public:
  TorchSide(const BenchArgs& a, int threads) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
    posix_spawn_file_actions_addclose(&actions, to_child[1]);
    posix_spawn_file_actions_addclose(&actions, from_child[0]);
    const std::string threads_arg = std::to_string(threads);
    std::vector<std::string> argv{a.python, a.torch_script, "serve", "--threads", threads_arg};
    std::vector<char*> args;
    for (auto& s : argv) args.push_back(s.data());
    args.push_back(nullptr);
    const int err = posix_spawn(&pid_, a.python.c_str(), &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(to_child[0]);
    close(from_child[1]);
    if (err != 0) {
      close(to_child[1]);
      close(from_child[0]);
      why_ = fmt::format("cannot start {}: {}", a.python, std::strerror(err));
      pid_ = 0;
      return;
    }
    to_ = fdopen(to_child[1], "w");
    from_ = fdopen(from_child[0], "r");
    json answer = ask({{"cmd", "info"}});
    if (answer.contains("error") || !answer.contains("torch")) {
      why_ = answer.value("error", std::string("tools/torch_bench.py did not answer"));
      return;
    }
    info_ = answer;
    ok_ = true;
  }
  ~TorchSide() {
    if (to_) {
      if (ok_) ask({{"cmd", "quit"}});
      std::fclose(to_);
    }
    if (from_) std::fclose(from_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  TorchSide(const TorchSide&) = delete;
  TorchSide& operator=(const TorchSide&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  const json& info() const { return info_; }

  bool prepare(const std::string& id, const std::string& workload, const json& args) {
    json a = ask({{"cmd", "prepare"}, {"id", id}, {"workload", workload}, {"args", args}});
    return report(a) && a.value("ok", false);
  }
  // `warmup` untimed runs, then `reps` timed ones; the time per timed run.
  std::optional<double> run(const std::string& id, int reps, int warmup = 0) {
    json a = ask({{"cmd", "run"}, {"id", id}, {"reps", reps}, {"warmup", warmup}});
    if (!report(a) || !a.contains("ms")) return std::nullopt;
    return a["ms"].get<double>();
  }
  void release(const std::string& id) { ask({{"cmd", "release"}, {"id", id}}); }

 private:
  json ask(const json& cmd) {
    if (!to_ || !from_) return json{{"error", "no PyTorch process"}};
    const std::string line = cmd.dump() + "\n";
    std::fputs(line.c_str(), to_);
    std::fflush(to_);
    std::string reply;
    char buf[4096];
    while (std::fgets(buf, sizeof buf, from_)) {
      reply += buf;
      if (!reply.empty() && reply.back() == '\n') break;
    }
    if (reply.empty()) return json{{"error", "the PyTorch process ended"}};
    try {
      return json::parse(reply);
    } catch (const std::exception&) {
      return json{{"error", "unreadable answer from tools/torch_bench.py: " + reply}};
    }
  }
  bool report(const json& a) {
    if (!a.contains("error")) return true;
    fmt::print(stderr, "tapegrad bench: PyTorch: {}\n", a["error"].get<std::string>());
    return false;
  }

  pid_t pid_ = 0;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  bool ok_ = false;
  std::string why_;
  json info_;
};

// ---- timing ---------------------------------------------------------------------------------------------------

struct Timing {
  double ms = NAN;                          // tapegrad, per run
  std::optional<double> torch_ms, ratio;    // PyTorch per run; median of the per-block ratios
};

double g_block_ms = 40;  // a block's length: long against timer and wake-up noise, short against drift
// The pause before a block that follows the engine's or PyTorch's: their threads poll for up to milliseconds.
constexpr int kSettleMs = 30;

// Something timed block by block in turn with the engine: `warmup` untimed runs, then `reps` timed ones; returns
// the ms per timed run (nothing if it failed). `settle_ms`: how long its threads keep polling after a block.
struct Peer {
  std::function<std::optional<double>(int reps, int warmup)> run;
  int settle_ms = kSettleMs;
};

struct PeerTimings {
  double ms = NAN;                                   // the engine, per run
  std::vector<std::optional<double>> peer_ms, ratio;  // per peer: ms per run, median of the per-block ratios
};

PeerTimings measure_with(const std::function<void()>& run, int rounds, const std::vector<Peer>& peers) {
  auto t0 = Clock::now();
  run();
  const double first = ms_since(t0);
  const int reps = std::clamp(static_cast<int>(g_block_ms / std::max(first, 1e-3)), 1, 2000);
  for (int i = 0; i < std::min(reps, 3); ++i) run();
  for (const Peer& p : peers) p.run(std::min(reps, 3), 0);  // their warm-up
  // Each side starts its block on an idle machine: the others' threads keep polling for a while after their last
  // job (PyTorch's OpenMP threads for milliseconds, OpenBLAS' own threads for ~0.1 s, the engine's pool for
  // 300 µs) and would take the cores from the first runs of the block. Then ~10 ms of untimed runs (one at
  // least): the first runs after the pause pay for waking threads (and the virtual CPUs under them) and refilling
  // caches.
  const int block_warmup = peers.empty() ? 0 : std::clamp(static_cast<int>(10 / std::max(first, 1e-3)), 1, reps);
  std::vector<double> ours;
  std::vector<std::vector<double>> theirs(peers.size()), ratios(peers.size());
  int settle_ms = 0;
  for (int round = 0; round < rounds; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(settle_ms));
    for (int i = 0; i < block_warmup; ++i) run();
    t0 = Clock::now();
    for (int i = 0; i < reps; ++i) run();
    ours.push_back(ms_since(t0) / reps);
    settle_ms = peers.empty() ? 0 : kSettleMs;
    for (size_t p = 0; p < peers.size(); ++p) {
      std::this_thread::sleep_for(std::chrono::milliseconds(settle_ms));
      if (auto t = peers[p].run(reps, block_warmup)) {
        theirs[p].push_back(*t);
        ratios[p].push_back(ours.back() / *t);
      }
      settle_ms = peers[p].settle_ms;
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(settle_ms));
  PeerTimings t;
  t.ms = median(ours);
  for (size_t p = 0; p < peers.size(); ++p) {
    t.peer_ms.push_back(theirs[p].empty() ? std::nullopt : std::optional<double>(median(theirs[p])));
    t.ratio.push_back(ratios[p].empty() ? std::nullopt : std::optional<double>(median(ratios[p])));
  }
  return t;
}

Peer torch_peer(TorchSide* torch, const std::string& id) {
  return {[torch, id](int reps, int warmup) { return torch->run(id, reps, warmup); }};
}

// The engine's figures, with PyTorch's from peer `torch_index` (negative: none).
Timing engine_timing(const PeerTimings& p, int torch_index) {
  Timing t;
  t.ms = p.ms;
  if (torch_index >= 0) {
    t.torch_ms = p.peer_ms[static_cast<size_t>(torch_index)];
    t.ratio = p.ratio[static_cast<size_t>(torch_index)];
  }
  return t;
}

// The engine's timing, alternating with PyTorch's when `torch` is given.
Timing measure(const std::function<void()>& run, int rounds, TorchSide* torch = nullptr, const std::string& id = "") {
  const bool with_torch = torch && torch->ok() && !id.empty();
  PeerTimings p = measure_with(run, rounds, with_torch ? std::vector<Peer>{torch_peer(torch, id)} : std::vector<Peer>{});
  return engine_timing(p, with_torch ? 0 : -1);
}

// ---- output ---------------------------------------------------------------------------------------------------

struct Output {
  bool json_mode;
  json rows = json::array();

  template <class... Args>
  void print(fmt::format_string<Args...> f, Args&&... args) {
    if (!json_mode) {
      fmt::print(f, std::forward<Args>(args)...);
      std::fflush(stdout);
    }
  }
  json& row(const std::string& workload, const std::string& shape, double tapegrad_ms, const Timing* t,
            std::optional<int64_t> bytes_saved, std::optional<double> gflops) {
    json r{{"workload", workload},
           {"shape", shape},
           {"tapegrad_ms", std::isfinite(tapegrad_ms) ? json(tapegrad_ms) : json(nullptr)},
           {"torch_ms", t && t->torch_ms ? json(*t->torch_ms) : json(nullptr)},
           {"ratio", t && t->ratio ? json(*t->ratio) : json(nullptr)},
           {"bytes_saved", bytes_saved ? json(*bytes_saved) : json(nullptr)},
           {"gflops", gflops ? json(*gflops) : json(nullptr)}};
    rows.push_back(r);
    return rows.back();
  }
};

std::string torch_cells(const Timing& t, bool vs_torch) {
  if (!vs_torch) return "";
  if (!t.torch_ms) return fmt::format("  {:>9} {:>7}", "—", "—");
  return fmt::format("  {:>9.3f} {:>6.2f}×", *t.torch_ms, *t.ratio);
}

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

Tensor random_tensor(Shape shape, uint64_t seed, double scale = 1.0) {
  Tensor t = Tensor::empty(DType::f32, shape);
  Rng rng(seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(scale * rng.normal());
  return t;
}

// ---- workloads ------------------------------------------------------------------------------------------------

struct AttentionShape {
  int64_t B, H, T, d;
  std::string str() const { return fmt::format("({},{},{},{})", B, H, T, d); }
};

const std::vector<std::string>& attention_nodes() {
  static const std::vector<std::string> nodes{"attention", "beta_attention", "linear_attention", "tiled_attention"};
  return nodes;
}

Var apply_node(const std::string& node, Var q, Var k, Var v) {
  AttentionOptions opt;
  opt.causal = true;
  if (node == "attention") return attention(q, k, v, opt);
  if (node == "beta_attention") return beta_attention(q, k, v, opt);
  if (node == "linear_attention") return linear_attention(q, k, v, true);
  if (node == "tiled_attention") return tiled_attention(q, k, v, opt);
  fail("bench: unknown attention node '{}'", node);
}

// Inputs of one attention workload and the tape it records on.
struct AttentionRun {
  std::string node;
  Tensor q, k, v, g;
  Tape tape;
  AttentionRun(std::string n, const AttentionShape& s) : node(std::move(n)) {
    const Shape shape{s.B, s.H, s.T, s.d};
    q = random_tensor(shape, 11);
    k = random_tensor(shape, 12);
    v = random_tensor(shape, 13);
    g = random_tensor(shape, 14);
  }
  void forward() {
    tape.clear();
    NoGradGuard no_grad(tape);
    apply_node(node, tape.constant(q), tape.constant(k), tape.constant(v));
  }
  void forward_backward() {
    tape.clear();
    Var y = apply_node(node, tape.leaf(q), tape.leaf(k), tape.leaf(v));
    tape.backward(y, g);
  }
  // Arena bytes the node's forward allocates when recording: everything it keeps for backward, O included.
  int64_t bytes_kept() {
    tape.clear();
    Var qv = tape.leaf(q), kv = tape.leaf(k), vv = tape.leaf(v);
    const size_t before = tape.arena().bytes_in_use();
    apply_node(node, qv, kv, vv);
    const auto kept = static_cast<int64_t>(tape.arena().bytes_in_use() - before);
    tape.clear();
    return kept;
  }
};

// One training step of the default model, as tapegrad train runs it (without the logging).
struct TrainStep {
  GPTConfig cfg;
  int64_t batch = 12;
  GPT model;
  AdamW opt;
  Tape tape;
  std::vector<std::pair<Tensor, Tensor>> batches;
  size_t next = 0;
  TrainStep() : model(cfg, 1337), opt(model.parameters(), {0.9, 0.99, 1e-8, 0.1}) {
    Rng rng(7);
    for (int i = 0; i < 8; ++i) {
      Tensor x = Tensor::empty(DType::i32, {batch, cfg.block_size}), y = Tensor::empty(DType::i32, {batch, cfg.block_size});
      for (int64_t j = 0; j < x.numel(); ++j) {
        x.data<int32_t>()[j] = static_cast<int32_t>(rng.below(cfg.vocab_size));
        y.data<int32_t>()[j] = static_cast<int32_t>(rng.below(cfg.vocab_size));
      }
      batches.emplace_back(x, y);
    }
  }
  void run() {
    const auto& [x, y] = batches[next++ % batches.size()];
    Var loss = model.loss(tape, x, y);
    tape.backward(loss);
    tape.clear();
    clip_grad_norm(model.parameters(), 1.0);
    opt.step(model.parameters(), 1e-3);
    model.zero_grad();
  }
  // Multiply-adds ×2 of the step's matrix products, counted as PyTorch's path computes them (full T×T attention
  // products): forward 2·(Σ weights of the linear layers and the head + n_layer·2·T·C) per token, backward twice.
  double nominal_flops() const {
    const double C = static_cast<double>(cfg.n_embd), T = static_cast<double>(cfg.block_size);
    const double per_layer_weights = 3 * C * C + C * C + 4 * C * C + 4 * C * C;
    const double weights = static_cast<double>(cfg.n_layer) * per_layer_weights + C * static_cast<double>(cfg.vocab_size);
    const double attention = static_cast<double>(cfg.n_layer) * 2 * T * C;
    const double forward_per_token = 2 * (weights + attention);
    return 3 * forward_per_token * static_cast<double>(batch) * T;
  }
};

// ---- sections -------------------------------------------------------------------------------------------------

void header(Output& out, const BenchArgs& a, TorchSide* torch) {
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  const std::string cpu = first_line_with("/proc/cpuinfo", "model name");
  const std::string mem = first_line_with("/proc/meminfo", "MemTotal");
  auto blas_libs = mapped_libraries("blas");
  std::string blas = openblas_get_config();
  out.print("tapegrad bench, {}{}\n", date, a.quick ? " (--quick: fewer rounds, smaller shapes)" : "");
  out.print("machine   {}, {} CPUs available, {} memory, load average {}\n", cpu, std::thread::hardware_concurrency(),
            mem, load_average());
  out.print("tapegrad  {} threads (the engine's pool); OpenBLAS single-threaded under it: {} ({} kernels), {}\n",
            num_threads(), blas, openblas_get_corename(), blas_libs.empty() ? "?" : blas_libs.front());
  if (torch) {
    if (torch->ok()) {
      const json& i = torch->info();
      std::string libs;
      for (const auto& l : i["blas"]) libs += (libs.empty() ? "" : ", ") + l.get<std::string>();
      out.print("pytorch   {} eager float32, {} threads, BLAS {}{}\n", i["torch"].get<std::string>(),
                i["threads"].get<int>(), libs,
                i["openmp_blas"].get<bool>() ? "" : " (OpenBLAS-pthread: install libopenblas0-openmp for a fair figure)");
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
    gemm(false, false, 512, 512, 512, 1.0f, x.data<float>(), 512, x.data<float>(), 512, 0.0f, c.data<float>(), 512);
}

// Returns the sgemm ceiling: the best raw GFLOP/s measured.
double matmul_section(Output& out, const BenchArgs& a, TorchSide* torch) {
  struct Mm {
    int64_t m, k, n;
    const char* what;
  };
  std::vector<Mm> shapes{{768, 128, 384, "c_attn"}, {768, 128, 128, "attn c_proj"}, {768, 128, 512, "c_fc"},
                         {768, 512, 128, "mlp c_proj"}, {768, 128, 65, "head"}, {512, 512, 512, "512³"},
                         {2048, 2048, 2048, "2048³"}};
  if (a.quick) shapes.pop_back();
  const bool vs = torch != nullptr;
  out.print("matmul: engine (tape + matmul node, pool of {} threads) vs raw cblas_sgemm (OpenBLAS' own {} threads), "
            "alternating; overhead = median of the per-block ratios − 1\n",
            num_threads(), num_threads());
  out.print("  {:<12} {:<16} {:>9} {:>7} {:>9} {:>7} {:>9}{}\n", "", "(m, k, n)", "engine ms", "GFLOP/s", "sgemm ms",
            "GFLOP/s", "overhead", vs ? fmt::format("  {:>9} {:>7}", "torch ms", "ratio") : "");
  double ceiling = 0;
  int id = 0;
  for (const Mm& s : shapes) {
    Tensor x = random_tensor({s.m, s.k}, 21), w = random_tensor({s.k, s.n}, 22);
    Tensor c = Tensor::empty(DType::f32, {s.m, s.n});
    Tape tape;
    const std::string tid = fmt::format("mm{}", id++);
    const bool torch_ready = vs && torch->ok() && torch->prepare(tid, "matmul", {s.m, s.k, s.n});
    // The raw product with OpenBLAS' own threads, only in its blocks; they poll for ~0.1 s after a call.
    Peer raw{[&](int reps, int warmup) -> std::optional<double> {
               openblas_set_num_threads(num_threads());
               const auto sgemm = [&] {
                 cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(s.m), static_cast<int>(s.n),
                             static_cast<int>(s.k), 1.0f, x.data<float>(), static_cast<int>(s.k), w.data<float>(),
                             static_cast<int>(s.n), 0.0f, c.data<float>(), static_cast<int>(s.n));
               };
               for (int i = 0; i < warmup; ++i) sgemm();
               const auto t0 = Clock::now();
               for (int i = 0; i < reps; ++i) sgemm();
               const double ms = ms_since(t0) / reps;
               openblas_set_num_threads(1);
               return ms;
             },
             200};
    std::vector<Peer> peers{raw};
    if (torch_ready) peers.push_back(torch_peer(torch, tid));
    const PeerTimings p = measure_with(
        [&] {
          tape.clear();
          matmul(tape.constant(x), tape.constant(w));
        },
        a.rounds, peers);
    if (torch_ready) torch->release(tid);
    const Timing engine = engine_timing(p, torch_ready ? 1 : -1);
    const double raw_ms = p.peer_ms[0].value_or(NAN), overhead = p.ratio[0].value_or(NAN);
    const double flops = 2.0 * static_cast<double>(s.m * s.k * s.n);
    const double gf_engine = flops / engine.ms / 1e6, gf_raw = flops / raw_ms / 1e6;
    ceiling = std::max(ceiling, gf_raw);
    const std::string shape = fmt::format("({}, {}, {})", s.m, s.k, s.n);
    out.print("  {:<12} {:<16} {:>9.3f} {:>7.1f} {:>9.3f} {:>7.1f} {:>+8.1f}%{}\n", s.what, shape, engine.ms, gf_engine,
              raw_ms, gf_raw, 100 * (overhead - 1), torch_cells(engine, vs));
    json& r = out.row("matmul", shape, engine.ms, &engine, std::nullopt, gf_engine);
    r["sgemm_ms"] = raw_ms;
    r["overhead"] = overhead - 1;
  }
  out.print("  sgemm ceiling (best raw GFLOP/s above): {:.1f}\n\n", ceiling);
  return ceiling;
}

void attention_section(Output& out, const BenchArgs& a, TorchSide* torch) {
  std::vector<AttentionShape> shapes{{12, 4, 64, 32}, {4, 4, 256, 64}, {1, 8, 1024, 64}};
  if (a.quick) shapes = {{12, 4, 64, 32}};
  const bool vs = torch != nullptr;
  out.print("attention nodes: causal, float32; forward alone and forward + backward; bytes the node keeps (O included)\n");
  out.print("  {:<17} {:<16} {:>9}{} {:>9}{} {:>11}\n", "node", "(B, h, T, d)", "fwd ms",
            vs ? fmt::format("  {:>9} {:>7}", "torch ms", "ratio") : "", "fwd+bwd ms",
            vs ? fmt::format("  {:>9} {:>7}", "torch ms", "ratio") : "", "kept");
  int id = 0;
  for (const AttentionShape& s : shapes) {
    double fused_ms = NAN, tiled_ms = NAN;
    for (const std::string& node : attention_nodes()) {
      AttentionRun run(node, s);
      const int64_t kept = run.bytes_kept();
      const json args = {node, s.B, s.H, s.T, s.d};
      const std::string fid = fmt::format("af{}", id), bid = fmt::format("ab{}", id);
      ++id;
      const bool torch_ready = vs && torch->ok() && torch->prepare(fid, "attention_fwd", args) &&
                               torch->prepare(bid, "attention_bwd", args);
      Timing fwd = measure([&] { run.forward(); }, a.rounds, torch_ready ? torch : nullptr, fid);
      Timing both = measure([&] { run.forward_backward(); }, a.rounds, torch_ready ? torch : nullptr, bid);
      if (torch_ready) {
        torch->release(fid);
        torch->release(bid);
      }
      if (node == "attention") fused_ms = both.ms;
      if (node == "tiled_attention") tiled_ms = both.ms;
      out.print("  {:<17} {:<16} {:>9.3f}{} {:>9.3f}{} {:>11}\n", node, s.str(), fwd.ms, torch_cells(fwd, vs), both.ms,
                torch_cells(both, vs), mib(kept));
      out.row("attention_fwd " + node, s.str(), fwd.ms, &fwd, kept, std::nullopt);
      out.row("attention_fwd_bwd " + node, s.str(), both.ms, &both, kept, std::nullopt);
    }
    out.print("  {:<17} {:<16} tiled / fused forward + backward: {:.2f}×\n", "", s.str(), tiled_ms / fused_ms);
  }
  out.print("\n");
}

void training_section(Output& out, const BenchArgs& a, TorchSide* torch, double ceiling) {
  TrainStep step;
  const bool vs = torch != nullptr;
  const bool torch_ready = vs && torch->ok() && torch->prepare("train", "train_step", json::array());
  Timing t = measure([&] { step.run(); }, a.rounds, torch_ready ? torch : nullptr, "train");
  if (torch_ready) torch->release("train");
  const double tokens = static_cast<double>(step.batch * step.cfg.block_size);
  const double gflops = step.nominal_flops() / t.ms / 1e6;
  out.print("training step: default model ({} parameters, {} layers, {} heads, {} wide, context {}, batch {}), "
            "forward + backward + clipping + AdamW\n",
            step.model.num_parameters(), step.cfg.n_layer, step.cfg.n_head, step.cfg.n_embd, step.cfg.block_size,
            step.batch);
  out.print("  {:.2f} ms/step, {:.0f} tokens/s; {:.2f} GFLOP per step (nominal) → {:.1f} GFLOP/s{}\n", t.ms,
            tokens / t.ms * 1000, step.nominal_flops() / 1e9, gflops,
            std::isnan(ceiling) ? std::string(" (no sgemm ceiling: the matmul section did not run)")
                                : fmt::format(" = {:.0f}% of the sgemm ceiling {:.1f}", 100 * gflops / ceiling, ceiling));
  if (vs) {
    if (t.torch_ms)
      out.print("  PyTorch {:.2f} ms/step, {:.0f} tokens/s; ratio tapegrad / PyTorch {:.2f}×\n", *t.torch_ms,
                tokens / *t.torch_ms * 1000, *t.ratio);
    else
      out.print("  PyTorch —\n");
  }
  out.print("\n");
  json& r = out.row("train_step", fmt::format("B={} T={} C={} L={}", step.batch, step.cfg.block_size, step.cfg.n_embd,
                                               step.cfg.n_layer),
                    t.ms, &t, std::nullopt, gflops);
  r["tokens_per_s"] = tokens / t.ms * 1000;
  r["sgemm_ceiling_gflops"] = ceiling;
}

void peak_rss_section(Output& out, const BenchArgs& a, TorchSide* torch) {
  const int steps = a.quick ? 5 : 200;
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("tapegrad-bench-{}", getpid());
  fs::create_directories(dir);
  // The child reads its own VmHWM: a spawned child's ru_maxrss also counts the parent's peak (posix_spawn shares
  // the parent's memory until exec, and exec folds that memory's high-water mark into the child's).
  ChildResult ours = run_child({"/proc/self/exe", "bench", "--child-train", std::to_string(steps), "--child-dir",
                                dir.string(), "--threads", std::to_string(num_threads())});
  int64_t ours_kb = -1;
  try {
    if (ours.status == 0) ours_kb = json::parse(ours.out)["vmhwm_kb"].get<int64_t>();
  } catch (const std::exception&) {
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  std::optional<int64_t> theirs;
  if (torch && torch->ok()) {
    ChildResult t = run_child({a.python, a.torch_script, "train-rss", "--steps", std::to_string(steps), "--threads",
                               std::to_string(num_threads())});
    try {
      if (t.status == 0) theirs = json::parse(t.out)["vmhwm_kb"].get<int64_t>() * 1024;
    } catch (const std::exception&) {
    }
  }
  const int64_t ours_bytes = ours_kb * 1024;
  out.print("peak RSS of a {}-step training run (a child process, its VmHWM): tapegrad {}{}\n", steps, mib(ours_bytes),
            ours_kb >= 0 ? "" : fmt::format(" (the training child failed: exit {})", ours.status));
  if (torch) {
    if (theirs)
      out.print("  PyTorch {}; ratio tapegrad / PyTorch {:.2f}×\n", mib(*theirs),
                static_cast<double>(ours_bytes) / static_cast<double>(*theirs));
    else
      out.print("  PyTorch —\n");
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
  out.print("memory (issue 3): bytes each node keeps for backward, and the peak RSS of one forward + backward in a "
            "fresh process\n");
  out.print("  {:<17} {:<16} {:>12} {:>12} {:>14}\n", "node", "(B, h, T, d)", "kept", "peak RSS", "above start");
  for (const AttentionShape& s : shapes)
    for (const std::string& node : attention_nodes()) {
      const std::string spec = fmt::format("{},{},{},{},{}", node, s.B, s.H, s.T, s.d);
      ChildResult c = run_child({"/proc/self/exe", "bench", "--child-memory", spec, "--threads",
                                 std::to_string(num_threads())});
      int64_t kept = -1, hwm = -1, start = -1;
      try {
        json j = json::parse(c.out);
        kept = j["bytes_kept"].get<int64_t>();
        hwm = j["vmhwm_kb"].get<int64_t>() * 1024;
        start = j["vmrss_start_kb"].get<int64_t>() * 1024;
      } catch (const std::exception&) {
      }
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
  fmt::print("{}\n", json{{"bytes_kept", kept}, {"vmhwm_kb", proc_status_kb("VmHWM")}, {"vmrss_start_kb", start}}.dump());
}

// The --child-train process: what `tapegrad train --max-iters N --eval-interval N --eval-iters 2 --sample-tokens 0
// -q` runs, then its peak RSS printed as JSON.
void child_train(int64_t steps, const std::string& dir) {
  TrainConfig c;
  c.max_iters = steps;
  c.eval_interval = steps;
  c.eval_iters = 2;
  c.sample_tokens = 0;
  c.quiet = true;
  c.out_dir = dir;
  train(c, stderr);
  fmt::print("{}\n", json{{"vmhwm_kb", proc_status_kb("VmHWM")}}.dump());
}

void run_bench(BenchArgs a) {
  if (a.threads > 0) set_num_threads(a.threads);
  if (!a.child_memory.empty()) return child_memory(a.child_memory);
  if (a.child_train > 0) return child_train(a.child_train, a.child_dir);
  if (a.rounds <= 0) a.rounds = a.quick ? 2 : 10;
  if (a.quick) g_block_ms = 5;
  Output out{a.json};
  std::unique_ptr<TorchSide> torch;
  if (a.vs_torch) torch = std::make_unique<TorchSide>(a, num_threads());
  header(out, a, torch.get());
  auto wanted = [&](const char* section) {
    return a.only.empty() || std::find(a.only.begin(), a.only.end(), section) != a.only.end();
  };
  if (wanted("matmul") || wanted("attention") || wanted("training")) warm_up_cores(a.quick ? 20 : 500);
  const double ceiling = wanted("matmul") ? matmul_section(out, a, torch.get()) : NAN;
  if (wanted("attention")) attention_section(out, a, torch.get());
  if (wanted("training")) training_section(out, a, torch.get(), ceiling);
  if (wanted("rss")) peak_rss_section(out, a, torch.get());
  if (wanted("memory")) memory_section(out, a);
  if (a.json) fmt::print("{}\n", out.rows.dump(2));
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Measure matmul, the attention nodes, a training step and peak memory; --vs-torch runs PyTorch alongside");
  cmd->add_flag("--quick", args->quick, "Fewer rounds and smaller shapes: checks that the bench runs, in seconds");
  cmd->add_flag("--json", args->json,
                "Print a JSON list of {workload, shape, tapegrad_ms, torch_ms, ratio, bytes_saved, gflops}");
  cmd->add_flag("--vs-torch", args->vs_torch,
                "Run every workload in PyTorch too (tools/torch_bench.py), alternating, with the ratio tapegrad / PyTorch");
  cmd->add_option("--threads", args->threads, "Threads for tapegrad and PyTorch (default: the CPUs available)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--rounds", args->rounds, "Timed blocks per workload (default 10, 2 with --quick)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--only", args->only, "Run only these sections (default: all)")
      ->check(CLI::IsMember({"matmul", "attention", "training", "rss", "memory"}))
      ->delimiter(',');
  cmd->add_option("--python", args->python, "Python with PyTorch for --vs-torch")->capture_default_str();
  cmd->add_option("--torch-script", args->torch_script, "The PyTorch side of --vs-torch")->capture_default_str();
  cmd->add_option("--child-memory", args->child_memory, "Internal: one attention forward + backward, NODE,B,H,T,D")
      ->group("");
  cmd->add_option("--child-train", args->child_train, "Internal: a training run of N steps")->group("");
  cmd->add_option("--child-dir", args->child_dir, "Internal: its run directory")->group("");
  cmd->callback([args] { run_bench(*args); });
}

}  // namespace tapegrad::cli
