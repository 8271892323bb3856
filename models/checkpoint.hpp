// Checkpoints in the safetensors format, readable by other safetensors tools:
//
//   bytes [0, 8)        N, the header length, unsigned 64-bit little-endian
//   bytes [8, 8 + N)    the header: a JSON object, padded with spaces so that 8 + N is a multiple of 8
//                         { "__metadata__": {string: string, ...},
//                           "<name>": {"dtype": "F32" | "F64" | "I32", "shape": [d0, d1, ...],
//                                      "data_offsets": [begin, end]}, ... }
//   bytes [8 + N, end)  the data section: each tensor's elements, row-major, little-endian, at
//                       [begin, end) relative to the start of the data section
//
// The writer lays the tensors out in the order given, back to back, and records an FNV-1a 64 checksum of the
// whole data section in the metadata under "tapegrad.checksum" (16 lowercase hex digits), and one of the header
// under "tapegrad.header_checksum": FNV-1a 64 of the header's JSON with keys sorted, no spaces, and this key left
// out — so that a header lying about offsets or shapes in a way the layout checks cannot see (two tensors of one
// size swapped, a shape of the same size) or about the metadata is refused too. The loader verifies each checksum
// when present and hands back the other metadata. The header is bounded: kMaxHeaderBytes, 32 levels of nesting,
// 4 million JSON values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../engine/tensor.hpp"
#include "module.hpp"

namespace tapegrad {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

struct Checkpoint {
  std::vector<NamedTensor> tensors;
  std::map<std::string, std::string> metadata;

  // The tensor called `name`; throws an Error naming it (and the names there are) if there is none.
  const Tensor& at(std::string_view name) const;
  // The tensor called `name`, or nullptr.
  const Tensor* find(std::string_view name) const;
};

// The metadata value under `key` of a training checkpoint read from `path`; throws naming both when it is missing.
const std::string& training_metadata(const Checkpoint& ck, const std::string& key, const std::string& path);

// A count in the metadata (a step, a generator's state), as the writer writes it: decimal digits only, from 0 to
// `max`. Anything else ("20abc", "-5", "+5", " 5", "1e3", "", a value above max) gives nullopt.
std::optional<uint64_t> metadata_count(std::string_view text, uint64_t max = UINT64_MAX);

// The metadata keys under which the writer records the data section's and the header's checksums.
inline constexpr std::string_view kChecksumKey = "tapegrad.checksum";
inline constexpr std::string_view kHeaderChecksumKey = "tapegrad.header_checksum";
// The largest header the loader accepts.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Writes `ck` to `path` atomically (the old file, if any, stays whole until the new one is complete).
// Throws an Error for duplicate or reserved names, undefined tensors, or a failed write.
void save_checkpoint(const std::string& path, const Checkpoint& ck);

// Reads a checkpoint into owning tensors, in the order of their data. Throws an Error naming the file for
// anything that is not a well-formed safetensors file of F32/F64/I32 tensors, or whose checksum disagrees.
Checkpoint load_checkpoint(const std::string& path);
// The same from the bytes of a file; errors name `path`.
Checkpoint parse_checkpoint(std::string_view bytes, const std::string& path);

// A module's parameters, by their full names, as a safetensors file written as save_checkpoint writes (atomically,
// with checksums), with `metadata` in its header:
//   save_parameters("mlp.safetensors", mlp);   ...   load_parameters("mlp.safetensors", mlp);
void save_parameters(const std::string& path, const Module& module, std::map<std::string, std::string> metadata = {});
// Copies the file's tensors into the module's parameters of the same names. Refuses, changing nothing, a file whose
// names or shapes differ from the module's: the Error lists every parameter missing from the file, every tensor the
// module has no parameter for (unless its name begins with one of `ignore_prefixes`, such as "optimizer."), and every
// shape or dtype that differs.
void load_parameters(const std::string& path, Module& module);
void load_parameters(const Checkpoint& ck, Module& module, const std::string& path,
                     std::span<const std::string_view> ignore_prefixes = {});

// Refuses a float32 weight holding a NaN or ±∞, naming the parameter, the element and the file: such a weight would
// sample garbage and evaluate to "loss nan" without a word. load_parameters, --resume, sample and evaluate check
// every weight they load with it.
void refuse_non_finite_weight(const Tensor& t, std::string_view name, const std::string& path);

// FNV-1a 64 of a byte string, as the writer records it.
uint64_t fnv1a64(std::string_view bytes, uint64_t h = 0xcbf29ce484222325ULL);

}  // namespace tapegrad
