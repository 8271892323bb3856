// A run directory has one writer, and what it holds is not lost: a second run there is refused while the first
// writes, a finished run is not replaced without --overwrite, a run's files are never its inputs nor replaced by
// another command, --resume refuses a different model, text, seed or batch size by name and never moves a step back,
// SIGINT and SIGTERM end a run after its step with a checkpoint, a text without a newline trains and samples.
#include <doctest/doctest.h>
#include <fmt/core.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "engine/rng.hpp"
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
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
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
  Background first(dir.path.string(),
                   with(with({"train", "--data", "text.txt", "--out", "r", "--name", "same"}, kLong), kTiny));
  REQUIRE(wait_for(dir.path / "r" / "same" / "checkpoint.safetensors"));
  // While it runs, a second run there is refused, naming the process, even with --overwrite or --resume.
  for (const char* extra : {"--overwrite", "--resume"}) {
    CliRun second = run_cli(
        dir.path.string(),
        with({"train", "--data", "text.txt", "--out", "r", "--name", "same", "--max-iters", "4", extra}, kTiny));
    check_refused(second, "is in use by process " + std::to_string(first.pid));
  }
  // SIGTERM: the run ends after its step with a checkpoint, and says so.
  ::kill(first.pid, SIGTERM);
  CHECK(first.wait() == 143);
  const Checkpoint ck = load_checkpoint(dir.file("r/same/checkpoint.safetensors"));
  const int64_t step = std::stoll(ck.metadata.at("tapegrad.step"));
  CHECK(step > 0);
  // A finished or stopped run is not replaced by a new one without --overwrite...
  CliRun again =
      run_cli(dir.path.string(),
              with({"train", "--data", "text.txt", "--out", "r", "--name", "same", "--max-iters", "4"}, kTiny));
  check_refused(again, "holds a run already");
  CHECK(load_checkpoint(dir.file("r/same/checkpoint.safetensors")).metadata.at("tapegrad.step") ==
        std::to_string(step));
  // ... and is with it; the temporaries of every kind of file a run writes are removed when it starts.
  for (const char* f : {".sharpness.csv.tmp-abc123", ".profile.json.tmp-abc123", ".losses.svg.tmp-abc123"})
    spit((dir.path / "r" / "same" / f).string(), "left by a killed write");
  CliRun over = run_cli(dir.path.string(), with({"train", "--data", "text.txt", "--out", "r", "--name", "same",
                                                 "--max-iters", "4", "--eval-interval", "2", "--overwrite"},
                                                kTiny));
  CHECK_MESSAGE(over.code == 0, over.out);
  for (const auto& e : fs::directory_iterator(dir.path / "r" / "same"))
    CHECK_MESSAGE(e.path().filename().string().find(".tmp-") == std::string::npos, e.path().string());
}

