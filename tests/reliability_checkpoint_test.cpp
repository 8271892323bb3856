// Checkpoint safety: a real training checkpoint damaged in every way we can think of (cut short, a byte flipped,
// a header that lies, a header of 100 MB, files of other formats) is refused by the loader and by
// `tapegrad sample --checkpoint` with one clear line; and a writer killed with SIGKILL at random points never
// leaves the previous checkpoint damaged.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/rng.hpp"
#include "models/checkpoint.hpp"
#include "reliability_util.hpp"
#include "training_test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

// A checkpoint file taken apart: the header's JSON and the data section.
struct Parts {
  nlohmann::ordered_json header;
  std::string data;
};
Parts split(const std::string& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[static_cast<size_t>(i)]);
  return {nlohmann::ordered_json::parse(file.substr(8, n)), file.substr(8 + n)};
}
std::string join(const nlohmann::ordered_json& header, const std::string& data) {
  std::string text = header.dump();
  return le64(text.size()) + text + data;
}

// The bytes of a string literal, embedded NULs included.
template <size_t N>
std::string literal(const char (&s)[N]) {
  return std::string(s, N - 1);
}

struct Corruption {
  std::string what;
  std::string bytes;
};

// Every damaged version of `file` (a checkpoint written by tapegrad train) that the loader must refuse.
std::vector<Corruption> corruptions_of(const std::string& file, const std::string& program) {
  std::vector<Corruption> out;
  const Parts good = split(file);
  const size_t header_end = file.size() - good.data.size();

  // Cut short: at every 32nd of the file and around the header's boundaries.
  std::vector<size_t> cuts = {0, 1, 7, 8, 9, 100, header_end - 1, header_end, header_end + 1, file.size() - 1};
  for (size_t i = 1; i < 32; ++i) cuts.push_back(file.size() * i / 32);
  for (size_t len : cuts)
    out.push_back({fmt::format("truncated to {} of {} bytes", len, file.size()), file.substr(0, len)});

  // One bit flipped: in the length, all through the header, all through the data.
  std::vector<size_t> flips = {0, 1, 3, 7};
  for (size_t i = 0; i < 24; ++i) flips.push_back(8 + (header_end - 8) * i / 24);
  for (size_t i = 0; i < 32; ++i) flips.push_back(header_end + good.data.size() * i / 32);
  flips.push_back(file.size() - 1);
  for (size_t at : flips)
    for (int bit : {0x01, 0x40}) {
      std::string f = file;
      f[at] = static_cast<char>(static_cast<unsigned char>(f[at]) ^ bit);
      out.push_back({fmt::format("byte {} xor {:#04x}", at, bit), f});
    }

  // Headers that lie. With the checksums as written (now stale for the header), then with them removed, as a
  // writer that records none would leave them: the layout checks and the model's shapes must still refuse.
  std::vector<std::string> names;
  for (const auto& [k, v] : good.header.items())
    if (k != "__metadata__") names.push_back(k);
  auto lie = [&](const std::string& what, auto&& edit, bool also_without_checksums) {
    nlohmann::ordered_json h = good.header;
    edit(h);
    out.push_back({"header lie: " + what, join(h, good.data)});
    if (also_without_checksums) {
      h["__metadata__"].erase(std::string(kChecksumKey));
      h["__metadata__"].erase(std::string(kHeaderChecksumKey));
      out.push_back({"header lie without checksums: " + what, join(h, good.data)});
    }
  };
  const std::string w = "transformer.h.0.mlp.c_fc.weight", w2 = "transformer.h.0.mlp.c_proj.weight";
  lie(
      "two tensors of one size swap offsets", [&](auto& h) { std::swap(h[w]["data_offsets"], h[w2]["data_offsets"]); },
      false);
  lie(
      "a shape of the same size, transposed",
      [&](auto& h) {
        h[w]["shape"] = {16, 64};
      },
      true);
  lie(
      "offsets shifted by 4 bytes",
      [&](auto& h) {
        h[w]["data_offsets"][0] = h[w]["data_offsets"][0].template get<uint64_t>() + 4;
        h[w]["data_offsets"][1] = h[w]["data_offsets"][1].template get<uint64_t>() + 4;
      },
      true);
  lie(
      "offsets past the end", [&](auto& h) { h[w]["data_offsets"][1] = 1ull << 40; }, true);
  lie(
      "a shape larger than the data",
      [&](auto& h) {
        h[w]["shape"] = {64, 1ull << 40};
      },
      true);
  lie(
      "a negative dimension",
      [&](auto& h) {
        h[w]["shape"] = {-64, -16};
      },
      true);
  lie(
      "a tensor dropped", [&](auto& h) { h.erase(w); }, true);
  lie(
      "the step in the metadata", [&](auto& h) { h["__metadata__"]["tapegrad.step"] = "9999"; }, false);
  lie(
      "the model's context in the metadata",
      [&](auto& h) {
        auto m = nlohmann::json::parse(h["__metadata__"]["tapegrad.model"].template get<std::string>());
        m["block_size"] = 16;
        h["__metadata__"]["tapegrad.model"] = m.dump();
      },
      true);
  lie(
      "the dtype", [&](auto& h) { h[w]["dtype"] = "I32"; }, true);
  auto model_lie = [&](const std::string& what, auto&& edit) {
    lie(
        what,
        [&](auto& h) {
          auto m = nlohmann::json::parse(h["__metadata__"]["tapegrad.model"].template get<std::string>());
          edit(m);
          h["__metadata__"]["tapegrad.model"] = m.dump();
        },
        true);
  };
  model_lie("a model of 10^6 wide and 10^9 layers in the metadata", [](auto& m) {
    m["n_embd"] = 1'000'000;
    m["n_layer"] = 1'000'000'000;
  });
  model_lie("a model of 10^18 layers in the metadata", [](auto& m) { m["n_layer"] = 1'000'000'000'000'000'000; });
  model_lie("a string for the number of layers", [](auto& m) { m["n_layer"] = "four"; });
  model_lie("a float beyond int64 for the context (found by fuzz_checkpoint)",
            [](auto& m) { m["block_size"] = 1.8e20; });
  model_lie("an integer beyond int64 for the width", [](auto& m) { m["n_embd"] = 18'446'744'073'709'551'615ull; });
  model_lie("an attention kind that does not exist", [](auto& m) { m["attention"] = "quadratic"; });
  model_lie("no block size", [](auto& m) { m.erase("block_size"); });
  lie(
      "a model configuration that is not JSON", [&](auto& h) { h["__metadata__"]["tapegrad.model"] = "{n_layer: 4"; },
      true);
  lie(
      "the data checksum", [&](auto& h) { h["__metadata__"][std::string(kChecksumKey)] = "0123456789abcdef"; }, false);
  lie(
      "the header checksum", [&](auto& h) { h["__metadata__"][std::string(kHeaderChecksumKey)] = "0123456789abcdef"; },
      false);

  // Headers too large to be one: 100 MiB as the length says and as the file holds; a length of 2^63; nesting and
  // many tiny values under the limit, which would take gigabytes parsed.
  {
    std::string pad = R"({"__metadata__":{"pad":")";
    const size_t n = size_t{100} << 20;
    std::string h = pad + std::string(n - pad.size() - 3, 'x') + R"("}})";
    out.push_back({"a JSON header of 100 MiB", le64(h.size()) + h});
  }
  out.push_back({"a header length of 2^63", le64(1ull << 63) + "{}"});
  out.push_back({"a header nested 10 million deep", [] {
                   std::string h = std::string(10'000'000, '[') + std::string(10'000'000, ']');
                   return le64(h.size()) + h;
                 }()});
  out.push_back({"a header of 20 million zeros", [] {
                   std::string h = "[0";
                   h.reserve(40'000'002);
                   for (int i = 1; i < 20'000'000; ++i) h += ",0";
                   h += "]";
                   return le64(h.size()) + h;
                 }()});

  // Files of other formats.
  out.push_back({"an empty file", ""});
  out.push_back({"a text file", text_of_length(500)});
  out.push_back({"a JSON file", R"({"step": 1, "loss": 2.5, "weights": [1, 2, 3]})"});
  out.push_back({"a PNG image", literal("\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x10")});
  out.push_back({"a zip archive (a PyTorch .pt)", literal("PK\x03\x04\x14\0\0\0\0\0") + text_of_length(200)});
  out.push_back({"a pickle", literal("\x80\x02}q\0(X\x05\0\0\0model")});
  out.push_back({"a GGUF file", literal("GGUF\x03\0\0\0\x05\0\0\0\0\0\0\0") + std::string(64, '\0')});
  out.push_back(
      {"a NumPy array", literal("\x93NUMPY\x01\0v\0{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }")});
  out.push_back({"a gzip stream", literal("\x1f\x8b\x08\0\0\0\0\0\0\x03") + std::string(40, '\x55')});
  out.push_back({"an executable (the tapegrad program)", slurp(program)});
  return out;
}

}  // namespace

