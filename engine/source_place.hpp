// SourcePlace: the file and line of a call, taken at the caller as std::source_location::current() would be.
//
// Built on __builtin_FILE/__builtin_LINE, which GCC and Clang both provide, because std::source_location is not
// usable everywhere we build: libstdc++'s <source_location> needs __builtin_source_location, which Clang has only
// from version 15, and Debian bookworm's clang (the fuzz and sanitizer builds) is 14.
#pragma once

#include <cstdint>

namespace tapegrad {

class SourcePlace {
 public:
  // As a default argument, the builtins take the place of the call that omitted it.
  static constexpr SourcePlace current(const char* file = __builtin_FILE(),
                                       uint_least32_t line = __builtin_LINE()) noexcept {
    SourcePlace p;
    p.file_ = file;
    p.line_ = line;
    return p;
  }
  constexpr SourcePlace() noexcept = default;
  constexpr const char* file_name() const noexcept { return file_; }
  constexpr uint_least32_t line() const noexcept { return line_; }  // 0: unknown

 private:
  const char* file_ = "";
  uint_least32_t line_ = 0;
};

}  // namespace tapegrad
