// The tapegrad program as a user runs it: exit codes, one-line errors, the JSON report.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "test_paths.hpp"
#include "training_test_util.hpp"

namespace {

struct Run {
  int code;
  std::string out;
};

// Runs the CLI with the given arguments (and redirections: `redirect` is the command's tail); by default stdout and
// stderr together.
Run run(const std::string& args, bool merge_stderr = true, const char* redirect = nullptr) {
  std::string cmd = std::string(TAPEGRAD_CLI) + " " + args;
  cmd += redirect ? redirect : merge_stderr ? " 2>&1" : " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p);
  std::string out;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  return {WEXITSTATUS(status), out};
}

}  // namespace

TEST_CASE("tapegrad --help lists the subcommands and exits 0") {
  Run r = run("--help");
  CHECK(r.code == 0);
  CHECK(r.out.find("gradcheck") != std::string::npos);
}

TEST_CASE("tapegrad gradcheck --help exits 0") {
  Run r = run("gradcheck --help");
  CHECK(r.code == 0);
  CHECK(r.out.find("--op") != std::string::npos);
}

TEST_CASE("tapegrad gradcheck passes every op and exits 0") {
  Run r = run("gradcheck");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find(" 0 failed") != std::string::npos);
}

TEST_CASE("tapegrad gradcheck --precision f32 checks the ops' float32 rules against float64, and says so") {
  Run r = run("gradcheck --op matmul --op softmax --precision f32");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("gradcheck at f32 products, float32 tensors, against float64\n") == 0);
  CHECK(r.out.find(" cases at f32: ") != std::string::npos);
  CHECK(r.out.find(" 0 failed") != std::string::npos);
  Run json = run("gradcheck --op matmul --precision f32 --json", false);
  REQUIRE(json.code == 0);
  for (const auto& row : nlohmann::json::parse(json.out)) {
    CHECK(row["precision"] == "f32");
    CHECK(row["max_abs_err"].get<double>() <= row["bound"].get<double>());
  }
  Run help = run("gradcheck --help");
  CHECK(help.out.find("--precision") != std::string::npos);
}