TEST_CASE("damaged checkpoints are refused by the loader and by tapegrad sample, with one clear line") {
  ScratchDir dir;
  CliRun made = make_tiny_run(dir.path, 4);
  REQUIRE_MESSAGE(made.code == 0, made.out);
  const std::string good = slurp(dir.file(kTinyCheckpoint));
  REQUIRE(good.size() > 1000);
  // The good file loads, and samples.
  spit(dir.file("good.safetensors"), good);
  CHECK_NOTHROW(load_checkpoint(dir.file("good.safetensors")));
  CliRun ok = run_cli(dir.path.string(), {"sample", "--checkpoint", "good.safetensors", "--tokens", "5"});
  REQUIRE_MESSAGE(ok.code == 0, ok.out);

  const auto cases = corruptions_of(good, TAPEGRAD_CLI);
  CHECK(cases.size() >= 100);
  int refused = 0;
  for (const Corruption& c : cases) {
    CAPTURE(c.what);
    const std::string path = dir.file("damaged.safetensors");
    spit(path, c.bytes);
    // The loader, and then the model's checks, as tapegrad sample and evaluate apply them.
    std::string message;
    try {
      Checkpoint ck = load_checkpoint(path);
      (void)ck;
    } catch (const Error& e) {
      message = e.what();
    }
    CliRun r = run_cli(dir.path.string(), {"sample", "--checkpoint", "damaged.safetensors", "--tokens", "5"});
    CAPTURE(message);
    CAPTURE(r.out);
    CHECK(r.signal == 0);
    CHECK(r.code == 2);
    const bool one_line = r.out.rfind("tapegrad: error: ", 0) == 0 && r.out.find('\n') == r.out.size() - 1;
    CHECK_MESSAGE(one_line, "expected one line 'tapegrad: error: ...'");
    CHECK(r.out.size() < 600);
    CHECK(r.out.find("damaged.safetensors") != std::string::npos);
    // Every damage to the bytes is caught by the loader itself; only the lies of a header without checksums are
    // left to the model's checks (a shape or a context the model does not have).
    if (c.what.rfind("header lie without checksums", 0) != 0) {
      CHECK_MESSAGE(!message.empty(), "the loader accepted it");
      CHECK(message.find("damaged.safetensors") != std::string::npos);
      CHECK(message.find('\n') == std::string::npos);
    }
    refused += r.signal == 0 && r.code == 2 && one_line;
  }
  MESSAGE(refused, " of ", cases.size(), " damaged checkpoints refused");
}

