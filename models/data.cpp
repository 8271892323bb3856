#include "models/data.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>

#include <utf8cpp/utf8.h>

#include "engine/tensor.hpp"
#include "models/checkpoint.hpp"
#include "models/files.hpp"

namespace tapegrad {

namespace {

constexpr char32_t kCodePointEnd = 0x110000;  // one past the last Unicode code point

// Throws naming `what` and the byte offset of the first ill-formed sequence: a stray continuation byte, a
// truncated sequence, an overlong encoding, a surrogate (U+D800..U+DFFF) or a value above U+10FFFF.
void expect_utf8(std::string_view what, std::string_view s) {
  auto bad = utf8::find_invalid(s.begin(), s.end());
  if (bad == s.end()) return;
  size_t offset = static_cast<size_t>(bad - s.begin());
  std::string bytes;
  for (size_t i = offset; i < s.size() && i < offset + 4; ++i)
    bytes += fmt::format("{}{:02x}", i > offset ? " " : "", static_cast<unsigned char>(s[i]));
  fail("{}: invalid UTF-8 at byte offset {} (bytes {})", what, offset, bytes);
}

// "U+00E9 'é'", or just "U+000A" for a control character.
std::string describe_code_point(char32_t c) {
  std::string s = fmt::format("U+{:04X}", static_cast<uint32_t>(c));
  if (c >= 0x20 && c != 0x7f && !(c >= 0x80 && c < 0xa0)) {
    std::string ch;
    utf8::unchecked::append(static_cast<uint32_t>(c), std::back_inserter(ch));
    s += " '" + ch + "'";
  }
  return s;
}

}  // namespace

TextData TextData::from_text(std::string_view utf8, double train_fraction) {
  if (!(train_fraction >= 0.0 && train_fraction <= 1.0))
    fail("text data: the train fraction must lie in [0, 1], got {}", train_fraction);
  if (utf8.empty()) fail("text data: the text is empty");
  if (size_t nul = utf8.find('\0'); nul != std::string_view::npos)
    fail("text data: a NUL byte at byte offset {}: this is a binary file, not text", nul);
  expect_utf8("text data", utf8);

  // Pass 1: code points, and which of them occur. Pass 2: code points → token ids through a dense table.
  std::vector<int32_t> ids;
  ids.reserve(utf8.size());
  std::vector<bool> present(kCodePointEnd);
  uint32_t last = 0;  // the largest code point: the scan for the vocabulary stops there
  for (auto it = utf8.begin(); it != utf8.end();) {
    uint32_t c = utf8::unchecked::next(it);
    present[c] = true;
    last = std::max(last, c);
    ids.push_back(static_cast<int32_t>(c));
  }
  TextData d;
  d.text_bytes = utf8.size();
  d.text_checksum = fnv1a64(utf8);
  for (char32_t c = 0; c <= last; ++c)
    if (present[c]) d.vocab.push_back(c);
  std::vector<int32_t> id_of(static_cast<size_t>(d.vocab.back()) + 1, -1);
  for (size_t v = 0; v < d.vocab.size(); ++v) id_of[d.vocab[v]] = static_cast<int32_t>(v);
  for (int32_t& t : ids) t = id_of[static_cast<size_t>(t)];

  auto n_train = static_cast<size_t>(train_fraction * static_cast<double>(ids.size()));
  d.train.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n_train));
  d.val.assign(ids.begin() + static_cast<std::ptrdiff_t>(n_train), ids.end());
  return d;
}

TextData TextData::load(const std::string& path, size_t max_bytes) {
  // Held per byte of text: the text, and its token ids (an int32 per character) twice, as read and split.
  std::string text = read_file(path, max_bytes, 9);
  try {
    return from_text(text);
  } catch (const Error& e) {
    fail("'{}': {}", path, e.what());
  }
}

std::vector<int32_t> TextData::encode(std::string_view utf8) const {
  expect_utf8("encode", utf8);
  std::vector<int32_t> ids;
  ids.reserve(utf8.size());
  for (auto it = utf8.begin(); it != utf8.end();) {
    auto start = it;
    char32_t c = utf8::unchecked::next(it);
    auto v = std::lower_bound(vocab.begin(), vocab.end(), c);
    if (v == vocab.end() || *v != c)
      fail("encode: character {} at byte offset {} is not in the vocabulary of {} symbols", describe_code_point(c),
           start - utf8.begin(), vocab.size());
    ids.push_back(static_cast<int32_t>(v - vocab.begin()));
  }
  return ids;
}

std::string TextData::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t p = 0; p < ids.size(); ++p) {
    int32_t v = ids[p];
    if (v < 0 || static_cast<size_t>(v) >= vocab.size())
      fail("decode: token id {} at position {} is outside the vocabulary [0, {})", v, p, vocab.size());
    char32_t c = vocab[static_cast<size_t>(v)];
    if (c >= kCodePointEnd || (c >= 0xd800 && c <= 0xdfff))
      fail("decode: vocabulary entry {} is U+{:X}, not a Unicode scalar value", v, static_cast<uint32_t>(c));
    utf8::unchecked::append(static_cast<uint32_t>(c), std::back_inserter(out));
  }
  return out;
}

std::string TextData::default_prompt() const {
  if (vocab.empty()) fail("default_prompt: the vocabulary is empty");
  const char32_t first = std::binary_search(vocab.begin(), vocab.end(), U'\n') ? U'\n' : vocab.front();
  std::string out;
  utf8::unchecked::append(static_cast<uint32_t>(first), std::back_inserter(out));
  return out;
}

void sample_batch(std::span<const int32_t> data, int64_t B, int64_t T, Rng& rng, int32_t* x, int32_t* y) {
  if (B < 0 || T < 1) fail("sample_batch: need B ≥ 0 rows of T ≥ 1 tokens, got B = {}, T = {}", B, T);
  auto n = static_cast<int64_t>(data.size());
  if (n < T + 1) fail("sample_batch: a split of {} tokens is too short for one context of T + 1 = {} tokens", n, T + 1);
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = data.data() + rng.below(n - T);
    std::copy_n(row, T, x + b * T);
    std::copy_n(row + 1, T, y + b * T);
  }
}

}  // namespace tapegrad