TEST_CASE("tapegrad gradcheck --precision bf16 where bf16 products cannot run: exit 1, one line saying why") {
  const std::string cmd = std::string("TAPEGRAD_FAKE_NO_BF16=1 ") + TAPEGRAD_CLI + " gradcheck --precision bf16 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p);
  std::string out;
  std::array<char, 4096> buf{};
  for (size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
  const int status = pclose(p);
  INFO(out);
  CHECK(WEXITSTATUS(status) == 1);
  CHECK(out.find("tapegrad: error: --precision bf16: this CPU (") == 0);
  CHECK(out.find("has neither AVX512_BF16 nor AMX-BF16") != std::string::npos);
  CHECK(std::count(out.begin(), out.end(), '\n') == 1);
  CHECK(run("gradcheck --precision f16").code == 2);
}

TEST_CASE("tapegrad gradcheck --list names every op") {
  Run r = run("gradcheck --list");
  CHECK(r.code == 0);
  for (const char* op : {"add", "mul", "exp", "gelu"}) CHECK(r.out.find(op) != std::string::npos);
}

TEST_CASE("tapegrad gradcheck --json gives one row per op, case, input and check") {
  Run r = run("gradcheck --op mul --op exp --json", false);
  REQUIRE(r.code == 0);
  auto rows = nlohmann::json::parse(r.out);
  REQUIRE(rows.is_array());
  CHECK(rows.size() >= 8);
  for (const auto& row : rows) {
    for (const char* key : {"op", "case", "input", "check", "max_abs_err", "max_rel_err", "passed"})
      CHECK(row.contains(key));
    CHECK(row["passed"] == true);
    CHECK((row["op"] == "mul" || row["op"] == "exp"));
  }
}

TEST_CASE("misuse of the command line: one-line error, exit code 2") {
  for (const char* args : {"gradcheck --op no_such_op", "gradcheck --bogus-flag", "no-such-command",
                           "gradcheck --atol -1", "gradcheck --eps abc", ""}) {
    CAPTURE(args);
    Run r = run(args);
    CHECK(r.code == 2);
    CHECK(r.out.find("error") != std::string::npos);
  }
}

TEST_CASE("a gradcheck that fails exits 1") {
  Run r = run("gradcheck --op exp --atol 1e-30 --rtol 0");  // no finite difference is that exact
  CHECK(r.code == 1);
  CHECK(r.out.find("FAIL") != std::string::npos);
}

TEST_CASE("gradcheck --edges probes every op at its edges, and says what it skipped and why") {
  Run r = run("gradcheck --edges");
  CHECK(r.code == 0);
  r = run("gradcheck --edges --op exp -v");
  CHECK(r.code == 0);
  CHECK(r.out.find("x        edges") != std::string::npos);
  CHECK(r.out.find("not probed, declared undefined: large (inf)") != std::string::npos);
  r = run("gradcheck --edges --op pow -v");  // pow refuses 0 for p < 0: a refusal in words, not a finding
  CHECK(r.code == 0);
  CHECK(r.out.find("the op refuses it: pow: element") != std::string::npos);
  CHECK(run("gradcheck --edges --undefined-edge masked=nan").code == 2);
  CHECK(run("gradcheck --edges --precision f32").code == 2);
}

TEST_CASE("claim --edges finds a claim's forward broken at an edge, with a line that reproduces it") {
  // y = x/‖x‖ with its VJP (g − y⟨y, g⟩)/‖x‖: right at a random point, 0/0 at a zero row and at tiny values
  const std::string l2 =
      "claim --input x:3,5 --forward \"x / norm(x, -1)\" --vjp \"(g - y * sum(y * g, -1)) / norm(x, -1)\" --edges";
  Run r = run(l2);
  CHECK(r.code == 1);
  CHECK(r.out.find("[at an edge] x, edges: a zero row gives NaN in y") != std::string::npos);
  CHECK(r.out.find("reproduce: x[1, :] = 0") != std::string::npos);
  CHECK(run(l2 + " --undefined-edge zeros=nan --undefined-edge tiny=nan").code == 0);
  // y = x/(1 + ‖x‖²) is smooth everywhere
  CHECK(run("claim --input x:3,5 --let \"s=sum(x * x, -1)\" --forward \"x / (1 + s)\" --vjp \"g / (1 + s) - 2 * x * "
            "sum(x * g, -1) / ((1 + s) * (1 + s))\" --edges")
            .code == 0);
}

TEST_CASE("tapegrad exercise lists, shows, checks with a hint, and gives the solution when asked") {
  Run r = run("exercise");
  CHECK(r.code == 0);
  CHECK(r.out.find("1. Reverse mode from one scalar") != std::string::npos);
  r = run("exercise softmax");
  CHECK(r.code == 0);
  CHECK(r.out.find("Write --vjp \"x = ...\"") != std::string::npos);
  r = run("exercise softmax --vjp \"x = y * g\"");
  CHECK(r.code == 1);
  CHECK(r.out.find("softmax: not yet.") != std::string::npos);
  CHECK(r.out.find("[per-row term]") != std::string::npos);
  CHECK(r.out.find("[against the answer] x, vjp: the slip is in `g`") != std::string::npos);
  r = run("exercise softmax --vjp \"x = y * (g - sum(y * g, -1))\"");
  CHECK(r.code == 0);
  CHECK(r.out.find("softmax: right.") != std::string::npos);
  r = run("exercise softmax --solution");
  CHECK(r.code == 0);
  CHECK(r.out == "vjp x = y * (g - sum(y * g, -1))\n");
  // docs/learn.md quotes a hint as the command prints it
  r = run("exercise sigmoid-attention --vjp \"s = a * matmul(g, transpose(v, 0, 1))\"", false);
  CHECK(r.code == 1);
  std::ifstream learn(std::string(tapegrad::testing::kSourceDir) + "/docs/learn.md");
  const std::string page((std::istreambuf_iterator<char>(learn)), std::istreambuf_iterator<char>());
  const std::string quoted = r.out.substr(0, r.out.find("  input "));  // the title and the diagnosis
  CHECK_MESSAGE(page.find(quoted) != std::string::npos, quoted);
  // and docs/reverse-mode.md §7 the matmul exercise's transpose slip
  r = run("exercise matmul --vjp \"x = matmul(g, w)\" --vjp \"w = matmul(transpose(x, 0, 1), g)\"", false);
  CHECK(r.code == 1);
  std::ifstream first(std::string(tapegrad::testing::kSourceDir) + "/docs/reverse-mode.md");
  const std::string chapter((std::istreambuf_iterator<char>(first)), std::istreambuf_iterator<char>());
  const std::string diagnosis = r.out.substr(0, r.out.find("  input "));
  CHECK_MESSAGE(chapter.find(diagnosis) != std::string::npos, diagnosis);
  CHECK(run("exercise no-such-one").code == 2);
  CHECK(run("exercise softmax --vjp \"x = y * (g\"").code == 2);  // a formula error, with its caret
  CHECK(run("exercise softmax --vjp \"z = g\"").code == 2);       // no input z
}

TEST_CASE("integers are read as decimal, as people write them; other forms are refused naming the option") {
  const tapegrad::testing::ScratchDir scratch;  // its own: a run holds its output directory while it writes
  const std::string out = scratch.file("decimal");
  Run r = run("train --n-layer 010 --batch-size 08 --max-iters 1 --eval-interval 1 --out " + out + " --overwrite");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("10 layers") != std::string::npos);  // not 8: 010 is not octal
  CHECK(r.out.find("batch 8") != std::string::npos);
  for (const char* value : {"--seed 0x10", "--seed=-0x1", "--max-iters 1e3", "--n-layer 0b1"}) {
    CAPTURE(value);
    Run bad = run(std::string("train ") + value + " --out " + out + " --overwrite");
    CHECK(bad.code == 2);
    CHECK(bad.out.find("is not a decimal integer") != std::string::npos);
  }
}