TEST_CASE("SIGKILL during train --overwrite never leaves the new run's checkpoint beside the old run's log") {
  // Over a finished run of 20 steps, --overwrite killed in its first 60 ms (where it removes the old run and writes
  // its own first checkpoint and log). Without the removal first, about one kill in ten left a checkpoint of step 0
  // beside a losses.csv that ends at step 20.
  ScratchDir dir;
  spit(dir.file("text.txt"), text_of_length(5000));
  const std::string d = dir.path.string();
  const std::string ck = dir.file("r/softmax/checkpoint.safetensors"), csv = dir.file("r/softmax/losses.csv");
  auto last_logged = [&]() -> int64_t {  // the log's last step; −1 without a log
    if (!fs::exists(csv)) return -1;
    const std::string text = slurp(csv);
    const size_t row = text.find_last_of('\n', text.size() - 2);
    return row == std::string::npos || text.compare(row + 1, 4, "step") == 0 ? -1 : std::stoll(text.substr(row + 1));
  };
  Rng rng(11);
  int old_runs = 0, new_runs = 0, empty = 0;
  for (int k = 0; k < 40; ++k) {
    CAPTURE(k);
    REQUIRE(run_cli(d, with({"train", "--data", "text.txt", "--out", "r", "--max-iters", "20", "--eval-interval", "5",
                             "--overwrite"},
                            kTiny))
                .code == 0);
    Background over(d, with({"train", "--data", "text.txt", "--out", "r", "--max-iters", "1000000", "--eval-interval",
                             "1", "--overwrite"},
                            kTiny));
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(rng.uniform() * 60'000)));
    ::kill(over.pid, SIGKILL);
    over.wait();
    const int64_t step = checkpoint_step(ck), logged = last_logged();
    CAPTURE(step);
    CAPTURE(logged);
    // The old run whole, the old run's checkpoint alone (its log is in it), nothing, or the new run: its log written
    // after each checkpoint, so one step behind it at most.
    const bool old_run = step == 20 && (logged == 20 || logged == -1), nothing = step == -1 && logged == -1;
    const bool new_run = !old_run && step >= 0 && (logged == -1 || (logged >= step - 1 && logged <= step));
    CHECK((old_run || nothing || new_run));
    old_runs += old_run, new_runs += new_run, empty += nothing;
  }
  MESSAGE(old_runs, " kills left the old run, ", empty, " an empty directory, ", new_runs, " the new run");
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
  CliRun resumed =
      run_cli(dir.path.string(), with({"train", "--data", "text.txt", "--out", "r", "--resume", "--max-iters",
                                       std::to_string(std::stoll(step) + 3), "--eval-interval", "5"},
                                      kTiny));
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
                                                 "--eval-interval", "2", "--stop-after", "2", "--gelu", "tanh"},
                                                kTiny));
  REQUIRE_MESSAGE(made.code == 0, made.out);
  const std::string before = slurp(dir.file("r/softmax/checkpoint.safetensors"));
  auto resume = [&](std::vector<std::string> extra) {
    return run_cli(
        dir.path.string(),
        with(with({"train", "--out", "r", "--max-iters", "4", "--eval-interval", "2", "--resume"}, extra), kTiny));
  };
  check_refused(resume({"--data", "text.txt", "--gelu", "exact"}), "--gelu tanh, this run asks for --gelu exact");
  check_refused(resume({"--data", "text.txt", "--gelu", "tanh", "--dropout", "0.1"}),
                "--dropout 0, this run asks for --dropout 0.1");
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
  CliRun r = run_cli(dir.path.string(), {"train", "--data",          "flat.txt", "--out",           "r", "--max-iters",
                                         "2",     "--eval-interval", "2",        "--n-layer",       "1", "--n-head",
                                         "2",     "--n-embd",        "16",       "--block-size",    "8", "--batch-size",
                                         "4",     "--eval-iters",    "2",        "--sample-tokens", "20"});
  CHECK_MESSAGE(r.code == 0, r.out);
  CliRun s =
      run_cli(dir.path.string(), {"sample", "--checkpoint", "r/softmax/checkpoint.safetensors", "--tokens", "20"});
  CHECK_MESSAGE(s.code == 0, s.out);
}

TEST_CASE("options that would lose or misplace a run are refused in one line") {
  ScratchDir dir;
  spit(dir.file("text.txt"), text_of_length(3000));
  check_refused(run_cli(dir.path.string(), with({"train", "--data", "text.txt", "--out", ""}, kTiny)), "--out");
  check_refused(
      run_cli(dir.path.string(), with({"train", "--data", "text.txt", "--min-lr", "0.01", "--lr", "0.001"}, kTiny)),
      "--min-lr (0.01) is above --lr (0.001)");
  check_refused(run_cli(dir.path.string(), {"compare", "--iters", "0"}), "--iters: must be positive");
  CliRun big = run_cli(dir.path.string(),
                       with({"train", "--data", "text.txt"}, with(kTiny, {"--eval-iters", "99999999999999"})));
  check_refused(big, "evaluation batches");
  CHECK_MESSAGE(refused_in_little_memory(big), big.max_rss_kb, " KiB");
  CHECK_FALSE(fs::exists(dir.path / "runs"));
}

