// A run directory has one writer, and what it holds is not lost: a second run there is refused while the first
// writes, a finished run is not replaced without --overwrite, --resume refuses a different model or text by name,
// SIGINT and SIGTERM end a run after its step with a checkpoint, a text without a newline trains and samples.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "models/checkpoint.hpp"
#include "reliability_util.hpp"
#include "training_test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;
namespace fs = std::filesystem;

namespace {

// The program started in the background; wait() collects its exit.
struct Background {
  pid_t pid = -1;
  explicit Background(const std::string& cwd, const std::vector<std::string>& args) {
    std::string program = TAPEGRAD_CLI;
    std::vector<std::string> copy = args;
    std::vector<char*> argv{program.data()};
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid = fork();
    if (pid == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      dup2(null, STDOUT_FILENO);
      dup2(null, STDERR_FILENO);
      if (chdir(cwd.c_str()) != 0) _exit(126);
      alarm(300);
      execv(program.c_str(), argv.data());
      _exit(127);
    }
  }
  int wait() {  // the exit code, or 128 + the signal that killed it
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

bool wait_for(const fs::path& p) {
  for (int i = 0; i < 3000 && !fs::exists(p); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return fs::exists(p);
}

void check_refused(const CliRun& r, const std::string& expect) {
  CHECK_MESSAGE(r.signal == 0, r.out);
  CHECK_MESSAGE(r.code == 2, r.out);
  CHECK_MESSAGE(r.out.find(expect) != std::string::npos, r.out);
}

const std::vector<std::string> kLong = {"--max-iters", "1000000", "--eval-interval", "5"};

}  // namespace

TEST_CASE("one writer per run directory; an existing run is not replaced without --overwrite") {
  ScratchDir dir;
  spit(dir.file("text.txt"), text_of_length(3000));
  Background first(dir.path.string(), with(with({"train", "--data", "text.txt", "--out", "r", "--name", "same"}, kLong), kTiny));
  REQUIRE(wait_for(dir.path / "r" / "same" / "checkpoint.safetensors"));
  // While it runs, a second run there is refused, naming the process, even with --overwrite or --resume.
  for (const char* extra : {"--overwrite", "--resume"}) {
    CliRun second = run_cli(dir.path.string(), with({"train", "--data", "text.txt", "--out", "r", "--name", "same",
                                                     "--max-iters", "4", extra}, kTiny));
    check_refused(second, "is in use by process " + std::to_string(first.pid));
  }
  // SIGTERM: the run ends after its step with a checkpoint, and says so.
  ::kill(first.pid, SIGTERM);
  CHECK(first.wait() == 143);
  const Checkpoint ck = load_checkpoint(dir.file("r/same/checkpoint.safetensors"));
  const int64_t step = std::stoll(ck.metadata.at("tapegrad.step"));
  CHECK(step > 0);
  // A finished or stopped run is not replaced by a new one without --overwrite...
  CliRun again = run_cli(dir.path.string(), with({"train", "--data", "text.txt", "--out", "r", "--name", "same",
                                                  "--max-iters", "4"}, kTiny));
  check_refused(again, "holds a run already");
  CHECK(load_checkpoint(dir.file("r/same/checkpoint.safetensors")).metadata.at("tapegrad.step") == std::to_string(step));
  // ... and is with it; the temporaries of every kind of file a run writes are removed when it starts.
  for (const char* f : {".sharpness.csv.tmp-abc123", ".profile.json.tmp-abc123", ".losses.svg.tmp-abc123"})
    spit((dir.path / "r" / "same" / f).string(), "left by a killed write");
  CliRun over = run_cli(dir.path.string(), with({"train", "--data", "text.txt", "--out", "r", "--name", "same",
                                                 "--max-iters", "4", "--eval-interval", "2", "--overwrite"}, kTiny));
  CHECK_MESSAGE(over.code == 0, over.out);
  for (const auto& e : fs::directory_iterator(dir.path / "r" / "same"))
    CHECK_MESSAGE(e.path().filename().string().find(".tmp-") == std::string::npos, e.path().string());
}

TEST_CASE("SIGINT ends a run after its step with a checkpoint; --resume continues it") {
  ScratchDir dir;
  spit(dir.file("text.txt"), text_of_length(3000));
  Background run(dir.path.string(), with(with({"train", "--data", "text.txt", "--out", "r"}, kLong), kTiny));
  REQUIRE(wait_for(dir.path / "r" / "softmax" / "losses.csv"));
  ::kill(run.pid, SIGINT);
  CHECK(run.wait() == 130);
  const std::string step = load_checkpoint(dir.file("r/softmax/checkpoint.safetensors")).metadata.at("tapegrad.step");
  CHECK(std::stoll(step) > 0);
  CliRun resumed = run_cli(dir.path.string(), with({"train", "--data", "text.txt", "--out", "r", "--resume",
                                                    "--max-iters", std::to_string(std::stoll(step) + 3), "--eval-interval", "5"}, kTiny));
  CHECK_MESSAGE(resumed.code == 0, resumed.out);
}

TEST_CASE("--resume refuses another GELU, dropout, text or vocabulary by name") {
  ScratchDir dir;
  const std::string text = text_of_length(3000);
  spit(dir.file("text.txt"), text);
  std::string shuffled = text;  // the same characters, another text
  std::reverse(shuffled.begin(), shuffled.end());
  spit(dir.file("other.txt"), shuffled);
  spit(dir.file("wider.txt"), text + "XYZ");
  CliRun made = run_cli(dir.path.string(), with({"train", "--data", "text.txt", "--out", "r", "--max-iters", "4",
                                                 "--eval-interval", "2", "--stop-after", "2", "--gelu", "tanh"}, kTiny));
  REQUIRE_MESSAGE(made.code == 0, made.out);
  const std::string before = slurp(dir.file("r/softmax/checkpoint.safetensors"));
  auto resume = [&](std::vector<std::string> extra) {
    return run_cli(dir.path.string(), with(with({"train", "--out", "r", "--max-iters", "4", "--eval-interval", "2",
                                                 "--resume"}, extra), kTiny));
  };
  check_refused(resume({"--data", "text.txt", "--gelu", "exact"}), "--gelu tanh, this run asks for --gelu exact");
  check_refused(resume({"--data", "text.txt", "--gelu", "tanh", "--dropout", "0.1"}), "--dropout 0, this run asks for --dropout 0.1");
  check_refused(resume({"--data", "other.txt", "--gelu", "tanh"}), "was trained on another text");
  check_refused(resume({"--data", "wider.txt", "--gelu", "tanh"}), "another model");
  CHECK(slurp(dir.file("r/softmax/checkpoint.safetensors")) == before);
  CliRun ok = resume({"--data", "text.txt", "--gelu", "tanh"});
  CHECK_MESSAGE(ok.code == 0, ok.out);
}

TEST_CASE("a text without a newline trains, samples at the end and from its checkpoint") {
  ScratchDir dir;
  std::string text = text_of_length(3000);
  for (char& c : text)
    if (c == '\n') c = ' ';
  spit(dir.file("flat.txt"), text);
  CliRun r = run_cli(dir.path.string(), {"train", "--data", "flat.txt", "--out", "r", "--max-iters", "2",
                                         "--eval-interval", "2", "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
                                         "--block-size", "8", "--batch-size", "4", "--eval-iters", "2",
                                         "--sample-tokens", "20"});
  CHECK_MESSAGE(r.code == 0, r.out);
  CliRun s = run_cli(dir.path.string(), {"sample", "--checkpoint", "r/softmax/checkpoint.safetensors", "--tokens", "20"});
  CHECK_MESSAGE(s.code == 0, s.out);
}

TEST_CASE("options that would lose or misplace a run are refused in one line") {
  ScratchDir dir;
  spit(dir.file("text.txt"), text_of_length(3000));
  check_refused(run_cli(dir.path.string(), with({"train", "--data", "text.txt", "--out", ""}, kTiny)), "--out");
  check_refused(run_cli(dir.path.string(), with({"train", "--data", "text.txt", "--min-lr", "0.01", "--lr", "0.001"}, kTiny)),
                "--min-lr (0.01) is above --lr (0.001)");
  check_refused(run_cli(dir.path.string(), {"compare", "--iters", "0"}), "--iters: must be positive");
  CliRun big = run_cli(dir.path.string(), with({"train", "--data", "text.txt"}, with(kTiny, {"--eval-iters", "99999999999999"})));
  check_refused(big, "evaluation batches");
  CHECK_MESSAGE(refused_in_little_memory(big), big.max_rss_kb, " KiB");
  CHECK_FALSE(fs::exists(dir.path / "runs"));
}
