// Safetensors checkpoints: round trips, the byte layout checked by hand, and every kind of damaged file
// refused with an Error that names it.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/checkpoint.hpp"
#include "models/files.hpp"
#include "training_test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

// A safetensors file made by hand: length, header as given (no padding), data.
std::string raw_file(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

template <class T>
std::string bytes_of(std::initializer_list<T> values) {
  std::string s(values.size() * sizeof(T), '\0');
  std::memcpy(s.data(), values.begin(), s.size());
  return s;
}

std::string tensor_bytes(const Tensor& t) { return {static_cast<const char*>(t.raw()), t.nbytes()}; }

Checkpoint sample_checkpoint() {
  Checkpoint ck;
  ck.tensors.push_back({"wte", Tensor::from<float>({2, 3}, {1.5f, -2, 3, 4, 5e-8f, 6})});
  ck.tensors.push_back({"ln.bias", Tensor::from<double>({4}, {0.1, -0.2, 1e300, -0.0})});
  ck.tensors.push_back({"ids", Tensor::from<int32_t>({2, 1, 2}, {7, -8, 2147483647, 0})});
  ck.tensors.push_back({"scalar", Tensor::from<float>(Shape{}, {42.0f})});
  ck.tensors.push_back({"empty", Tensor::empty(DType::f32, {0, 3})});
  ck.metadata = {{"step", "1200"}, {"config", R"({"n_layer": 4})"}, {"note", "café ☕"}};
  return ck;
}

}  // namespace

TEST_CASE("a checkpoint of f32, f64 and i32 tensors and metadata round-trips exactly") {
  ScratchDir dir;
  std::string path = dir.file("model.safetensors");
  Checkpoint ck = sample_checkpoint();
  save_checkpoint(path, ck);
  Checkpoint back = load_checkpoint(path);
  REQUIRE(back.tensors.size() == ck.tensors.size());
  for (size_t i = 0; i < ck.tensors.size(); ++i) {
    CAPTURE(ck.tensors[i].name);
    CHECK(back.tensors[i].name == ck.tensors[i].name);
    CHECK(back.tensors[i].tensor.dtype() == ck.tensors[i].tensor.dtype());
    CHECK(back.tensors[i].tensor.shape() == ck.tensors[i].tensor.shape());
    CHECK(tensor_bytes(back.tensors[i].tensor) == tensor_bytes(ck.tensors[i].tensor));
    CHECK(reinterpret_cast<uintptr_t>(back.tensors[i].tensor.raw()) % 64 == 0);
  }
  CHECK(back.metadata == ck.metadata);  // the checksum is the file's, not the checkpoint's
  CHECK(back.at("ids").data<int32_t>()[1] == -8);
  CHECK(back.at("ln.bias").item(2) == 1e300);

  // Saving again over the file replaces it whole, with nothing left beside it.
  ck.metadata["step"] = "1300";
  save_checkpoint(path, ck);
  CHECK(load_checkpoint(path).metadata.at("step") == "1300");
  CHECK(dir.entries() == std::vector<std::string>{"model.safetensors"});
}

TEST_CASE("at() names a missing tensor; find() returns null") {
  Checkpoint ck = sample_checkpoint();
  CHECK(ck.find("wte") == &ck.tensors[0].tensor);
  CHECK(ck.find("nope") == nullptr);
  CHECK_ERROR_HAS(ck.at("lm_head"), "lm_head", "wte");
}

TEST_CASE("the file is safetensors byte for byte") {
  ScratchDir dir;
  std::string path = dir.file("layout.safetensors");
  Checkpoint ck;
  ck.tensors.push_back({"a", Tensor::from<float>({2, 3}, {1, 2, 3, 4, 5, 6})});
  ck.tensors.push_back({"b", Tensor::from<int32_t>({2}, {7, -8})});
  ck.tensors.push_back({"c", Tensor::from<double>({1}, {0.5})});
  ck.metadata = {{"k", "v"}};
  save_checkpoint(path, ck);
  std::string f = slurp(path);

  // 8-byte little-endian header length; the header ends where the data section begins, at a multiple of 8.
  REQUIRE(f.size() >= 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(f[static_cast<size_t>(i)]);
  REQUIRE(8 + n <= f.size());
  CHECK((8 + n) % 8 == 0);
  std::string header = f.substr(8, n);
  CHECK(header.front() == '{');
  size_t close = header.rfind('}');
  CHECK(header.find_first_not_of(' ', close + 1) == std::string::npos);  // padded with spaces only
  CHECK(header.size() - close - 1 < 8);

  auto j = nlohmann::json::parse(header);
  CHECK(j["a"] == nlohmann::json::parse(R"({"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]})"));
  CHECK(j["b"] == nlohmann::json::parse(R"({"dtype": "I32", "shape": [2], "data_offsets": [24, 32]})"));
  CHECK(j["c"] == nlohmann::json::parse(R"({"dtype": "F64", "shape": [1], "data_offsets": [32, 40]})"));
  CHECK(j["__metadata__"]["k"] == "v");
  CHECK(j.size() == 4);

  // Raw little-endian data, back to back in the given order.
  std::string data = f.substr(8 + n);
  REQUIRE(data.size() == 40);
  CHECK(data.substr(0, 24) == bytes_of<float>({1, 2, 3, 4, 5, 6}));
  CHECK(data.substr(24, 8) == std::string("\x07\x00\x00\x00\xf8\xff\xff\xff", 8));
  CHECK(data.substr(32, 8) == std::string("\x00\x00\x00\x00\x00\x00\xe0\x3f", 8));  // 0.5 as IEEE 754

  // The checksum is FNV-1a 64 of the data section, as 16 hex digits.
  CHECK(fnv1a64("") == 0xcbf29ce484222325ULL);
  CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cULL);
  CHECK(fnv1a64("foobar") == 0x85944171f73967e8ULL);
  CHECK(j["__metadata__"]["tapegrad.checksum"] == fmt::format("{:016x}", fnv1a64(data)));
}

