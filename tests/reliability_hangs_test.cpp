// Nothing waits for ever, and every long loop answers a signal: an input that is a fifo or a device is refused
// before it is opened, an output fifo without a reader is refused, a checkpoint header of many tensors parses in
// linear time, a sample has a bounded length, sampling and evaluation stop within a second of SIGTERM or SIGINT,
// bench bounds its threads and the time it waits for PyTorch. And the README's promises: `-o /dev/stdout` into a
// pipe or an appended file, non-finite weights refused by sample and evaluate, formula errors that show control
// bytes instead of sending them to the terminal.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "models/checkpoint.hpp"
#include "models/files.hpp"
#include "checker/formulas/expression.hpp"
#include "reliability_util.hpp"
#include "training_test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A refusal: exit code 2 (not a signal, such as the SIGALRM of a hang), naming `expect`.
void check_refused(const CliRun& r, const std::string& expect) {
  CHECK_MESSAGE(r.signal == 0, r.out);
  CHECK_MESSAGE(r.code == 2, r.out);
  CHECK_MESSAGE(r.out.find(expect) != std::string::npos, r.out);
}

// The program started in the background, its stdout and stderr into `out_path` (opened with O_APPEND when
// `append`, as the shell's >> does; /dev/null when empty).
struct Background {
  pid_t pid = -1;
  Background(const std::string& cwd, const std::vector<std::string>& args, const std::string& out_path = "",
             bool append = false) {
    std::string program = TAPEGRAD_CLI;
    std::vector<std::string> copy = args;
    std::vector<char*> argv{program.data()};
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string out = out_path.empty() ? "/dev/null" : out_path;
    pid = fork();
    if (pid == 0) {
      const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644);
      if (fd < 0 || chdir(cwd.c_str()) != 0) _exit(126);
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      alarm(300);
      execv(program.c_str(), argv.data());
      _exit(127);
    }
  }
  // The raw wait status: an exit with code 143 and a death by SIGTERM are told apart.
  int wait_status() {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    return status;
  }
};

bool exited_with(int status, int code) { return WIFEXITED(status) && WEXITSTATUS(status) == code; }

