// The tapegrad program misused: every wrong command line, value or input file gets a one-line message on stderr,
// exit code 2, and leaves the file system as it was (no run directory, no checkpoint, no temporary). Then the
// guards of a real run: exact resume through the command line, and a run whose loss turns non-finite.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "models/checkpoint.hpp"
#include "reliability_util.hpp"
#include "training_test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

// The input files of the misuse cases, and a run of a `super` model with a context of 8 (made/super/, its
// checkpoint also as super.safetensors).
struct Inputs {
  ScratchDir dir;
  Inputs() {
    spit(dir.file("text.txt"), text_of_length(3000));
    spit(dir.file("empty.txt"), "");
    std::string binary;
    for (int i = 0; i < 4096; ++i) binary.push_back(static_cast<char>((i * 131 + 7) % 256));
    spit(dir.file("binary.bin"), binary);
    spit(dir.file("latin1.txt"), "caf\xe9 au lait, cr\xe8me br\xfbl\xe9\x65\n");  // ISO-8859-1, not UTF-8
    spit(dir.file("short.txt"), "0123456789");
    std::filesystem::create_directory(dir.path / "adir");
    spit(dir.file("unknown_key.ini"), "n-layer = 2\nlearning-rate = 0.1\n");
    spit(dir.file("bad_value.ini"), "n-head = -4\n");
    spit(dir.file("infinite_lr.ini"), "n-layer = 2\nlr = inf\n");
    spit(dir.file("binary.ini"), binary);
    spit(dir.file("notes.txt"), "these are notes, not a checkpoint\n");
    CliRun r = run_cli(dir.path.string(), with({"train", "--attention", "super", "--data", "text.txt", "--max-iters",
                                                "4", "--eval-interval", "2", "--out", "made"},
                                               kTiny));
    REQUIRE_MESSAGE(r.code == 0, r.out);
    std::filesystem::copy_file(dir.path / "made/super/checkpoint.safetensors", dir.path / "super.safetensors");
    std::string ck = tapegrad::testing::slurp(dir.file("super.safetensors"));
    spit(dir.file("truncated.safetensors"), ck.substr(0, ck.size() / 2));
  }
};

struct Case {
  std::vector<std::string> args;
  std::string expect;  // a part of the message
};