TEST_CASE(
    "train refuses a file of its run that is one of its inputs, through symbolic links, before writing anything") {
  ScratchDir dir;
  CliRun made = make_tiny_run(dir.path, 2);
  REQUIRE_MESSAGE(made.code == 0, made.out);
  const std::string text = slurp(dir.file("text.txt"));
  const fs::path run = dir.path / "made" / "softmax";
  const auto train = [&](std::vector<std::string> extra) {
    return run_cli(dir.path.string(),
                   with(with({"train", "--out", "made", "--max-iters", "2", "--eval-interval", "2"}, extra), kTiny));
  };
  SUBCASE("losses.csv a link to the text") {
    fs::remove(run / "losses.csv");
    fs::create_symlink("../../text.txt", run / "losses.csv");
    const auto before = snapshot(dir.path);
    check_refused(train({"--data", "text.txt", "--overwrite"}),
                  "the run's losses.csv 'made/softmax/losses.csv' is the "
                  "file --data reads ('text.txt')");
    CHECK(snapshot(dir.path) == before);
    CHECK(slurp(dir.file("text.txt")) == text);
  }
  SUBCASE("--data the run's own log") {
    const std::string csv = slurp((run / "losses.csv").string());
    const auto before = snapshot(dir.path);
    check_refused(train({"--data", "made/softmax/losses.csv", "--overwrite"}), "is the file --data reads");
    CHECK(snapshot(dir.path) == before);
    CHECK(slurp((run / "losses.csv").string()) == csv);
  }
  SUBCASE("a plot that is the config file") {
    spit(dir.file("run.ini"), "eval-iters = 2\n");
    fs::create_symlink("../../run.ini", run / "sharpness.svg");
    check_refused(train({"--data", "text.txt", "--overwrite", "--config", "run.ini"}),
                  "the run's sharpness.svg 'made/softmax/sharpness.svg' is the file --config reads ('run.ini')");
    CHECK(slurp(dir.file("run.ini")) == "eval-iters = 2\n");
  }
  SUBCASE("with --resume, a log that is the checkpoint it continues from") {
    const std::string ck = slurp((run / "checkpoint.safetensors").string());
    fs::remove(run / "losses.svg");
    fs::create_symlink("checkpoint.safetensors", run / "losses.svg");
    check_refused(train({"--data", "text.txt", "--resume", "--max-iters", "4"}),
                  "is its checkpoint 'made/softmax/checkpoint.safetensors', which --resume reads");
    CHECK(slurp((run / "checkpoint.safetensors").string()) == ck);
  }
  SUBCASE("a log that is another run's") {
    fs::create_directories(dir.path / "made" / "other");
    fs::create_symlink("../softmax/losses.csv", dir.path / "made" / "other" / "losses.csv");
    const auto before = snapshot(dir.path);
    check_refused(train({"--data", "text.txt", "--name", "other"}), "is a file of the run in 'made/softmax'");
    CHECK(snapshot(dir.path) == before);
  }
}

TEST_CASE("no command replaces a file of a run: evaluate --hvp-out, graph -o, compare's plot") {
  ScratchDir dir;
  CliRun made = make_tiny_run(dir.path, 2);
  REQUIRE_MESSAGE(made.code == 0, made.out);
  const auto before = snapshot(dir.path);
  check_refused(run_cli(dir.path.string(), {"evaluate", "--checkpoint", kTinyCheckpoint, "--text", "the quick",
                                            "--hvp-out", "made/softmax/losses.csv"}),
                "--hvp-out 'made/softmax/losses.csv' is a file of the run in 'made/softmax'");
  check_refused(
      run_cli(dir.path.string(), {"graph", "--op", "softmax", "--format", "dot", "-o", "made/softmax/losses.csv"}),
      "graph: -o 'made/softmax/losses.csv' is a file of the run in 'made/softmax'");
  fs::create_symlink("made/softmax/losses.svg", dir.path / "plot.svg");  // through a link too
  check_refused(run_cli(dir.path.string(), {"graph", "--op", "softmax", "-o", "plot.svg"}), "through a symbolic link");
  fs::remove(dir.path / "plot.svg");
  CHECK(snapshot(dir.path) == before);
  // A new file in a run's directory, and any file outside one, are written.
  CliRun dot = run_cli(dir.path.string(), {"graph", "--op", "softmax", "-o", "made/softmax/softmax.dot"});
  CHECK_MESSAGE(dot.code == 0, dot.out);
  CliRun hvp = run_cli(dir.path.string(), {"evaluate", "--checkpoint", kTinyCheckpoint, "--text", "the quick",
                                           "--hvp-out", "hvp.safetensors"});
  CHECK_MESSAGE(hvp.code == 0, hvp.out);
  hvp = run_cli(dir.path.string(),
                {"evaluate", "--checkpoint", kTinyCheckpoint, "--text", "the quick", "--hvp-out", "hvp.safetensors"});
  CHECK_MESSAGE(hvp.code == 0, hvp.out);
  // compare's plot goes beside its runs; in a directory that holds a run, an existing one is not replaced.
  spit(dir.file("made/softmax/val_loss.svg"), "<svg/>");
  check_refused(run_cli(dir.path.string(), {"compare", "--out", "made", "--name", "softmax", "--attention", "softmax",
                                            "--iters", "1", "--data", "text.txt"}),
                "compare's plot 'made/softmax/val_loss.svg' is a file of the run in 'made/softmax'");
}

