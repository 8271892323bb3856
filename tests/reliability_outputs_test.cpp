// What the program's outputs respect, and what it refuses before it allocates: a symbolic link is followed and its
// target replaced, a fifo or a device is written into and stays what it was, an output that is one of the inputs
// is refused; a formula too deep for the evaluator, a config key without a value, a checkpoint header the loader
// would refuse, non-finite weights and work that needs more memory than there is are each refused in one line
// with exit code 2, quickly and in little memory.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "models/checkpoint.hpp"
#include "models/files.hpp"
#include "models/layers.hpp"
#include "reliability_util.hpp"
#include "training_test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;
namespace fs = std::filesystem;

namespace {

bool is_fifo(const fs::path& p) { return fs::is_fifo(fs::symlink_status(p)); }

// A refusal: exit code 2, one line naming `expect`, no signal, in little memory.
void check_refused(const CliRun& r, const std::string& expect) {
  CHECK_MESSAGE(r.signal == 0, r.out);
  CHECK_MESSAGE(r.code == 2, r.out);
  CHECK_MESSAGE(r.out.find(expect) != std::string::npos, r.out);
  CHECK_MESSAGE(refused_in_little_memory(r), r.max_rss_kb, " KiB");
}

}  // namespace

TEST_CASE("write_file_atomic replaces a symbolic link's target and keeps the link") {
  ScratchDir dir;
  spit(dir.file("real.txt"), "old");
  fs::create_symlink("real.txt", dir.path / "link.txt");
  write_file_atomic(dir.file("link.txt"), "new");
  CHECK(fs::is_symlink(fs::symlink_status(dir.path / "link.txt")));
  CHECK(slurp(dir.file("real.txt")) == "new");
  // A dangling link: the file it names is made.
  fs::create_symlink("made.txt", dir.path / "dangling.txt");
  write_file_atomic(dir.file("dangling.txt"), "made");
  CHECK(fs::is_symlink(fs::symlink_status(dir.path / "dangling.txt")));
  CHECK(slurp(dir.file("made.txt")) == "made");
}

TEST_CASE("write_file_atomic writes into a fifo and a device instead of renaming over them") {
  ScratchDir dir;
  const std::string fifo = dir.file("pipe");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::string received;
  std::thread reader([&] { received = slurp(fifo); });
  write_file_atomic(fifo, "through the pipe");
  reader.join();
  CHECK(received == "through the pipe");
  CHECK(is_fifo(fifo));
  write_file_atomic("/dev/null", "nothing");
  CHECK(fs::is_character_file("/dev/null"));
  CHECK_THROWS_WITH_AS(write_file_atomic("", "x"), doctest::Contains("empty name"), Error);
  CHECK_THROWS_WITH_AS(write_file_atomic(dir.path.string(), "x"), doctest::Contains("directory"), Error);
}

TEST_CASE("read_file refuses a device at once, even behind a symbolic link") {
  ScratchDir dir;
  fs::create_symlink("/dev/zero", dir.path / "zero.safetensors");
  CHECK_THROWS_WITH_AS(read_file(dir.file("zero.safetensors"), size_t{1} << 34), doctest::Contains("device"), Error);
  CHECK_THROWS_WITH_AS(load_checkpoint(dir.file("zero.safetensors")), doctest::Contains("device"), Error);
}

TEST_CASE("the checkpoint writer refuses a header the loader would refuse, and writes nothing") {
  ScratchDir dir;
  Checkpoint ck;
  ck.tensors.push_back({"w", Tensor::zeros(DType::f32, {2, 2})});
  ck.metadata["log"] = std::string(kMaxHeaderBytes, 'x');
  CHECK_THROWS_WITH_AS(save_checkpoint(dir.file("big.safetensors"), ck), doctest::Contains("the loader accepts"),
                       Error);
  CHECK_FALSE(fs::exists(dir.path / "big.safetensors"));
}

TEST_CASE("load_parameters refuses a NaN or infinite weight by name") {
  ScratchDir dir;
  Linear layer("fc", 3, 2, 1);
  save_parameters(dir.file("ok.safetensors"), layer);
  Checkpoint ck = load_checkpoint(dir.file("ok.safetensors"));
  for (auto& nt : ck.tensors)
    if (nt.name == "fc.weight") nt.tensor.data<float>()[4] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> before = [&] {
    const Tensor& w = layer.parameters()[0].value;
    return std::vector<float>(w.data<float>(), w.data<float>() + w.numel());
  }();
  CHECK_THROWS_WITH_AS(load_parameters(ck, layer, "nan.safetensors"), doctest::Contains("fc.weight"), Error);
  const Tensor& w = layer.parameters()[0].value;
  CHECK(std::vector<float>(w.data<float>(), w.data<float>() + w.numel()) == before);  // nothing was loaded
}