std::vector<Case> cli_cases() {
  const std::string long_text(40, 'e');  // 40 characters, more than the context of 8 plus one
  return {
      // flags and values
      {{"train", "--bogus-flag"}, "--bogus-flag"},
      {{"train", "--n-layer", "-1"}, "--n-layer: must be positive, got -1"},
      {{"train", "--n-head", "0"}, "--n-head: must be positive"},
      {{"train", "--n-embd", "30", "--n-head", "4"}, "n_embd (30) must be divisible by n_head (4)"},
      {{"train", "--n-embd", "0"}, "--n-embd: must be positive"},
      {{"train", "--attention", "quadratic"}, "quadratic"},
      {{"train", "--attention", ""}, "--attention"},
      {{"train", "--batch-size", "0"}, "--batch-size: must be positive"},
      {{"train", "--block-size", "-8"}, "--block-size: must be positive"},
      {{"train", "--max-iters", "-5"}, "--max-iters: must be non-negative"},
      {{"train", "--lr", "-1"}, "--lr: must be positive"},
      {{"train", "--lr", "fast"}, "--lr: expected a number, got 'fast'"},
      {{"train", "--n-layer", "2.5"}, "--n-layer"},
      {{"train", "--dropout", "1.5"}, "--dropout"},
      {{"train", "--beta2", "1"}, "--beta2"},
      {{"train", "--seed", "-1"}, "--seed: must be non-negative"},
      {{"train", "--max-iters", "99999999999999999999"}, "--max-iters: 99999999999999999999 is out of range"},
      {{"gradcheck", "--op", "exp", "--seed", "99999999999999999999999"},
       "--seed: 99999999999999999999999 is out of range"},
      {{"evaluate", "--checkpoint", "super.safetensors", "--text", "the", "--hvp-seed", "-1"},
       "--hvp-seed: must be non-negative, got -1"},
      {{"bench", "--threads", "0"}, "--threads: must be positive, got 0"},
      {{"train", "--eval-iters", "0"}, "--eval-iters: must be positive"},
      {{"train", "--warmup-iters", "-1"}, "--warmup-iters"},
      {{"train", "--stop-after", "-3"}, "--stop-after"},
      {{"train", "--no-bias=99999999999999999999999"}, "out of range"},  // found by fuzz_config
      {{"train", "--batch-size"}, "--batch-size"},
      // data files
      {{"train", "--data", "missing.txt"}, "no such file: missing.txt"},
      {{"train", "--data", "text.txt/inner.txt"}, "cannot reach text.txt/inner.txt: Not a directory"},
      {{"train", "--data", "empty.txt"}, "empty"},
      {{"train", "--data", "binary.bin"}, "binary"},
      {{"train", "--data", "latin1.txt"}, "invalid UTF-8 at byte offset 3"},
      {{"train", "--data", "adir"}, "adir"},
      {{"train", "--data", "short.txt", "--block-size", "64"}, "longer than one context of 64 tokens"},
      {{"train", "--data", "text.txt", "--block-size", "1024"}, "longer than one context of 1024 tokens"},
      // run directories, resuming, the super kind's context
      {{"train", "--data", "text.txt", "--out", "notes.txt"}, "notes.txt"},
      {{"train", "--data", "text.txt", "--resume", "--out", "nowhere"},
       "there is no run to continue in 'nowhere/softmax'"},
      {with({"train", "--attention", "super", "--data", "text.txt", "--resume", "--out", "made"},
            with(kTiny, {"--block-size", "16"})),
       "another model"},
      {with({"train", "--attention", "softmax", "--data", "text.txt", "--resume", "--out", "made", "--name", "super"},
            kTiny),
       "another model"},
      // config files
      {{"train", "--config", "missing.ini"}, "missing.ini"},
      {{"train", "--config", "unknown_key.ini"}, "--learning-rate"},
      {{"train", "--config", "bad_value.ini"}, "--n-head: must be positive"},
      // non-finite numbers, in any floating option of any command and in the config file
      {{"train", "--lr", "inf"}, "--lr: must be a finite number, got inf"},
      {{"train", "--lr", "-inf"}, "--lr: must be positive"},
      {{"train", "--lr", "nan"}, "--lr: must be positive"},
      {{"train", "--min-lr", "1e999"}, "--min-lr: must be a finite number"},
      {{"train", "--weight-decay", "infinity"}, "--weight-decay: must be a finite number"},
      {{"train", "--grad-clip", "inf"}, "--grad-clip: must be a finite number"},
      {{"train", "--config", "infinite_lr.ini"}, "--lr: must be a finite number, got inf"},
      {{"compare", "--lr", "inf"}, "--lr: must be a finite number"},
      {{"bench", "--dropout", "nan"}, "--dropout: must be a finite number"},
      {{"gradcheck", "--rtol", "inf"}, "--rtol: must be a finite number"},
      {{"train", "--precision", "fp16"}, "--precision"},
      {{"train", "--n-layer", "100000"}, "more than the"},  // refused from the estimate, before allocating
      // graph: the format and the output's extension must agree
      {{"graph", "--op", "softmax", "--format", "png", "-o", "g.svg"}, "--format png contradicts the output g.svg"},
      {{"graph", "--op", "softmax", "-o", "g.pdf"}, "the extension .pdf names no format"},
      {{"train", "--config", "binary.ini"}, "not a text file"},
      {{"train", "--config", "adir"}, "directory"},
      {{"train", "--config", "/dev/zero"}, "device"},
      // sample
      {{"sample"}, "--checkpoint"},
      {{"sample", "--checkpoint", "missing.safetensors"}, "missing.safetensors"},
      {{"sample", "--checkpoint", "notes.txt"}, "notes.txt"},
      {{"sample", "--checkpoint", "truncated.safetensors"}, "truncated"},
      {{"sample", "--checkpoint", "super.safetensors", "--tokens", "-5"}, "--tokens: must be non-negative"},
      {{"sample", "--checkpoint", "super.safetensors", "--temperature", "0"}, "--temperature: must be positive"},
      {{"sample", "--checkpoint", "super.safetensors", "--temperature", "inf"},
       "--temperature: must be a finite number"},
      {{"sample", "--checkpoint", "super.safetensors", "--top-k", "-1"}, "--top-k"},
      {{"sample", "--checkpoint", "super.safetensors", "--prompt", "QZ"}, "not in the vocabulary"},
      {{"sample", "--checkpoint", "super.safetensors", "--prompt", "caf\xe9"}, "invalid UTF-8"},
      // evaluate: a super checkpoint with a longer text than its context
      {{"evaluate", "--checkpoint", "super.safetensors", "--text", long_text}, "context of 8"},
      {{"evaluate", "--checkpoint", "super.safetensors", "--text", "t"}, "at least 2 characters"},
      {{"evaluate", "--checkpoint", "super.safetensors", "--text", "the QUICK"}, "not in the vocabulary"},
      {{"evaluate", "--checkpoint", "truncated.safetensors", "--text", "the"}, "truncated"},
      {{"evaluate", "--checkpoint", "super.safetensors"}, "--text"},
      // compare, gradcheck, the program itself
      {{"compare", "--attention", "softmax,quadratic"}, "quadratic"},
      {{"compare", "--iters", "-1"}, "--iters: must be positive"},
      {{"gradcheck", "--op", "no_such_op"}, "no_such_op"},
      {{"gradcheck", "--atol", "-1"}, "--atol: must be positive"},
      {{}, "subcommand"},
      {{"fly"}, "subcommand"},
  };
}