TEST_CASE("a resumed run's step never moves backwards; --stop-after near 2^63 runs to the end; 0 is refused") {
  ScratchDir dir;
  CliRun made = make_tiny_run(dir.path, 4);
  REQUIRE_MESSAGE(made.code == 0, made.out);
  const std::string ck = slurp(dir.file(kTinyCheckpoint));
  const std::string csv = slurp(dir.file("made/softmax/losses.csv"));
  auto resume = [&](std::vector<std::string> extra) {
    return run_cli(
        dir.path.string(),
        with(with({"train", "--data", "text.txt", "--out", "made", "--eval-interval", "2", "--resume"}, extra), kTiny));
  };
  check_refused(resume({"--max-iters", "2"}), "is at step 4, past the run's last step 2 (--max-iters)");
  CHECK(slurp(dir.file(kTinyCheckpoint)) == ck);
  CHECK(slurp(dir.file("made/softmax/losses.csv")) == csv);
  check_refused(resume({"--max-iters", "6", "--stop-after", "0"}), "--stop-after: must be positive, got 0");
  CHECK(slurp(dir.file(kTinyCheckpoint)) == ck);
  // first step + stop-after would overflow int64: the run goes to --max-iters, and can be resumed again.
  CliRun far = resume({"--max-iters", "6", "--stop-after", "9223372036854775807"});
  REQUIRE_MESSAGE(far.code == 0, far.out);
  CHECK(load_checkpoint(dir.file(kTinyCheckpoint)).metadata.at("tapegrad.step") == "6");
  CliRun again = resume({"--max-iters", "8", "--stop-after", "9223372036854775806"});
  CHECK_MESSAGE(again.code == 0, again.out);
  CHECK(load_checkpoint(dir.file(kTinyCheckpoint)).metadata.at("tapegrad.step") == "8");
}

TEST_CASE("--resume refuses another seed or batch size by name unless --allow-change") {
  ScratchDir dir;
  CliRun made = make_tiny_run(dir.path, 2);
  REQUIRE_MESSAGE(made.code == 0, made.out);
  const std::string ck = slurp(dir.file(kTinyCheckpoint));
  auto resume = [&](std::vector<std::string> extra) {
    return run_cli(dir.path.string(),
                   with(with({"train"}, kTiny), with({"--data", "text.txt", "--out", "made", "--eval-interval", "2",
                                                      "--max-iters", "4", "--resume"},
                                                     extra)));
  };
  check_refused(resume({"--seed", "7"}),
                "was trained with --seed 1337, this run asks for --seed 7; --allow-change lets");
  check_refused(resume({"--batch-size", "5"}), "was trained with --batch-size 4, this run asks for --batch-size 5");
  CHECK(slurp(dir.file(kTinyCheckpoint)) == ck);
  CliRun allowed = resume({"--seed", "7", "--batch-size", "5", "--allow-change"});
  CHECK_MESSAGE(allowed.code == 0, allowed.out);
}

