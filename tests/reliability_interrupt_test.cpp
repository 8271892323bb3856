// Training interrupted at random moments, over and over, with each product backend: every SIGINT ends the program
// with 130 and every SIGTERM with 143 (the program's own exit, after the step in progress, never death by a signal
// or an abort), and the run's checkpoint loads each time. TAPEGRAD_INTERRUPTS sets the count per backend (100; 25
// under the sanitizers, where a step is several times slower).
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ops/products/products.hpp"
#include "models/checkpoint.hpp"
#include "reliability_util.hpp"
#include "training_test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;
namespace fs = std::filesystem;

namespace {

int interrupts_per_backend() {
  if (const char* n = std::getenv("TAPEGRAD_INTERRUPTS")) return std::max(1, std::atoi(n));
  return kAddressSanitizer ? 25 : 100;
}

// `tapegrad train` in `cwd` with TAPEGRAD_GEMM=backend and two engine threads, its output discarded.
pid_t start_training(const std::string& cwd, const std::string& backend, const std::vector<std::string>& args) {
  std::string program = TAPEGRAD_CLI;
  std::vector<std::string> copy = args;
  std::vector<char*> argv{program.data()};
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    dup2(null, STDOUT_FILENO);
    dup2(null, STDERR_FILENO);
    if (chdir(cwd.c_str()) != 0 || setenv("TAPEGRAD_GEMM", backend.c_str(), 1) != 0 ||
        setenv("TAPEGRAD_NUM_THREADS", "2", 1) != 0)
      _exit(126);
    alarm(120);
    execv(program.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

}  // namespace

TEST_CASE("training interrupted at random moments exits 130 or 143 with a loadable checkpoint, on every backend") {
  ScratchDir dir;
  spit(dir.file("text.txt"), text_of_length(20000));
  std::vector<std::string> backends = {"openblas"};
  if (onednn_built()) backends.push_back("onednn");
  const int n = interrupts_per_backend();
  std::mt19937 rng(20261126);
  // Two layers, 64 wide, a context of 32: products large enough to be split over both threads, a step short
  // enough that a signal lands anywhere in it (forward, backward, the optimizer, a checkpoint being written).
  const std::vector<std::string> args = {"train",
                                         "--data",
                                         "text.txt",
                                         "--out",
                                         "r",
                                         "--name",
                                         "run",
                                         "--overwrite",
                                         "--n-layer",
                                         "2",
                                         "--n-head",
                                         "2",
                                         "--n-embd",
                                         "64",
                                         "--block-size",
                                         "32",
                                         "--batch-size",
                                         "8",
                                         "--max-iters",
                                         "1000000",
                                         "--eval-interval",
                                         "20",
                                         "--eval-iters",
                                         "2"};
  const fs::path log = dir.path / "r" / "run" / "losses.csv";
  for (const std::string& backend : backends) {
    int clean = 0;
    for (int i = 0; i < n; ++i) {
      fs::remove(log);
      const pid_t pid = start_training(dir.path.string(), backend, args);
      // The handlers are in place once the run has written its log's first row; then a random moment.
      for (int w = 0; w < 3000 && !fs::exists(log); ++w) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 400000)(rng)));
      const int sig = i % 2 == 0 ? SIGINT : SIGTERM;
      ::kill(pid, sig);
      int status = 0;
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
      CAPTURE(backend);
      CAPTURE(i);
      const bool exited = WIFEXITED(status);
      CHECK_MESSAGE(exited, "killed by signal ", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
      CHECK(WEXITSTATUS(status) == 128 + sig);
      bool loads = false;
      try {
        loads = std::stoll(load_checkpoint(dir.file("r/run/checkpoint.safetensors")).metadata.at("tapegrad.step")) >= 0;
      } catch (const std::exception& e) {
        FAIL_CHECK("the checkpoint does not load: ", e.what());
      }
      clean += exited && WEXITSTATUS(status) == 128 + sig && loads;
    }
    MESSAGE(backend, ": ", clean, " of ", n, " interrupts ended cleanly with a loadable checkpoint");
    CHECK(clean == n);
  }
}