TEST_CASE("every single-bit flip in the header, and in every 64th byte of the data, is refused by the loader") {
  ScratchDir dir;
  CliRun made = make_tiny_run(dir.path, 4);
  REQUIRE_MESSAGE(made.code == 0, made.out);
  const std::string good = slurp(dir.file(kTinyCheckpoint));
  const size_t header_end = good.size() - split(good).data.size();
  size_t tried = 0, refused = 0;
  for (size_t at = 0; at < good.size(); at += at < header_end ? 1 : 64)
    for (int bit : {0x01, 0x02, 0x20, 0x80}) {
      if (at >= header_end && (bit == 0x02 || bit == 0x20)) continue;
      std::string f = good;
      f[at] = static_cast<char>(static_cast<unsigned char>(f[at]) ^ bit);
      ++tried;
      try {
        (void)parse_checkpoint(f, "flipped.safetensors");
        FAIL_CHECK("byte ", at, " xor ", bit, " (", at < header_end ? "header" : "data", ") was accepted");
      } catch (const Error& e) {
        ++refused;
        CHECK(std::string(e.what()).find("flipped.safetensors") != std::string::npos);
      }
    }
  MESSAGE(refused, " of ", tried, " single-bit flips refused (", header_end,
          " header bytes, 4 bits each; every 64th of ", good.size() - header_end, " data bytes, 2 bits each)");
}