TEST_CASE("a file from another safetensors writer loads: no padding, no checksum, any key order") {
  ScratchDir dir;
  std::string path = dir.file("other.safetensors");
  std::string header =
      R"({"z":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"shape":[],"dtype":"I32","data_offsets":[8,12]},)"
      R"("e":{"dtype":"F64","shape":[0],"data_offsets":[12,12]},"__metadata__":{"format":"pt"}})";
  spit(path, raw_file(header, bytes_of<float>({1.25f, -3}) + bytes_of<int32_t>({99})));
  Checkpoint ck = load_checkpoint(path);
  REQUIRE(ck.tensors.size() == 3);
  CHECK(ck.tensors[0].name == "z");  // in the order of the data
  CHECK(ck.tensors[1].name == "a");
  CHECK(ck.at("z").to_vector() == std::vector<double>{1.25, -3});
  CHECK(ck.at("a").shape().rank() == 0);
  CHECK(ck.at("a").item() == 99);
  CHECK(ck.at("e").numel() == 0);
  CHECK(ck.metadata == std::map<std::string, std::string>{{"format", "pt"}});
}

TEST_CASE("a flipped byte in the data is caught by the checksum") {
  ScratchDir dir;
  std::string path = dir.file("flip.safetensors");
  save_checkpoint(path, sample_checkpoint());
  std::string f = slurp(path);
  f[f.size() - 20] = static_cast<char>(f[f.size() - 20] ^ 0x01);
  spit(path, f);
  CHECK_ERROR_HAS(load_checkpoint(path), path, "checksum mismatch");
}

TEST_CASE("a truncated file is refused at every length") {
  ScratchDir dir;
  std::string good = dir.file("good.safetensors");
  save_checkpoint(good, sample_checkpoint());
  std::string f = slurp(good);
  std::string path = dir.file("cut.safetensors");
  for (size_t len :
       {size_t{0}, size_t{5}, size_t{8}, size_t{9}, size_t{40}, f.size() / 2, f.size() - 30, f.size() - 1}) {
    CAPTURE(len);
    spit(path, f.substr(0, len));
    CHECK_ERROR_HAS(load_checkpoint(path), path);
  }
}