TEST_CASE("run names, --resume with --overwrite, compare's kinds, config lines without a key, TAPEGRAD_NUM_THREADS") {
  ScratchDir dir;
  spit(dir.file("text.txt"), text_of_length(3000));
  const auto train = [&](std::vector<std::string> extra) {
    return run_cli(
        dir.path.string(),
        with(with({"train", "--data", "text.txt", "--out", "r", "--max-iters", "1", "--eval-interval", "1"}, extra),
             kTiny));
  };
  for (const char* name : {"../../x", "..", ".", "a/b"})
    check_refused(train({"--name", name}), fmt::format("--name '{}': a run's name is one directory name", name));
  check_refused(train({"--resume", "--overwrite"}), "give one of them");
  check_refused(run_cli(dir.path.string(), {"compare", "--attention", "softmax,beta,softmax", "--iters", "1", "--data",
                                            "text.txt", "--out", "c"}),
                "--attention names softmax twice");
  check_refused(run_cli(dir.path.string(), {"compare", "--name", "../up", "--iters", "1", "--data", "text.txt"}),
                "--name '../up'");
  CHECK_FALSE(fs::exists(dir.path / "r"));
  CHECK_FALSE(fs::exists(dir.path / "c"));
  CHECK_FALSE(fs::exists(dir.path / "x"));
  CHECK_FALSE(fs::exists(dir.path.parent_path() / "up"));
  // A config line with no key, or too short to be key = value, is refused by its number.
  spit(dir.file("nokey.ini"), "# a run\neval-iters = 2\n=5\n");
  check_refused(train({"--config", "nokey.ini"}), "config file nokey.ini: line 3: '=5' has no key before '='");
  spit(dir.file("spaced.ini"), "eval-iters = 2\n  = 5  \n");
  check_refused(train({"--config", "spaced.ini"}), "line 2: '= 5' has no key");
  spit(dir.file("short.ini"), "eval-iters = 2\n\nq\n");
  check_refused(train({"--config", "short.ini"}), "line 3: 'q' is not a key = value line");
  // A list never closed: CLI11's reader took its first value alone ("[1," then "2" gave one layer).
  spit(dir.file("open.ini"), "n-layer = [1,\n2\n");
  check_refused(train({"--config", "open.ini"}),
                "config file open.ini: line 1: the list of 'n-layer' opened with '[' is not closed with ']' before the "
                "file ends");
  spit(dir.file("open2.ini"), "n-layer = [1,\n2\neval-iters = 2\n");
  check_refused(train({"--config", "open2.ini"}),
                "line 1: the list of 'n-layer' opened with '[' is not closed with "
                "']' before the key on line 3");
  CHECK_FALSE(fs::exists(dir.path / "r"));
  // TAPEGRAD_NUM_THREADS that is not a number of threads is named on stderr when the engine's pool is made (a
  // gradcheck makes it); the work goes on with the CPUs.
  auto gradcheck = [&] { return run_cli(dir.path.string(), {"gradcheck", "--op", "exp"}); };
  for (const char* bad : {"-5", "abc", "0", "4x", "99999999999999999999"}) {
    CAPTURE(bad);
    setenv("TAPEGRAD_NUM_THREADS", bad, 1);
    CliRun r = gradcheck();
    CHECK_MESSAGE(r.code == 0, r.out);
    CHECK_MESSAGE(r.out.find(fmt::format("warning: TAPEGRAD_NUM_THREADS={} is not a number of threads", bad)) !=
                      std::string::npos,
                  r.out);
  }
  setenv("TAPEGRAD_NUM_THREADS", "1000", 1);
  CliRun capped = gradcheck();
  CHECK_MESSAGE(capped.code == 0, capped.out);
  CHECK_MESSAGE(
      capped.out.find("TAPEGRAD_NUM_THREADS=1000 is above the limit of 256 threads; using 256") != std::string::npos,
      capped.out);
  setenv("TAPEGRAD_NUM_THREADS", "2", 1);
  CliRun fine = gradcheck();
  CHECK_MESSAGE(fine.code == 0, fine.out);
  CHECK_MESSAGE(fine.out.find("TAPEGRAD_NUM_THREADS") == std::string::npos, fine.out);
  unsetenv("TAPEGRAD_NUM_THREADS");
}
