// Scratch directories and raw file access for the training-file tests.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tensor.hpp"

namespace tapegrad::testing {

// A fresh directory under the system's temporary directory, removed with everything in it at scope exit.
struct ScratchDir {
  std::filesystem::path path;
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "tapegrad-test-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
  // Names of the entries in the directory, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The message of the tapegrad::Error that f throws, or kNoError.
inline constexpr const char* kNoError = "<no error was thrown>";
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const tapegrad::Error& e) {
    return e.what();
  }
  return kNoError;
}

}  // namespace tapegrad::testing

// Checks that `expr` throws a tapegrad::Error whose message contains every one of the given strings.
#define CHECK_ERROR_HAS(expr, ...)                                                                  \
  do {                                                                                              \
    std::string error_message_ = ::tapegrad::testing::error_of([&] { (void)(expr); });             \
    INFO("message: ", error_message_);                                                              \
    CHECK(error_message_ != ::tapegrad::testing::kNoError);                                         \
    for (std::string_view part_ : std::initializer_list<std::string_view>{__VA_ARGS__})             \
      CHECK_MESSAGE(error_message_.find(part_) != std::string::npos, "expected: ", std::string(part_)); \
  } while (false)
