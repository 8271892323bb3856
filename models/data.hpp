// Character-level text data: a vocabulary of Unicode code points, the text as token ids, a train/val split,
// and random batches of contexts for next-token prediction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../engine/rng.hpp"

namespace tapegrad {

struct TextData {
  std::vector<char32_t> vocab;      // sorted distinct Unicode code points; token id v is vocab[v]
  std::vector<int32_t> train, val;  // token ids: the first train_fraction of the text is train, the rest val
  size_t text_bytes = 0;            // the text it was made from: its length in bytes and FNV-1a 64 of its bytes,
  uint64_t text_checksum = 0;       // which identify it (a resumed run refuses another text)

  // Decodes UTF-8 text into a vocabulary and a split. Throws an Error for empty text, a NUL byte (a binary
  // file) or invalid UTF-8 (naming the byte offset), and for a train_fraction outside [0, 1].
  static TextData from_text(std::string_view utf8, double train_fraction = 0.9);
  // read_file + from_text; errors name the path.
  static TextData load(const std::string& path, size_t max_bytes = size_t{256} << 20);

  // Token ids of UTF-8 text; throws an Error for invalid UTF-8 or a character that is not in the vocabulary.
  std::vector<int32_t> encode(std::string_view utf8) const;
  // UTF-8 text of token ids; throws an Error for an id outside [0, vocab.size()).
  std::string decode(std::span<const int32_t> ids) const;
  int64_t vocab_size() const { return static_cast<int64_t>(vocab.size()); }
  // What sampling starts from when no prompt is given: a newline, as nanoGPT starts, when the text has one; else
  // the vocabulary's first symbol (a text without a newline still samples).
  std::string default_prompt() const;
};

// B rows of T + 1 consecutive tokens at uniformly random offsets o ∈ [0, n − T), n = data.size():
//   x[b, t] = data[o_b + t],  y[b, t] = data[o_b + t + 1]   for t ∈ [0, T)
// x and y are (B, T) row-major buffers. Throws an Error naming the lengths if n < T + 1.
void sample_batch(std::span<const int32_t> data, int64_t B, int64_t T, Rng& rng, int32_t* x, int32_t* y);

}  // namespace tapegrad