std::string shown(const std::vector<std::string>& args) {
  std::string s = "tapegrad";
  for (const auto& a : args) s += " " + (a.empty() ? std::string("''") : a);
  return s;
}

}  // namespace

TEST_CASE("misuse of the command line: a one-line message, exit code 2, nothing written") {
  Inputs in;
  const auto cases = cli_cases();
  CHECK(cases.size() >= 50);
  int clean = 0;
  for (const Case& c : cases) {
    const std::string command = shown(c.args);
    CAPTURE(command);
    const auto before = snapshot(in.dir.path);
    CliRun r = run_cli(in.dir.path.string(), c.args);
    CAPTURE(r.out);
    const auto after = snapshot(in.dir.path);
    const bool one_line = r.out.rfind("tapegrad: error: ", 0) == 0 && r.out.find('\n') == r.out.size() - 1;
    CHECK(r.signal == 0);
    CHECK(r.code == 2);
    CHECK_MESSAGE(one_line, "expected one line 'tapegrad: error: ...'");
    CHECK_MESSAGE(r.out.find(c.expect) != std::string::npos, "the message does not mention ", c.expect);
    CHECK_MESSAGE(before == after, "the run changed the file system");
    clean += r.signal == 0 && r.code == 2 && one_line && r.out.find(c.expect) != std::string::npos && before == after;
  }
  MESSAGE(clean, " of ", cases.size(), " misuses of the command line refused cleanly");
}

TEST_CASE(
    "sampling from a super checkpoint with a prompt longer than its context conditions on the last 8 characters") {
  // Not an error: like nanoGPT, sampling crops the context to the model's block size; evaluate (above) refuses.
  Inputs in;
  const std::string prompt = text_of_length(40);
  CliRun a = run_cli(in.dir.path.string(), {"sample", "--checkpoint", "super.safetensors", "--prompt", prompt,
                                            "--tokens", "12", "--seed", "3"});
  CliRun b = run_cli(in.dir.path.string(), {"sample", "--checkpoint", "super.safetensors", "--prompt",
                                            prompt.substr(prompt.size() - 8), "--tokens", "12", "--seed", "3"});
  REQUIRE_MESSAGE(a.code == 0, a.out);
  REQUIRE_MESSAGE(b.code == 0, b.out);
  CHECK(a.out.substr(prompt.size()) == b.out.substr(8));
}