bool wait_until(const std::function<bool()>& ready, double seconds = 60) {
  const auto t0 = Clock::now();
  while (!ready()) {
    if (seconds_since(t0) > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace

TEST_CASE("an input that is a fifo or a device is refused before it is opened, naming the path") {
  ScratchDir dir;
  spit(dir.file("text.txt"), text_of_length(3000));
  const std::string fifo = dir.file("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);  // no writer: opening it to read would wait for ever
  const auto t0 = Clock::now();
  CHECK_THROWS_WITH_AS(read_file(fifo, 1 << 20), doctest::Contains("not a regular file (a fifo)"), Error);
  CHECK_THROWS_WITH_AS(load_checkpoint(fifo), doctest::Contains("not a regular file"), Error);
  CHECK_THROWS_WITH_AS(read_file("/dev/null", 1 << 20), doctest::Contains("'/dev/null': not a regular file"), Error);
  CHECK_THROWS_WITH_AS(read_file("/dev/zero", 1 << 20), doctest::Contains("a character device"), Error);
  CHECK(seconds_since(t0) < 1 * kSanitizerSlowdown);

  const std::string d = dir.path.string();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"train", "--data", "fifo", "--max-iters", "1"}, "fifo is not a regular file (a fifo)"},
      {{"train", "--data", "text.txt", "--config", "fifo"}, "'fifo': not a regular file (a fifo)"},
      {{"train", "--data", "text.txt", "--config=fifo"}, "'fifo': not a regular file (a fifo)"},
      {{"sample", "--checkpoint", "fifo"}, "fifo is not a regular file (a fifo)"},
      {{"evaluate", "--checkpoint", "fifo", "--text", "ab"}, "fifo is not a regular file (a fifo)"},
      {{"claim", "--file", "fifo"}, "'fifo': not a regular file (a fifo)"},
      {{"train", "--data", "/dev/null", "--max-iters", "1"}, "/dev/null is not a regular file (a character device)"},
      {{"sample", "--checkpoint", "/dev/zero"}, "/dev/zero is not a regular file (a character device)"},
  };
  for (const auto& [args, expect] : cases) {
    CAPTURE(args);
    const auto start = Clock::now();
    check_refused(run_cli(d, args, 20), expect);
    CHECK(seconds_since(start) < 10);
  }
  CHECK(fs::is_fifo(fs::symlink_status(fifo)));
  CHECK_FALSE(fs::exists(dir.path / "runs"));
}

TEST_CASE("an output fifo without a reader is refused within a second or two, not waited on") {
  ScratchDir dir;
  const std::string fifo = dir.file("out.csv");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto t0 = Clock::now();
  CHECK_THROWS_WITH_AS(write_file_atomic(fifo, "x"), doctest::Contains("it is a fifo and nothing reads from it"),
                       Error);
  CHECK(seconds_since(t0) < 3 * kSanitizerSlowdown);
  CHECK(fs::is_fifo(fs::symlink_status(fifo)));

  // A run whose losses.csv is such a fifo ends with that error, and lets go of its directory.
  spit(dir.file("text.txt"), text_of_length(3000));
  fs::create_directories(dir.path / "runs" / "x");
  REQUIRE(::mkfifo(dir.file("runs/x/losses.csv").c_str(), 0600) == 0);
  t0 = Clock::now();
  CliRun r = run_cli(
      dir.path.string(),
      with({"train", "--data", "text.txt", "--max-iters", "4", "--eval-interval", "2", "--out", "runs", "--name", "x"},
           kTiny),
      60);
  check_refused(r, "losses.csv': it is a fifo and nothing reads from it");
  CHECK(seconds_since(t0) < 20);
  CHECK(fs::is_fifo(fs::symlink_status(dir.path / "runs" / "x" / "losses.csv")));
}

TEST_CASE("a checkpoint header of 100,000 empty tensors parses in linear time") {
  std::string header = "{";
  constexpr int kTensors = 100'000;
  for (int i = 0; i < kTensors; ++i)
    header += fmt::format("{}\"t{}\":{{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", i ? "," : "", i);
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string file;
  for (int i = 0; i < 8; ++i) file.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  file += header;
  REQUIRE(header.size() < kMaxHeaderBytes);
  const auto t0 = Clock::now();
  const Checkpoint ck = parse_checkpoint(file, "many.safetensors");
  const double took = seconds_since(t0);
  CHECK(ck.tensors.size() == static_cast<size_t>(kTensors));
  CHECK_MESSAGE(took < 3 * kSanitizerSlowdown, took, " s");  // quadratic parsing took minutes
}

TEST_CASE("the length of a sample is bounded, and SIGTERM stops a long sample within a second") {
  ScratchDir dir;
  spit(dir.file("text.txt"), text_of_length(3000));
  const std::string d = dir.path.string();
  check_refused(run_cli(d,
                        with({"train", "--data", "text.txt", "--max-iters", "2", "--out", "runs"},
                             with(kTiny, {"--sample-tokens", "9223372036854775807"})),
                        60),
                "--sample-tokens must lie in [0, 1000000], got 9223372036854775807");
  CHECK_FALSE(fs::exists(dir.path / "runs"));
  REQUIRE(make_tiny_run(dir.path, 2).code == 0);
  check_refused(run_cli(d, {"sample", "--checkpoint", kTinyCheckpoint, "--tokens", "9223372036854775807"}, 60),
                "--tokens must be at most 1000000");

  // A run that samples a million characters at its end: SIGTERM while it samples ends it at once, the run kept.
  Background run(d, with({"train", "--data", "text.txt", "--max-iters", "4", "--eval-interval", "2", "--out", "long"},
                         with(kTiny, {"--sample-tokens", "1000000"})));
  const std::string ck = dir.file("long/softmax/checkpoint.safetensors");
  REQUIRE(wait_until([&] { return checkpoint_step(ck) == 4; }));  // the final checkpoint: sampling comes next
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = Clock::now();
  ::kill(run.pid, SIGTERM);
  const int status = run.wait_status();
  CHECK_MESSAGE(seconds_since(t0) < 1.5 * kSanitizerSlowdown, seconds_since(t0), " s");
  CHECK(exited_with(status, 143));
  CHECK(checkpoint_step(ck) == 4);
}

TEST_CASE("SIGTERM or SIGINT during a long evaluation ends the run within a second, with a checkpoint") {
  ScratchDir dir;
  spit(dir.file("text.txt"), text_of_length(3000));
  for (int sig : {SIGTERM, SIGINT}) {
    CAPTURE(sig);
    const std::string name = sig == SIGTERM ? "term" : "int";
    // 200,000 evaluation batches per split: tens of seconds of evaluation before step 0.
    Background run(dir.path.string(),
                   with({"train", "--data", "text.txt", "--max-iters", "10", "--out", "runs", "--name", name},
                        with(kTiny, {"--eval-iters", "200000"})));
    REQUIRE(wait_until([&] { return fs::exists(dir.path / "runs" / name); }));
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    const auto t0 = Clock::now();
    ::kill(run.pid, sig);
    const int status = run.wait_status();
    CHECK_MESSAGE(seconds_since(t0) < 1.5 * kSanitizerSlowdown, seconds_since(t0), " s");
    CHECK(exited_with(status, 128 + sig));
    CHECK(checkpoint_step(dir.file("runs/" + name + "/checkpoint.safetensors")) == 0);
  }
}

TEST_CASE("bench refuses more threads than its pool, and fails when PyTorch cannot start or does not answer") {
  ScratchDir dir;
  const std::string d = dir.path.string();
  check_refused(run_cli(d, {"bench", "--threads", "100000", "--quick"}, 60),
                "--threads: must be at most 256 (the engine's pool takes at most 256 threads), got 100000");
  check_refused(run_cli(d, {"bench", "--vs-torch", "--python", "/nonexistent", "--quick", "--only", "matmul"}, 60),
                "PyTorch is not available: cannot start /nonexistent");
  // A PyTorch side that never answers: stopped after --torch-timeout, and the bench fails saying so.
  spit(dir.file("hang.py"), "import time\ntime.sleep(1000)\n");
  const auto t0 = Clock::now();
  check_refused(run_cli(d,
                        {"bench", "--vs-torch", "--python", "python3", "--torch-script", "hang.py", "--torch-timeout",
                         "1", "--quick", "--only", "matmul"},
                        60),
                "(hang.py) gave no answer to 'info' within 1 s (--torch-timeout)");
  CHECK(seconds_since(t0) < 20);
}

TEST_CASE("graph -o /dev/stdout writes into a pipe, and appends to a file opened with >>") {
  ScratchDir dir;
  const std::string d = dir.path.string();
  CliRun piped = run_cli(d, {"graph", "--op", "softmax", "--format", "dot", "-o", "/dev/stdout"}, 60);  // a pipe
  CHECK_MESSAGE(piped.code == 0, piped.out);
  CHECK(piped.out.find("digraph tape {") != std::string::npos);  // after a warning on stderr, if any
  CHECK(piped.out.find("wrote") == std::string::npos);           // nothing but the graph on the stream

  spit(dir.file("log.txt"), "earlier line\n");
  Background appended(d, {"graph", "--op", "softmax", "--format", "dot", "-o", "/dev/stdout"}, dir.file("log.txt"),
                      true);
  CHECK(exited_with(appended.wait_status(), 0));
  const std::string log = slurp(dir.file("log.txt"));
  CHECK(log.rfind("earlier line\n", 0) == 0);  // kept: appended to, not replaced
  CHECK(log.find("digraph tape {") != std::string::npos);
  CHECK(fs::is_regular_file(fs::symlink_status(dir.path / "log.txt")));
}

TEST_CASE("sample and evaluate refuse a checkpoint with a NaN or infinite weight, naming it") {
  ScratchDir dir;
  REQUIRE(make_tiny_run(dir.path, 2).code == 0);
  Checkpoint ck = load_checkpoint(dir.file(kTinyCheckpoint));
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    CAPTURE(bad);
    Checkpoint damaged = ck;
    for (auto& nt : damaged.tensors)
      if (nt.name == "transformer.h.0.mlp.c_fc.weight") {
        nt.tensor = nt.tensor.clone();
        nt.tensor.data<float>()[7] = bad;
      }
    save_checkpoint(dir.file("bad.safetensors"), damaged);
    const std::string expect = "parameter transformer.h.0.mlp.c_fc.weight holds ";
    check_refused(run_cli(dir.path.string(), {"sample", "--checkpoint", "bad.safetensors", "--tokens", "5"}, 60),
                  expect);
    check_refused(
        run_cli(dir.path.string(), {"evaluate", "--checkpoint", "bad.safetensors", "--text", "the quick"}, 60), expect);
  }
}