TEST_CASE("damaged headers are refused with a message that says what is wrong") {
  ScratchDir dir;
  std::string path = dir.file("bad.safetensors");
  std::string f24 = bytes_of<float>({1, 2, 3, 4, 5, 6});
  struct Bad {
    const char* what;
    std::string file;
    const char* message;
  };
  auto entry = [](const char* name, const char* dtype, const char* shape, const char* offsets) {
    return fmt::format(R"("{}":{{"dtype":{},"shape":{},"data_offsets":{}}})", name, dtype, shape, offsets);
  };
  std::vector<Bad> cases = {
      {"header length above the file", le64(1000) + "{}", "truncated"},
      {"header length above 100 MB", le64(200'000'000) + "{}", "above the limit"},
      {"header not JSON", raw_file("{not json", ""), "not valid JSON"},
      {"header not an object", raw_file("[1, 2, 3]", ""), "JSON array, not an object"},
      {"header a JSON string", raw_file(R"("text")", ""), "not an object"},
      {"overlapping offsets",
       raw_file("{" + entry("a", R"("F32")", "[4]", "[0,16]") + "," + entry("b", R"("F32")", "[2]", "[8,16]") + "}",
                f24.substr(0, 16)),
       "overlap"},
      {"offsets past the data section",
       raw_file("{" + entry("a", R"("F32")", "[6]", "[0,24]") + "}", f24.substr(0, 16)), "leave the data section"},
      {"offsets that disagree with the shape", raw_file("{" + entry("a", R"("F32")", "[2,3]", "[0,20]") + "}", f24),
       "needs 24 bytes"},
      {"offsets that disagree with the dtype", raw_file("{" + entry("a", R"("F64")", "[6]", "[0,24]") + "}", f24),
       "needs 48 bytes"},
      {"a gap in the data section", raw_file("{" + entry("a", R"("F32")", "[5]", "[4,24]") + "}", f24),
       "belong to no tensor"},
      {"trailing bytes", raw_file("{" + entry("a", R"("F32")", "[5]", "[0,20]") + "}", f24), "tensors use 20"},
      {"end before begin", raw_file("{" + entry("a", R"("F32")", "[0]", "[8,4]") + "}", f24), "end before"},
      {"unknown dtype F16", raw_file("{" + entry("a", R"("F16")", "[12]", "[0,24]") + "}", f24),
       "unsupported dtype \"F16\""},
      {"unknown dtype BOOL", raw_file("{" + entry("a", R"("BOOL")", "[24]", "[0,24]") + "}", f24), "unsupported"},
      {"dtype not a string", raw_file("{" + entry("a", "7", "[6]", "[0,24]") + "}", f24), "unsupported dtype 7"},
      {"negative dimension", raw_file("{" + entry("a", R"("F32")", "[-6]", "[0,24]") + "}", f24), "negative"},
      {"fractional dimension", raw_file("{" + entry("a", R"("F32")", "[1.5]", "[0,24]") + "}", f24), "non-integer"},
      {"huge shape", raw_file("{" + entry("a", R"("F32")", "[4294967296,4294967296,16]", "[0,24]") + "}", f24),
       "larger than the whole data section"},
      {"huge dimension next to a zero",
       raw_file("{" + entry("a", R"("F32")", "[0,18446744073709551615]", "[0,0]") + "}", ""), "out of range"},
      {"rank above 6", raw_file("{" + entry("a", R"("F32")", "[1,1,1,1,1,1,6]", "[0,24]") + "}", f24), "rank 7"},
      {"shape not an array", raw_file("{" + entry("a", R"("F32")", "6", "[0,24]") + "}", f24), "shape must be"},
      {"one offset", raw_file("{" + entry("a", R"("F32")", "[6]", "[24]") + "}", f24), "two non-negative"},
      {"negative offset", raw_file("{" + entry("a", R"("F32")", "[6]", "[-1,23]") + "}", f24), "two non-negative"},
      {"entry without offsets", raw_file(R"({"a":{"dtype":"F32","shape":[6]}})", f24), "no \"data_offsets\""},
      {"entry not an object", raw_file(R"({"a":[1,2]})", f24), "expected an object"},
      {"metadata not an object", raw_file(R"({"__metadata__":[1]})", ""), "__metadata__ must be"},
      {"metadata value not a string", raw_file(R"({"__metadata__":{"step":12}})", ""), "not a string"},
      {"a text file", "hello, this is a plain text file and not a checkpoint\n", "not a safetensors file"},
      {"a PNG file", std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16), "not a safetensors file"},
      {"a JSON file", R"({"step": 1, "loss": 2.5})", "not a safetensors file"},
  };
  for (const Bad& c : cases) {
    CAPTURE(c.what);
    spit(path, c.file);
    CHECK_ERROR_HAS(load_checkpoint(path), path, c.message);
  }
}

TEST_CASE("loading refuses a missing file and a directory") {
  ScratchDir dir;
  std::string missing = dir.file("missing.safetensors");
  CHECK_ERROR_HAS(load_checkpoint(missing), missing, "no such file");
  CHECK_ERROR_HAS(load_checkpoint(dir.path.string()), "directory");
}

TEST_CASE("saving refuses what safetensors cannot hold, and names the file") {
  ScratchDir dir;
  std::string path = dir.file("x.safetensors");
  Tensor t = Tensor::from<float>({1}, {1});
  Checkpoint dup;
  dup.tensors = {{"w", t}, {"w", t}};
  CHECK_ERROR_HAS(save_checkpoint(path, dup), "two tensors are named 'w'");
  Checkpoint reserved;
  reserved.tensors = {{"__metadata__", t}};
  CHECK_ERROR_HAS(save_checkpoint(path, reserved), "reserved");
  Checkpoint undefined;
  undefined.tensors = {{"w", Tensor()}};
  CHECK_ERROR_HAS(save_checkpoint(path, undefined), "undefined");
  Checkpoint bad_utf8;
  bad_utf8.tensors = {{"w\xff", t}};
  CHECK_ERROR_HAS(save_checkpoint(path, bad_utf8), "UTF-8");
  std::string nowhere = dir.file("no/dir/x.safetensors");
  CHECK_ERROR_HAS(save_checkpoint(nowhere, sample_checkpoint()), nowhere);
  CHECK(dir.entries().empty());
}