namespace {

// A checkpoint of about 5 MB whose every element is `version`, which its metadata records too.
Checkpoint versioned(const std::vector<Tensor>& tensors, int64_t version) {
  Checkpoint ck;
  for (size_t i = 0; i < tensors.size(); ++i) {
    Tensor t = tensors[i];  // a handle to the caller's data, which this fills
    float* p = t.data<float>();
    for (int64_t j = 0; j < tensors[i].numel(); ++j) p[j] = static_cast<float>(version);
    ck.tensors.push_back({fmt::format("layer.{}.weight", i), tensors[i]});
  }
  ck.metadata["version"] = std::to_string(version);
  return ck;
}

// The version a checkpoint holds, after checking that it is whole: every element and the metadata agree.
int64_t version_of(const std::string& path) {
  Checkpoint ck = load_checkpoint(path);
  const int64_t v = std::stoll(ck.metadata.at("version"));
  for (const auto& nt : ck.tensors) {
    const float* p = nt.tensor.data<float>();
    for (int64_t j = 0; j < nt.tensor.numel(); ++j)
      if (p[j] != static_cast<float>(v)) fail("{}: element {} of {} is {}, not version {}", path, j, nt.name, p[j], v);
  }
  return v;
}

size_t temporaries_in(const std::filesystem::path& dir) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp-") != std::string::npos) ++n;
  return n;
}

}  // namespace

TEST_CASE("SIGKILL at 50 random points of a checkpoint-writing loop never damages the previous checkpoint") {
  ScratchDir dir;
  const std::string path = dir.file("ck.safetensors");
  std::vector<Tensor> tensors;
  for (int i = 0; i < 5; ++i) tensors.push_back(Tensor::zeros(DType::f32, {256, 1024}));  // 5 × 1 MiB
  save_checkpoint(path, versioned(tensors, 0));
  const auto t0 = std::chrono::steady_clock::now();
  save_checkpoint(path, versioned(tensors, 0));
  const double save_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();

  Rng rng(20260522);
  int64_t last = 0;
  size_t mid_write = 0;
  const int kKills = 50;
  for (int kill_point = 0; kill_point < kKills; ++kill_point) {
    CAPTURE(kill_point);
    int ready[2];
    REQUIRE(pipe(ready) == 0);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // writes version last+1, last+2, ... until killed
      close(ready[0]);
      try {
        for (int64_t v = last + 1;; ++v) {
          if (v == last + 1) (void)!write(ready[1], "w", 1);
          save_checkpoint(path, versioned(tensors, v));
        }
      } catch (...) {}
      _exit(3);
    }
    close(ready[1]);
    char c = 0;
    const bool started = read(ready[0], &c, 1) == 1;
    close(ready[0]);
    if (!started) kill(child, SIGKILL);
    REQUIRE(started);
    // Anywhere in the first three saves: serializing, writing, syncing, renaming, syncing the directory.
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(rng.uniform() * 3 * save_us)));
    REQUIRE(kill(child, SIGKILL) == 0);
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK(WIFSIGNALED(status));

    int64_t v = -1;
    std::string error;
    try {
      v = version_of(path);
    } catch (const Error& e) {
      error = e.what();
    }
    CAPTURE(error);
    REQUIRE_MESSAGE(error.empty(), "the checkpoint is damaged after a kill");
    CHECK(v >= last);  // the newest complete save, never an older one
    last = v;
    // A kill between creating the temporary and renaming it leaves the temporary behind, never the target.
    const size_t temporaries = temporaries_in(dir.path);
    mid_write += temporaries > 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.path))
      if (e.path().filename().string().find(".tmp-") != std::string::npos) std::filesystem::remove(e.path());
  }
  MESSAGE(kKills, " kills (", mid_write, " of them during a write, leaving a temporary), ", last,
          " checkpoints written, 0 lost; one save of ", tensors.size(), " MiB takes ", save_us / 1000, " ms");
  CHECK(mid_write > 0);
}