TEST_CASE("a claim's forward or JVP given twice is refused, not the last one kept") {
  for (const char* twice :
       {"--forward 'exp(x)' --forward 'tanh(x)' --jvp 't_x*y'", "--forward 'exp(x)' --jvp 't_x*y*5' --jvp 't_x*y'"}) {
    CAPTURE(twice);
    Run r = run(std::string("claim --input x:4,6 ") + twice);
    CHECK(r.code == 2);
    CHECK(r.out.find(" is given 2 times; it takes one value") != std::string::npos);
  }
}

TEST_CASE("an option that takes one value, given twice, is refused in every command, naming it") {
  const std::string file = std::string(tapegrad::testing::kSourceDir) + "/CMakeLists.txt";  // any regular file
  const std::pair<std::string, std::string> cases[] = {
      {"train --lr 0.1 --n-layer 2 --lr 0.2", "--lr"},
      {"train --bias --no-bias", "--bias"},  // a flag and its negation: one value, said twice
      {"sample --checkpoint " + file + " --tokens 5 --tokens 6", "--tokens"},
      {"evaluate --checkpoint " + file + " --checkpoint " + file + " --text abc", "--checkpoint"},
      {"graph --op softmax --op exp", "--op"},
      {"graph --op softmax -o a.svg --output b.svg", "--output"},  // the short and the long name are one option
      {"compare --iters 1 --iters=2", "--iters"},
      {"bench --rounds 1 --rounds 2", "--rounds"},
      {"gradcheck --op exp --atol 1 --atol 2", "--atol"},
      {"explain softmax --seed 1 --seed 2", "--seed"},
      {"claim --input x:4,6 --name a --name b --forward 'exp(x)' --jvp 't_x*y'", "--name"},
  };
  for (const auto& [args, option] : cases) {
    CAPTURE(args);
    Run r = run(args, true, " 2>&1 >/dev/null");  // stderr alone
    CHECK(r.code == 2);
    CHECK(r.out == "tapegrad: error: " + option +
                       " is given 2 times; it takes one value: give it once (the last one "
                       "is not taken in place of the others)\n");
  }
  // Options of a list stay repeatable.
  CHECK(run("gradcheck --op exp --op mul").code == 0);
  CHECK(run("claim --input x:4,6 --input w:6 --let 'a=x*w' --let 'b=a*2' --forward b --vjp 'x=g*w*2' "
            "--vjp 'w=sum(g*x*2, axis=0)'")
            .code == 0);
}