TEST_CASE("a formula error shows control bytes escaped, and a NUL does not cut the message") {
  try {
    Formula::parse(std::string("exp(x) \x01 + 1"), "f");
    FAIL("no error");
  } catch (const ExpressionError& e) {
    const std::string what = e.what();
    CHECK(what.find("unexpected '\\x01'") != std::string::npos);
    CHECK(what.find("exp(x) \\x01 + 1") != std::string::npos);
    CHECK(what.find('\x01') == std::string::npos);
    // The caret stands under the escape: two spaces of indent, then the columns of "exp(x) ".
    CHECK(what.find("\n  " + std::string(7, ' ') + "^") != std::string::npos);
  }
  try {
    Formula::parse(std::string("exp(x) \0 + 1", 12), "f");
    FAIL("no error");
  } catch (const ExpressionError& e) {
    const std::string what = e.what();
    CHECK(std::strlen(e.what()) == what.size());  // no NUL inside: the whole message reads as a C string
    CHECK(what.find("exp(x) \\x00 + 1") != std::string::npos);
    CHECK(what.find('^') != std::string::npos);
  }
  // Through the program: a claims file whose formula holds a NUL and an escape byte.
  ScratchDir dir;
  spit(dir.file("c.claims"),
       std::string("claim c\ninput x: 3\nforward y = exp(x) \x1b[2J") + '\0' + " + 1\nvjp x = g * y\n");
  CliRun r = run_cli(dir.path.string(), {"claim", "--file", "c.claims"}, 60);
  CAPTURE(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find('\x1b') == std::string::npos);
  CHECK(r.out.find('\0') == std::string::npos);
  CHECK(r.out.find("\\x1b[2J\\x00 + 1") != std::string::npos);
}