TEST_CASE("the program: outputs that are inputs, special files, deep formulas, config files, memory") {
  ScratchDir dir;
  CliRun made = make_tiny_run(dir.path, 2);
  REQUIRE_MESSAGE(made.code == 0, made.out);
  const std::string ck = kTinyCheckpoint;
  const std::string ck_bytes = slurp(dir.file(ck));

  SUBCASE("an output that is the command's input is refused, and the input kept") {
    check_refused(run_cli(dir.path.string(), {"evaluate", "--checkpoint", ck, "--text", "the quick", "--hvp-out", ck}),
                  "--hvp-out");
    CHECK(slurp(dir.file(ck)) == ck_bytes);
    fs::create_symlink(ck, dir.path / "alias.safetensors");
    check_refused(run_cli(dir.path.string(),
                          {"evaluate", "--checkpoint", ck, "--text", "the quick", "--hvp-out", "alias.safetensors"}),
                  "--hvp-out");
    CHECK(slurp(dir.file(ck)) == ck_bytes);
  }
  SUBCASE("graph -o through a symbolic link writes its target; into /dev/null it leaves the device") {
    spit(dir.file("target.svg"), "old");
    fs::create_symlink("target.svg", dir.path / "link.svg");
    CliRun r = run_cli(dir.path.string(), {"graph", "--op", "softmax", "-o", "link.svg"});
    REQUIRE_MESSAGE(r.code == 0, r.out);
    CHECK(fs::is_symlink(fs::symlink_status(dir.path / "link.svg")));
    CHECK(slurp(dir.file("target.svg")).find("<svg") != std::string::npos);
    r = run_cli(dir.path.string(), {"graph", "--op", "softmax", "-o", "/dev/null"});
    CHECK_MESSAGE(r.code == 0, r.out);
    CHECK(fs::is_character_file("/dev/null"));
  }
  SUBCASE("a sample from a checkpoint behind a link to /dev/zero is refused at once") {
    fs::create_symlink("/dev/zero", dir.path / "z.safetensors");
    check_refused(run_cli(dir.path.string(), {"sample", "--checkpoint", "z.safetensors"}), "device");
  }
  SUBCASE("a chain of 60,000 operators is refused, not a crash") {
    std::string chain = "x";
    for (int i = 1; i < 60000; ++i) chain += "+x";
    check_refused(run_cli(dir.path.string(), {"claim", "--input", "x:2", "--forward", chain, "--vjp", "g*60000"}),
                  "levels deep");
    check_refused(
        run_cli(dir.path.string(), {"claim", "--input", "x:2", "--let", "u=" + chain, "--forward", "x", "--vjp", "g"}),
        "levels deep");
    spit(dir.file("deep.txt"), "claim deep\ninput x: 2\nforward " + chain + "\nvjp x = g*60000\n");
    check_refused(run_cli(dir.path.string(), {"claim", "--file", "deep.txt"}), "levels deep");
    // A chain of 900 operators is within the bound, and holds.
    std::string ok = "x";
    for (int i = 1; i < 900; ++i) ok += "+x";
    CliRun r = run_cli(dir.path.string(), {"claim", "--input", "x:2", "--forward", ok, "--vjp", "g*900"});
    CHECK_MESSAGE(r.code == 0, r.out);
  }
  SUBCASE("config files: an empty value is an error; several files merge in order") {
    spit(dir.file("empty_name.ini"), "name =\n");
    check_refused(
        run_cli(dir.path.string(), with({"train", "--config", "empty_name.ini", "--data", "text.txt"}, kTiny)),
        "key 'name' has an empty value");
    CHECK_FALSE(fs::exists(dir.path / "runs" / "-q"));
    spit(dir.file("a.ini"), "max-iters = 2\neval-interval = 2\nname = from_a\n");
    spit(dir.file("b.ini"), "name = from_b\n");
    CliRun r = run_cli(
        dir.path.string(),
        with({"train", "--config", "a.ini", "--config", "b.ini", "--data", "text.txt", "--out", "merged"}, kTiny));
    CHECK_MESSAGE(r.code == 0, r.out);
    CHECK(fs::exists(dir.path / "merged" / "from_b" / "checkpoint.safetensors"));
    CHECK_FALSE(fs::exists(dir.path / "merged" / "from_a"));
  }
  SUBCASE("work that needs more memory than there is: refused before it is allocated") {
    check_refused(
        run_cli(dir.path.string(), {"claim", "--input", "x:20000,20000", "--forward", "exp(x)", "--vjp", "g*y"}),
        "of memory");
    check_refused(run_cli(dir.path.string(), {"graph", "--model", "--n-layer", "100000"}), "of memory");
    check_refused(run_cli(dir.path.string(), {"graph", "--model", "--block-size", "1000000"}), "of memory");
    check_refused(run_cli(dir.path.string(), {"bench", "--quick", "--only", "training", "--block-size", "1000000"}),
                  "of memory");
  }
  SUBCASE("a file is sized against the memory before it is read; TAPEGRAD_MEMORY_LIMIT caps what may be used") {
    // The checkpoint is some 100 KB, held twice once read (its bytes and its tensors); the text 3000 bytes, held
    // nine times over (the text, its ids as read and as split).
    const auto ck_size = static_cast<double>(fs::file_size(dir.path / ck));
    setenv("TAPEGRAD_MEMORY_LIMIT", fmt::format("{:.0f}", 1.5 * ck_size).c_str(), 1);
    check_refused(run_cli(dir.path.string(), {"sample", "--checkpoint", ck}), "reading '" + ck + "'");
    check_refused(run_cli(dir.path.string(), {"evaluate", "--checkpoint", ck, "--text", "the"}), "of memory");
    setenv("TAPEGRAD_MEMORY_LIMIT", "20K", 1);
    check_refused(run_cli(dir.path.string(), with({"train", "--data", "text.txt", "--out", "small"}, kTiny)),
                  "reading 'text.txt'");
    setenv("TAPEGRAD_MEMORY_LIMIT", "lots", 1);
    check_refused(run_cli(dir.path.string(), {"sample", "--checkpoint", ck}), "TAPEGRAD_MEMORY_LIMIT=lots");
    unsetenv("TAPEGRAD_MEMORY_LIMIT");
    CliRun header = run_cli(dir.path.string(), {"bench", "--quick", "--only", "training", "--rounds", "1"});
    CHECK_MESSAGE(header.code == 0, header.out);
    CHECK_MESSAGE(
        header.out.find("memory    bench's training step (batch 12, context 64, 4 layers, 128 wide): about ") !=
            std::string::npos,
        header.out);
  }
}
