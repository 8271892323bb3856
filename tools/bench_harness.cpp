#include "tools/bench_harness.hpp"

#include <poll.h>
#include <sys/wait.h>
#include <spawn.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "inspect/graphviz.hpp"
#include "engine/rng.hpp"

extern char** environ;

namespace tapegrad::cli::bench {

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

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

ChildResult run_child(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
                      double timeout_s) {
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
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  bool timed_out = false;
  char buf[4096];
  for (;;) {
    if (timeout_s > 0) {
      const double left_ms = std::chrono::duration<double, std::milli>(deadline - Clock::now()).count();
      pollfd p{pipe_fd[0], POLLIN, 0};
      const int ready = left_ms > 0 ? ::poll(&p, 1, static_cast<int>(std::min(left_ms, 60'000.0)) + 1) : 0;
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0 && Clock::now() < deadline) continue;
      if (ready == 0) {
        timed_out = true;
        ::kill(pid, SIGKILL);
        break;
      }
    }
    const ssize_t n = read(pipe_fd[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    r.out.append(buf, static_cast<size_t>(n));
  }
  close(pipe_fd[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  if (timed_out)
    fail("bench: {} {} gave no answer within {} s; stopped it", argv[0], argv.size() > 1 ? argv[1] : "", timeout_s);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// ---- the PyTorch side -----------------------------------------------------------------------------------------

TorchSide::TorchSide(const BenchArgs& a, int threads) : script_(a.torch_script), timeout_s_(a.torch_timeout) {
  // A script that ends early closes its end of the pipe: writing to it is then an error to report, not SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  const std::string python = find_program(a.python).value_or("");
  if (python.empty()) {
    why_ = fmt::format("cannot start {}: no such program (give a path, or a name on PATH)", a.python);
    return;
  }
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) {
    why_ = "cannot create pipes for the PyTorch process";
    return;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
  posix_spawn_file_actions_addclose(&actions, to_child[1]);
  posix_spawn_file_actions_addclose(&actions, from_child[0]);
  const std::string threads_arg = std::to_string(threads);
  std::vector<std::string> argv{python, a.torch_script, "serve", "--threads", threads_arg};
  std::vector<char*> args;
  for (auto& s : argv) args.push_back(s.data());
  args.push_back(nullptr);
  const int err = posix_spawn(&pid_, python.c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(to_child[0]);
  close(from_child[1]);
  if (err != 0) {
    close(to_child[1]);
    close(from_child[0]);
    why_ = fmt::format("cannot start {}: {}", python, std::strerror(err));
    pid_ = 0;
    return;
  }
  to_ = fdopen(to_child[1], "w");
  from_ = from_child[0];
  json answer = ask({{"cmd", "info"}});
  if (answer.contains("error") || !answer.contains("torch")) {
    why_ = answer.value("error", std::string("tools/torch_bench.py did not answer"));
    return;
  }
  info_ = answer;
  ok_ = true;
}

TorchSide::~TorchSide() {
  if (to_ && ok_) {
    try {
      if (ask({{"cmd", "quit"}}).contains("error")) ok_ = false;  // not quitting: stopped
    } catch (const Error&) {                                      // no answer in time: stopped already
    }
  }
  stop_process();
}

// Closes the pipes and reaps the process: killed first unless it has ended or was asked to quit and answered.
void TorchSide::stop_process() {
  if (to_) std::fclose(to_);
  to_ = nullptr;
  if (from_ >= 0) ::close(from_);
  from_ = -1;
  if (pid_ > 0) {
    if (!ok_) ::kill(pid_, SIGKILL);
    while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {}
  }
  pid_ = 0;
  ok_ = false;
}

std::string TorchSide::read_line(const std::string& request) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
  for (;;) {
    if (const size_t nl = pending_.find('\n'); nl != std::string::npos) {
      std::string line = pending_.substr(0, nl + 1);
      pending_.erase(0, nl + 1);
      return line;
    }
    const double left_ms = std::chrono::duration<double, std::milli>(deadline - Clock::now()).count();
    pollfd p{from_, POLLIN, 0};
    const int ready = left_ms > 0 ? ::poll(&p, 1, static_cast<int>(std::min(left_ms, 60'000.0)) + 1) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0 && Clock::now() < deadline) continue;
    if (ready == 0) {
      ok_ = false;
      stop_process();
      fail("bench --vs-torch: the PyTorch side ({}) gave no answer to '{}' within {} s (--torch-timeout); stopped it",
           script_, request, timeout_s_);
    }
    char buf[4096];
    const ssize_t n = ::read(from_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {  // the process ended: what it said last, if anything
      std::string rest = std::move(pending_);
      pending_.clear();
      return rest;
    }
    pending_.append(buf, static_cast<size_t>(n));
  }
}

std::optional<std::string> TorchSide::prepare(const std::string& id, const std::string& workload, const json& args) {
  json a = ask({{"cmd", "prepare"}, {"id", id}, {"workload", workload}, {"args", args}});
  if (!report(a) || !a.value("ok", false)) return std::nullopt;
  return a.value("peer", std::string("?"));
}

std::optional<double> TorchSide::run(const std::string& id, int reps, int warmup) {
  json a = ask({{"cmd", "run"}, {"id", id}, {"reps", reps}, {"warmup", warmup}});
  if (!report(a) || !a.contains("ms")) return std::nullopt;
  return a["ms"].get<double>();
}

void TorchSide::release(const std::string& id) { ask({{"cmd", "release"}, {"id", id}}); }

json TorchSide::ask(const json& cmd) {
  if (!to_ || from_ < 0) return json{{"error", "no PyTorch process"}};
  const std::string line = cmd.dump() + "\n";
  std::fputs(line.c_str(), to_);
  std::fflush(to_);
  const std::string reply = read_line(cmd.value("cmd", std::string("?")));
  if (reply.empty()) return json{{"error", "the PyTorch process ended"}};
  try {
    return json::parse(reply);
  } catch (const std::exception&) {
    return json{{"error", "unreadable answer from tools/torch_bench.py: " + reply}};
  }
}

bool TorchSide::report(const json& a) {
  if (!a.contains("error")) return true;
  fmt::print(stderr, "tapegrad bench: PyTorch: {}\n", a["error"].get<std::string>());
  return false;
}

// ---- timing ---------------------------------------------------------------------------------------------------

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
Timing measure(const std::function<void()>& run, int rounds, TorchSide* torch, const std::string& id) {
  const bool with_torch = torch && torch->ok() && !id.empty();
  PeerTimings p =
      measure_with(run, rounds, with_torch ? std::vector<Peer>{torch_peer(torch, id)} : std::vector<Peer>{});
  return engine_timing(p, with_torch ? 0 : -1);
}

// ---- output ---------------------------------------------------------------------------------------------------

json& Output::row(const std::string& workload, const std::string& shape, double tapegrad_ms, const Timing* t,
                  std::optional<int64_t> bytes_saved, std::optional<double> gflops) {
  json r{{"workload", workload},
         {"shape", shape},
         {"tapegrad_ms", std::isfinite(tapegrad_ms) ? json(tapegrad_ms) : json(nullptr)},
         {"torch_ms", t && t->torch_ms ? json(*t->torch_ms) : json(nullptr)},
         {"ratio", t && t->ratio ? json(*t->ratio) : json(nullptr)},
         {"torch_peer", t && !t->peer.empty() ? json(t->peer) : json(nullptr)},
         {"bytes_saved", bytes_saved ? json(*bytes_saved) : json(nullptr)},
         {"gflops", gflops ? json(*gflops) : json(nullptr)}};
  rows.push_back(r);
  return rows.back();
}

std::string torch_cells(const Timing& t, bool vs_torch) {
  if (!vs_torch) return "";
  if (!t.torch_ms) return fmt::format("  {:>9} {:>7}", "—", "—");
  return fmt::format("  {:>9.3f} {:>6.2f}×", *t.torch_ms, *t.ratio);
}

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

Tensor random_tensor(Shape shape, uint64_t seed, double scale) {
  Tensor t = Tensor::empty(DType::f32, shape);
  Rng rng(seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(scale * rng.normal());
  return t;
}

}  // namespace tapegrad::cli::bench
