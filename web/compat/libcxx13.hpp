// What the C++ library of Debian's emscripten 3.1.6 (libc++ 13) lacks of C++20 and the library's sources use:
// std::bit_cast, and std::from_chars for double (libc++ 13 declares it only for integers; the formula parser,
// checker/formulas/expression_parse.cpp, and the number options read doubles with it). The WebAssembly build
// includes this header ahead of every source (web/CMakeLists.txt, -include). from_chars reads what the general
// format reads (an optional '-', digits with a point, an exponent, inf, nan), and no leading space or '+'.
#pragma once

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>
#include <system_error>
#include <version>

namespace std {

#ifndef __cpp_lib_bit_cast
template <class To, class From>
constexpr To bit_cast(const From& from) noexcept {
  static_assert(sizeof(To) == sizeof(From), "bit_cast: the two types must have one size");
  return __builtin_bit_cast(To, from);
}
#endif

inline from_chars_result from_chars(const char* first, const char* last, double& value,
                                    chars_format = chars_format::general) {
  if (first == last || *first == '+' || *first == ' ' || *first == '\t' || *first == '\n')
    return {first, errc::invalid_argument};
  const std::string text(first, last);  // strtod needs the end marked
  char* end = nullptr;
  errno = 0;
  const double parsed = std::strtod(text.c_str(), &end);
  if (end == text.c_str()) return {first, errc::invalid_argument};
  // strtod also reads hexadecimal ("0x1p3"), which the general format does not: there, only the "0" is a number.
  const size_t sign = text[0] == '-' ? 1 : 0;
  if (text.size() > sign + 1 && text[sign] == '0' && (text[sign + 1] == 'x' || text[sign + 1] == 'X')) {
    value = sign ? -0.0 : 0.0;
    return {first + sign + 1, errc{}};
  }
  const char* stop = first + (end - text.c_str());
  if (errno == ERANGE && std::isinf(parsed)) return {stop, errc::result_out_of_range};
  value = parsed;
  return {stop, errc{}};
}

}  // namespace std