TEST_CASE("a config file's key given twice is refused; the command line overrides a key given once") {
  const tapegrad::testing::ScratchDir scratch;
  const std::string dir = scratch.path.string();
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  const std::string twice = write("twice.ini", "n-layer = 1\nlr = 0.1\nlr = 0.2\n");
  Run r = run("train --config " + twice, true, " 2>&1 >/dev/null");
  CHECK(r.code == 2);
  CHECK(r.out == "tapegrad: error: config file " + twice +
                     ": line 3: key 'lr' is given again (first on line 2); give "
                     "a key once, and several values of a list as key = [a, b]\n");
  const std::string once = write("once.ini", "n-layer = 3\nmax-iters = 1\n");
  Run ok = run("train --config " + once +
               " --n-layer 1 --n-embd 16 --n-head 2 --block-size 8 --batch-size 2 "
               "--eval-iters 1 --sample-tokens 0 --out " +
               dir + " --overwrite");
  INFO(ok.out);
  CHECK(ok.code == 0);
  CHECK(ok.out.find(" 1 layers,") != std::string::npos);  // the command line's, not the file's 3
  std::filesystem::remove_all(dir);
}

TEST_CASE("output that cannot be written is a failure: exit 2 with the reason, not 0") {
  for (const char* command : {"gradcheck --list", "gradcheck --kinds", "explain softmax",
                              "claim --input x:4,6 --forward 'exp(x)' --jvp 't_x*y'"}) {
    CAPTURE(command);
    Run r = run(command, true, " 2>&1 >/dev/full");  // stderr to what run() reads, stdout to /dev/full
    CHECK(r.code == 2);
    CHECK(r.out.find("No space left on device") != std::string::npos);
  }
}

TEST_CASE("graph -o with an empty path is refused, not written to graph.svg") {
  Run r = run("graph --op softmax -o ''");
  CHECK(r.code == 2);
  CHECK(r.out.find("an empty path names no file") != std::string::npos);
}

TEST_CASE("an input without elements fails as nothing compared, with no finding read from nothing") {
  Run r = run("claim --input x:0,3 --forward 'exp(x)' --vjp 'g*y'");
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(r.out.find("nothing compared: x has no elements") != std::string::npos);
  CHECK(r.out.find("[tolerance]") == std::string::npos);
}

TEST_CASE("a claim with a long chain of --let holds (each let is checked against the names it reads)") {
  std::string args = "claim --input x:4,6 --let a0=x";
  for (int i = 1; i < 2000; ++i) args += " --let a" + std::to_string(i) + "=a" + std::to_string(i - 1) + "+x";
  args += " --forward a1999 --vjp g*2000";
  Run r = run(args);
  INFO(r.out.substr(0, 2000));
  CHECK(r.code == 0);
  CHECK(r.out.find("1 claim: 1 holds, 0 wrong") != std::string::npos);
}

TEST_CASE("claim weighs what its forward makes, not only its inputs, and refuses before any work") {
  // (60000, 1) * (1, 60000) is 3.6e9 float64 elements (29 GB) from 120,000 input elements: refused from the shapes.
  for (const char* forward : {"a*b", "matmul(a, b)"}) {
    CAPTURE(forward);
    Run r =
        run(std::string("claim --input a:60000,1 --input b:1,60000 --forward '") + forward + "' --jvp 't_a*b + a*t_b'",
            true, " 2>&1 >/dev/null");
    CHECK(r.code == 2);
    CHECK(r.out.find("tapegrad: error: claim the command line (1.2e+05 input elements; its forward makes 3.6e+09, "
                     "its output 3.6e+09) needs about ") == 0);
    CHECK(r.out.find("raise TAPEGRAD_MEMORY_LIMIT") != std::string::npos);
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  }
  // Under a cap: the outer product of two 1000-long vectors (1e6 elements) is refused at 64 MiB and checked at 1 GiB.
  const std::string claim = "claim --input a:1000,1 --input b:1,1000 --forward 'a*b' --jvp 't_a*b + a*t_b'";
  setenv("TAPEGRAD_MEMORY_LIMIT", "64M", 1);
  Run capped = run(claim, true, " 2>&1 >/dev/null");
  setenv("TAPEGRAD_MEMORY_LIMIT", "1G", 1);
  Run checked = run(claim);
  unsetenv("TAPEGRAD_MEMORY_LIMIT");
  CHECK(capped.code == 2);
  CHECK(capped.out.find("more than the 64.0 MiB available") != std::string::npos);
  INFO(checked.out);
  CHECK(checked.code == 0);
  CHECK(checked.out.find("1 claim: 1 holds, 0 wrong") != std::string::npos);
}