TEST_CASE("SIGKILL during tapegrad train with a checkpoint at every step leaves a checkpoint that loads and resumes") {
  ScratchDir dir;
  spit(dir.file("text.txt"), text_of_length(3000));
  const auto args = with({"train", "--data", "text.txt", "--max-iters", "100000", "--eval-interval", "1",
                          "--eval-iters", "1", "--out", "runs"},
                         kTiny);
  const std::string ck = dir.file("runs/softmax/checkpoint.safetensors");
  Rng rng(7);
  const int kKills = 8;
  for (int k = 0; k < kKills; ++k) {
    CAPTURE(k);
    std::vector<std::string> argv =
        with(args, k == 0 ? std::vector<std::string>{} : std::vector<std::string>{"--resume"});
    std::string program = TAPEGRAD_CLI;
    std::vector<char*> cargv{program.data()};
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      if (chdir(dir.path.c_str()) != 0) _exit(126);
      execv(program.c_str(), cargv.data());
      _exit(127);
    }
    // Once the first checkpoint of this run exists, somewhere in the next 300 ms.
    const auto start =
        std::filesystem::exists(ck) ? std::filesystem::last_write_time(ck) : std::filesystem::file_time_type::min();
    for (int i = 0; i < 3000 && (!std::filesystem::exists(ck) || std::filesystem::last_write_time(ck) == start); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(rng.uniform() * 300'000)));
    REQUIRE(kill(child, SIGKILL) == 0);
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK(WIFSIGNALED(status));
    Checkpoint loaded;
    CHECK_NOTHROW(loaded = load_checkpoint(ck));
    CHECK(std::stoll(loaded.metadata.at("tapegrad.step")) >= 0);
  }
  // After the last kill, the run resumes and finishes.
  CliRun r = run_cli(dir.path.string(), with(args, {"--resume", "--stop-after", "2"}));
  CHECK_MESSAGE(r.code == 0, r.out);
  for (const auto& e : std::filesystem::directory_iterator(dir.path / "runs" / "softmax"))
    if (e.path().filename().string().find(".tmp-") != std::string::npos) std::filesystem::remove(e.path());
}

namespace {

// `train ... --resume` (args) on the checkpoint `good` with its metadata edited, written to `path` without its
// checksums (as a file written without them is read): what reaches the reader is the edit alone.
CliRun resume_edited(const ScratchDir& dir, const std::vector<std::string>& args, const std::string& path,
                     const std::string& good, const std::vector<std::pair<std::string, std::string>>& edits) {
  Parts p = split(good);
  for (const auto& [key, value] : edits) p.header["__metadata__"][key] = value;
  p.header["__metadata__"].erase(std::string(kChecksumKey));
  p.header["__metadata__"].erase(std::string(kHeaderChecksumKey));
  spit(path, join(p.header, p.data));
  return run_cli(dir.path.string(), with(args, {"--resume"}));
}

}  // namespace

TEST_CASE("--resume from a checkpoint whose training state cannot be read is refused with one line") {
  ScratchDir dir;
  spit(dir.file("text.txt"), text_of_length(3000));
  const auto args =
      with({"train", "--data", "text.txt", "--max-iters", "4", "--eval-interval", "2", "--out", "runs"}, kTiny);
  CliRun made = run_cli(dir.path.string(), with(args, {"--stop-after", "2"}));
  REQUIRE_MESSAGE(made.code == 0, made.out);
  const std::string path = dir.file("runs/softmax/checkpoint.safetensors");
  const std::string good = slurp(path);
  struct Bad {
    const char* key;
    const char* value;
    const char* expect;
  };
  for (const Bad& b :
       {Bad{"tapegrad.step", "two", "cannot be read"}, Bad{"tapegrad.rng", "-", "cannot be read"},
        Bad{"tapegrad.log", "[[1, 2", "cannot be read"}, Bad{"tapegrad.evals", "[[\"a\"]]", "not an integer"},
        Bad{"tapegrad.step", "99999999999999999999999", "cannot be read"},
        Bad{"tapegrad.log", "[[1.8e20, 0.001, 4.2, null, 1.0]]", "not an integer"},
        // A count is decimal digits, whole, in range: nothing read as its prefix, no sign, no wrap.
        Bad{"tapegrad.step", "20abc", "'tapegrad.step' is '20abc', not a whole number from 0 to"},
        Bad{"tapegrad.step", "-5", "'tapegrad.step' is '-5', not a whole number"},
        Bad{"tapegrad.step", "+2", "'tapegrad.step' is '+2', not a whole number"},
        Bad{"tapegrad.step", " 2", "'tapegrad.step' is ' 2', not a whole number"},
        Bad{"tapegrad.step", "9223372036854775808", "not a whole number from 0 to 9223372036854775807"},
        Bad{"tapegrad.rng", "-1", "'tapegrad.rng' is '-1', not a whole number"},
        Bad{"tapegrad.rng", "18446744073709551616", "'tapegrad.rng' is '18446744073709551616'"}}) {
    const std::string key = b.key, value = b.value;
    CAPTURE(key);
    CAPTURE(value);
    CliRun r = resume_edited(dir, args, path, good, {{key, value}});
    CAPTURE(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.rfind("tapegrad: error: --resume: ", 0) == 0);
    CHECK(r.out.find(b.expect) != std::string::npos);
    CHECK(r.out.find('\n') == r.out.size() - 1);
  }
}

TEST_CASE("--resume refuses a training state that disagrees with itself, naming the two facts") {
  // Each edit keeps every field readable (and the checksums are dropped, as a file written without them is read):
  // only their agreement is wrong.
  ScratchDir dir;
  spit(dir.file("text.txt"), text_of_length(3000));
  const auto args =
      with({"train", "--data", "text.txt", "--max-iters", "6", "--eval-interval", "2", "--out", "runs"}, kTiny);
  CliRun made = run_cli(dir.path.string(), with(args, {"--stop-after", "4"}));
  REQUIRE_MESSAGE(made.code == 0, made.out);
  const std::string path = dir.file("runs/softmax/checkpoint.safetensors");
  const std::string good = slurp(path);
  struct Bad {
    const char* key;
    const char* value;
    const char* expect;
    const char* also_key = nullptr;  // a second edit, where the first alone is caught by another fact
    const char* also_value = nullptr;
  };
  for (const Bad& b :
       {Bad{"tapegrad.step", "0", "the run is at step 0 ('tapegrad.step') and the optimizer has taken 4"},
        // the weights, optimizer and log of step 4 under a step of 0 (and an optimizer edited to match)
        Bad{"tapegrad.step", "0", "past the run's step 0", "tapegrad.adam_steps", "0"},
        Bad{"tapegrad.step", "2", "past the run's step 2", "tapegrad.adam_steps", "2"},
        Bad{"tapegrad.adam_steps", "3", "the run is at step 4 ('tapegrad.step') and the optimizer has taken 3"},
        Bad{"tapegrad.log", "{}", "its 'tapegrad.log' is object, not a list"},
        Bad{"tapegrad.evals", "{}", "its 'tapegrad.evals' is object, not a list"},
        Bad{"tapegrad.log", "[]", "the run is at step 4 and its log ends at step -1"},
        Bad{"tapegrad.log", "[[3, 0.001, 4.2, null, 1.0], [1, 0.001, 4.2, null, 1.0]]",
            "its log goes back from step 3 to step 1"},
        Bad{"tapegrad.evals", "[[0, 4.1, 4.2], [9, 4.0, 4.1]]", "its evaluations has a row at step 9"}}) {
    const std::string key = b.key, value = b.value;
    CAPTURE(key);
    CAPTURE(value);
    std::vector<std::pair<std::string, std::string>> edits{{key, value}};
    if (b.also_key) edits.emplace_back(b.also_key, b.also_value);
    CliRun r = resume_edited(dir, args, path, good, edits);
    CAPTURE(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find(b.expect) != std::string::npos);
    CHECK(r.out.find('\n') == r.out.size() - 1);
  }
  // A key given twice in one object of the header: the JSON reader would keep the last.
  {
    Parts p = split(good);
    p.header["__metadata__"].erase(std::string(kChecksumKey));
    p.header["__metadata__"].erase(std::string(kHeaderChecksumKey));
    std::string text = p.header.dump();
    const std::string meta = "\"__metadata__\":{";
    REQUIRE(text.find(meta) != std::string::npos);
    text.insert(text.find(meta) + meta.size(), "\"tapegrad.step\":\"1\",");
    spit(path, le64(text.size()) + text + p.data);
    CliRun r = run_cli(dir.path.string(), with(args, {"--resume"}));
    CAPTURE(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("gives the key 'tapegrad.step' twice in one object") != std::string::npos);
  }
  // AdamW's moments: a NaN, or a negative mean of squares, is refused as it is read.
  for (const char* which : {"optimizer.exp_avg.", "optimizer.exp_avg_sq."}) {
    CAPTURE(which);
    Parts p = split(good);
    std::string name;
    for (const auto& [key, value] : p.header.items())
      if (key.rfind(which, 0) == 0 && name.empty()) name = key;
    REQUIRE(!name.empty());
    const size_t at = p.header[name]["data_offsets"][0].get<size_t>();
    const float poison = std::string(which) == "optimizer.exp_avg." ? std::numeric_limits<float>::quiet_NaN() : -1.0f;
    std::memcpy(p.data.data() + at, &poison, sizeof poison);
    p.header["__metadata__"].erase(std::string(kChecksumKey));
    p.header["__metadata__"].erase(std::string(kHeaderChecksumKey));
    spit(path, join(p.header, p.data));
    CliRun r = run_cli(dir.path.string(), with(args, {"--resume"}));
    CAPTURE(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find(name) != std::string::npos);
    CHECK(r.out.find(std::string(which) == "optimizer.exp_avg." ? "not a finite number" : "a mean of squares") !=
          std::string::npos);
  }
}

TEST_CASE("a checkpoint's vocabulary must be its model's, and --resume refuses another precision by name") {
  ScratchDir dir;
  CliRun made = make_tiny_run(dir.path, 2);
  REQUIRE_MESSAGE(made.code == 0, made.out);
  const std::string path = dir.file(kTinyCheckpoint);
  const std::string good = slurp(path);
  auto edited = [&](const char* key, const std::string& value) {
    Parts p = split(good);
    p.header["__metadata__"][key] = value;
    p.header["__metadata__"].erase(std::string(kChecksumKey));
    p.header["__metadata__"].erase(std::string(kHeaderChecksumKey));
    spit(path, join(p.header, p.data));
  };
  const auto resume = with(
      {"train", "--data", "text.txt", "--max-iters", "4", "--eval-interval", "2", "--out", "made", "--resume"}, kTiny);
  const std::string vocab = load_checkpoint(path).metadata.at("tapegrad.vocab");
  for (const std::string& bad :
       {std::string("abc"), vocab.substr(1) + vocab.substr(0, 1), vocab + vocab.substr(0, 1)}) {
    CAPTURE(bad);
    edited("tapegrad.vocab", bad);
    const std::string expect = bad == "abc" ? "holds 3 symbols, but its model's vocab_size is" : "is not its";
    for (const auto& args :
         {std::vector<std::string>{"sample", "--checkpoint", kTinyCheckpoint, "--tokens", "5"},
          std::vector<std::string>{"evaluate", "--checkpoint", kTinyCheckpoint, "--text", "the"}, resume}) {
      CliRun r = run_cli(dir.path.string(), args);
      CAPTURE(r.out);
      CHECK(r.code == 2);
      CHECK(r.out.find("its vocabulary ('tapegrad.vocab') " + expect) != std::string::npos);
    }
  }
  // The precision of the products: refused by name, allowed with --allow-change (which needs no bf16 unit when the
  // run asks for f32, as this one does).
  nlohmann::json train = nlohmann::json::parse(split(good).header["__metadata__"]["tapegrad.train"].get<std::string>());
  train["precision"] = "bf16";
  edited("tapegrad.train", train.dump());
  CliRun r = run_cli(dir.path.string(), resume);
  CAPTURE(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("was trained with --precision bf16, this run asks for --precision f32; --allow-change") !=
        std::string::npos);
  CliRun allowed = run_cli(dir.path.string(), with(resume, {"--allow-change"}));
  CHECK_MESSAGE(allowed.code == 0, allowed.out);
}
