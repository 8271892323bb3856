// Character-level text data: Tiny Shakespeare's figures, multibyte UTF-8, batches, and every refusal.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "engine/tensor.hpp"
#include "models/data.hpp"
#include "training_test_util.hpp"
#include "test_paths.hpp"

using namespace tapegrad;
using tapegrad::testing::ScratchDir;
using tapegrad::testing::spit;

TEST_CASE("Tiny Shakespeare: 1,115,394 characters, 65 symbols, a 90/10 split, exact round trip") {
  std::string path = std::string(TAPEGRAD_SOURCE_DIR) + "/data/tinyshakespeare.txt";
  TextData d = TextData::load(path);
  CHECK(d.vocab.size() == 65);
  CHECK(d.vocab_size() == 65);
  CHECK(d.vocab.front() == U'\n');
  CHECK(d.vocab[1] == U' ');
  CHECK(d.vocab.back() == U'z');
  CHECK(d.train.size() == 1'003'854);
  CHECK(d.val.size() == 111'540);
  CHECK(d.train.size() + d.val.size() == 1'115'394);

  std::string text = tapegrad::testing::slurp(path);
  std::vector<int32_t> all = d.train;
  all.insert(all.end(), d.val.begin(), d.val.end());
  CHECK(d.encode(text) == all);
  CHECK(d.decode(all) == text);
  CHECK(d.decode(d.encode("First Citizen:")) == "First Citizen:");
  CHECK(d.encode("\n ") == std::vector<int32_t>{0, 1});
}

TEST_CASE("multibyte UTF-8: one token per code point, vocabulary sorted by code point") {
  std::string text = "héllo wörld — 日本語 🙂 é";
  TextData d = TextData::from_text(text, 0.5);
  // Code points: h é l l o ␠ w ö r l d ␠ — ␠ 日 本 語 ␠ 🙂 ␠ é  (21 in all)
  CHECK(d.train.size() + d.val.size() == 21);
  CHECK(d.train.size() == 10);
  std::vector<char32_t> expected = {U' ', U'd', U'h', U'l',  U'o',  U'r',  U'w',
                                    U'é', U'ö', U'—', U'語', U'日', U'本', U'🙂'};
  std::sort(expected.begin(), expected.end());
  CHECK(d.vocab == expected);
  std::vector<int32_t> all = d.train;
  all.insert(all.end(), d.val.begin(), d.val.end());
  CHECK(d.decode(all) == text);
  CHECK(d.encode("日本") == std::vector<int32_t>{10, 11});
  CHECK(d.decode(d.encode("🙂é")) == "🙂é");
  // Every split fraction in [0, 1], including the ends.
  CHECK(TextData::from_text(text, 0.0).train.empty());
  CHECK(TextData::from_text(text, 1.0).val.empty());
}

TEST_CASE("invalid UTF-8 is refused with its byte offset") {
  struct Bad {
    const char* what;
    std::string text;
    const char* offset;
  };
  std::vector<Bad> cases = {
      {"stray continuation byte", "abc\x80xyz", "byte offset 3"},
      {"truncated two-byte sequence", "ab\xc3", "byte offset 2"},
      {"lead byte followed by ASCII", "a\xc3(b", "byte offset 1"},
      {"overlong '/'", "ab\xc0\xaf", "byte offset 2"},
      {"overlong NUL", "\xc0\x80", "byte offset 0"},
      {"overlong three-byte", "xy\xe0\x80\xaf", "byte offset 2"},
      {"UTF-16 surrogate", "ok \xed\xa0\x80", "byte offset 3"},
      {"above U+10FFFF", "\xf4\x90\x80\x80", "byte offset 0"},
      {"invalid lead byte 0xff", "hello \xff", "byte offset 6"},
      {"valid text, then a bad byte", "héllo\xfe", "byte offset 6"},
  };
  for (const Bad& c : cases) {
    CAPTURE(c.what);
    CHECK_ERROR_HAS(TextData::from_text(c.text), "invalid UTF-8", c.offset);
  }
  TextData d = TextData::from_text("abc");
  CHECK_ERROR_HAS(d.encode("ab\x80"), "encode: invalid UTF-8 at byte offset 2");
}

TEST_CASE("empty, binary and unreadable files are refused, naming the path") {
  ScratchDir dir;
  std::string empty = dir.file("empty.txt");
  spit(empty, "");
  CHECK_ERROR_HAS(TextData::load(empty), empty, "empty");
  std::string binary = dir.file("model.bin");
  spit(binary, std::string("\x01\x02text\0\0\x7f", 9));
  CHECK_ERROR_HAS(TextData::load(binary), binary, "NUL byte at byte offset 6", "binary");
  std::string bad = dir.file("latin1.txt");
  spit(bad, "caf\xe9 au lait");
  CHECK_ERROR_HAS(TextData::load(bad), bad, "byte offset 3");
  std::string missing = dir.file("missing.txt");
  CHECK_ERROR_HAS(TextData::load(missing), missing);
  CHECK_ERROR_HAS(TextData::load(dir.path.string()), "directory");
  std::string big = dir.file("big.txt");
  spit(big, std::string(100, 'a'));
  CHECK_ERROR_HAS(TextData::load(big, 99), "limit");
  CHECK_ERROR_HAS(TextData::from_text("abc", 1.5), "[0, 1]");
}

TEST_CASE("encode and decode refuse what the vocabulary does not hold") {
  TextData d = TextData::from_text("abc\n");
  CHECK_ERROR_HAS(d.encode("abz"), "U+007A 'z'", "byte offset 2", "4 symbols");
  CHECK_ERROR_HAS(d.encode("aé"), "U+00E9 'é' at byte offset 1");
  CHECK_ERROR_HAS(d.encode("\t"), "U+0009 at byte offset 0");
  std::vector<int32_t> ids = {0, 4};
  CHECK_ERROR_HAS(d.decode(ids), "token id 4 at position 1", "[0, 4)");
  ids = {-1};
  CHECK_THROWS_AS(d.decode(ids), Error);
  CHECK(d.encode("").empty());
  CHECK(d.decode({}).empty());
}

TEST_CASE("sample_batch: rows of consecutive tokens, y shifted by one, reproducible from the seed") {
  std::vector<int32_t> data(50);
  for (int32_t i = 0; i < 50; ++i) data[static_cast<size_t>(i)] = 1000 + i;  // the token is its own position
  const int64_t B = 16, T = 8;
  std::vector<int32_t> x(B * T), y(B * T);
  Rng rng(7);
  sample_batch(data, B, T, rng, x.data(), y.data());
  std::vector<int32_t> offsets;
  for (int64_t b = 0; b < B; ++b) {
    int32_t o = x[static_cast<size_t>(b * T)] - 1000;
    offsets.push_back(o);
    CHECK(o >= 0);
    CHECK(o + T < 50);  // y's last token, data[o + T], exists
    for (int64_t t = 0; t < T; ++t) {
      CHECK(x[static_cast<size_t>(b * T + t)] == 1000 + o + t);
      CHECK(y[static_cast<size_t>(b * T + t)] == 1000 + o + t + 1);
    }
  }
  CHECK(std::adjacent_find(offsets.begin(), offsets.end(), std::not_equal_to<>()) != offsets.end());  // not all equal

  std::vector<int32_t> x2(B * T), y2(B * T);
  Rng rng2(7);
  sample_batch(data, B, T, rng2, x2.data(), y2.data());
  CHECK(x2 == x);
  CHECK(y2 == y);

  // Every offset in [0, n − T) is reachable, including the last: n = T + 1 leaves exactly one.
  std::vector<int32_t> tiny = {5, 6, 7};
  int32_t tx[2], ty[2];
  sample_batch(tiny, 1, 2, rng, tx, ty);
  CHECK(tx[0] == 5);
  CHECK(ty[1] == 7);
  std::vector<bool> seen(50 - T, false);
  for (int i = 0; i < 400; ++i) {
    sample_batch(data, 1, T, rng, x.data(), y.data());
    seen[static_cast<size_t>(x[0] - 1000)] = true;
  }
  CHECK(std::find(seen.begin(), seen.end(), false) == seen.end());
}

TEST_CASE("sample_batch refuses a split too short for one context, naming the lengths") {
  std::vector<int32_t> data(8, 0);
  std::vector<int32_t> x(64), y(64);
  Rng rng(1);
  CHECK_ERROR_HAS(sample_batch(data, 2, 8, rng, x.data(), y.data()), "split of 8 tokens", "T + 1 = 9");
  CHECK_ERROR_HAS(sample_batch({}, 1, 1, rng, x.data(), y.data()), "split of 0 tokens");
  CHECK_THROWS_AS(sample_batch(data, 1, 0, rng, x.data(), y.data()), Error);
  CHECK_THROWS_AS(sample_batch(data, -1, 2, rng, x.data(), y.data()), Error);
  TextData d = TextData::from_text("abcdefghij", 0.9);  // val holds 1 token
  CHECK_ERROR_HAS(sample_batch(d.val, 1, 4, rng, x.data(), y.data()), "split of 1 tokens");
}