namespace {

// The columns step, lr, train_loss and val_loss of a losses.csv, as written (the timing column differs by run).
std::vector<std::string> loss_columns(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> rows;
  std::string line;
  while (std::getline(f, line)) rows.push_back(line.substr(0, line.rfind(',')));
  return rows;
}

}  // namespace

TEST_CASE(
    "resume through the command line: --stop-after 20 then --resume gives the CSV of 40 straight steps, bit for bit") {
  ScratchDir dir;
  spit(dir.file("text.txt"), text_of_length(6000));
  for (const char* kind : {"super", "linear"}) {
    CAPTURE(kind);
    const auto common = with({"train", "--attention", kind, "--data", "text.txt", "--max-iters", "40",
                              "--eval-interval", "10", "--dropout", "0.1", "--out", "runs"},
                             kTiny);
    CliRun straight = run_cli(dir.path.string(), with(common, {"--name", std::string(kind) + "-straight"}));
    REQUIRE_MESSAGE(straight.code == 0, straight.out);
    CliRun first =
        run_cli(dir.path.string(), with(common, {"--name", std::string(kind) + "-parts", "--stop-after", "20"}));
    REQUIRE_MESSAGE(first.code == 0, first.out);
    // The log is written as the run goes: after 20 steps it holds them (header and rows 0 … 19).
    CHECK(loss_columns(dir.file("runs/" + std::string(kind) + "-parts/losses.csv")).size() == 21);
    CliRun second = run_cli(dir.path.string(), with(common, {"--name", std::string(kind) + "-parts", "--resume"}));
    REQUIRE_MESSAGE(second.code == 0, second.out);

    const auto a = loss_columns(dir.file("runs/" + std::string(kind) + "-straight/losses.csv"));
    const auto b = loss_columns(dir.file("runs/" + std::string(kind) + "-parts/losses.csv"));
    REQUIRE(a.size() == 42);  // header, 40 steps, the final evaluation
    CHECK(a.front() == "step,lr,train_loss,val_loss");
    CHECK(a == b);  // every loss printed with the digits of a double's shortest round trip: equal text, equal bits
  }
}

TEST_CASE("a run whose loss turns non-finite stops with one line and keeps the last good checkpoint") {
  ScratchDir dir;
  spit(dir.file("text.txt"), text_of_length(3000));
  const auto common = with({"train", "--data", "text.txt", "--max-iters", "30", "--eval-interval", "5", "--lr", "1e30",
                            "--warmup-iters", "0", "--grad-clip", "0", "--out", "runs"},
                           kTiny);
  for (bool detect : {false, true}) {
    CAPTURE(detect);
    const std::string name = detect ? "detect" : "plain";
    CliRun r =
        run_cli(dir.path.string(), with(common, detect ? std::vector<std::string>{"--name", name, "--detect-anomaly"}
                                                       : std::vector<std::string>{"--name", name}));
    CAPTURE(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.rfind("tapegrad: error: ", 0) == 0);
    CHECK(r.out.find('\n') == r.out.size() - 1);
    CHECK(r.out.find("the last good checkpoint runs/" + name + "/checkpoint.safetensors is kept") != std::string::npos);
    if (detect) {
      // The step and the node: "step 1: non-finite value from layer_norm (backward): ..." or a forward node.
      CHECK(r.out.find("error: step ") != std::string::npos);
      CHECK(r.out.find("non-finite value from ") != std::string::npos);
    } else {
      CHECK((r.out.find("loss became nan") != std::string::npos ||
             r.out.find("loss became -nan") != std::string::npos ||
             r.out.find("loss became inf") != std::string::npos));
    }
    // The kept checkpoint loads, holds finite weights, and evaluates to a finite loss.
    const std::string ck_path = dir.file("runs/" + name + "/checkpoint.safetensors");
    Checkpoint ck = load_checkpoint(ck_path);
    for (const auto& t : ck.tensors)
      for (double v : t.tensor.to_vector()) REQUIRE(std::isfinite(v));
    CliRun e = run_cli(dir.path.string(), {"evaluate", "--checkpoint", ck_path, "--text", "the quick"});
    CHECK_MESSAGE(e.code == 0, e.out);
    CHECK(e.out.find("nan") == std::string::npos);
  }
}
