#include "models/checkpoint.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <cmath>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "models/files.hpp"

namespace tapegrad {

static_assert(std::endian::native == std::endian::little,
              "checkpoint data is copied as is: safetensors is little-endian, and so must the host be");

namespace {

// Files larger than this are refused before being read.
constexpr size_t kMaxCheckpointBytes = size_t{1} << 34;

std::string_view safetensors_dtype(DType d) {
  switch (d) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::i32: return "I32";
  }
  return "?";
}

bool parse_safetensors_dtype(std::string_view s, DType& d) {
  if (s == "F32") d = DType::f32;
  else if (s == "F64") d = DType::f64;
  else if (s == "I32") d = DType::i32;
  else return false;
  return true;
}

[[noreturn]] void refuse(const std::string& path, std::string_view why) { fail("checkpoint '{}': {}", path, why); }

std::string checksum_hex(uint64_t h) { return fmt::format("{:016x}", h); }

// A header fragment for a message, cut to 80 bytes at a character boundary (a lying header can hold megabytes).
std::string cut(std::string_view s) {
  if (s.size() <= 80) return std::string(s);
  size_t n = 77;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n)) + "...";
}
std::string brief(const nlohmann::json& v) {
  return cut(v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

// The header as its checksum covers it: keys sorted, compact, without the header checksum itself.
uint64_t header_checksum(nlohmann::json header) {
  if (auto meta = header.find("__metadata__"); meta != header.end() && meta->is_object())
    meta->erase(std::string(kHeaderChecksumKey));
  return fnv1a64(header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

// Whether `key` is `name` with one byte changed: a checksum's key damaged by a flipped bit, which would
// otherwise turn the check off (both checksums are optional, for files of other writers).
bool one_byte_from(std::string_view key, std::string_view name) {
  if (key.size() != name.size()) return false;
  size_t differ = 0;
  for (size_t i = 0; i < key.size(); ++i) differ += key[i] != name[i];
  return differ == 1;
}

// Bounds on the parsed header beyond its length: a header of nested or many tiny values would take many times its
// size in memory. A tapegrad header nests 3 deep and holds about 6 values per tensor.
constexpr int kMaxHeaderDepth = 32;
constexpr size_t kMaxHeaderValues = 4'000'000;

struct NotAHeader {
  std::string why;
};

// The JSON reader's events (SAX) of a header, counted before the tree is built: throws NotAHeader when the text nests
// deeper than kMaxHeaderDepth or makes more than kMaxHeaderValues events (a value, a key, a container's start or
// end), and rethrows the reader's own error for text that is not JSON.
struct HeaderBounds {
  using json = nlohmann::json;
  size_t events = 0;
  int depth = 0;
  // The keys of each object open at this point, innermost last (an array's entry is empty): a key given twice is
  // refused, where the JSON reader keeps the last (a header without checksums could say two things of one key).
  std::vector<std::set<std::string>> keys;
  bool event() {
    if (++events > kMaxHeaderValues) throw NotAHeader{fmt::format("holds more than {} JSON values", kMaxHeaderValues)};
    return true;
  }
  bool open() {
    if (++depth > kMaxHeaderDepth) throw NotAHeader{fmt::format("nests deeper than {} levels", kMaxHeaderDepth)};
    keys.emplace_back();
    return event();
  }
  bool close() {
    --depth;
    keys.pop_back();
    return event();
  }
  bool null() { return event(); }
  bool boolean(bool) { return event(); }
  bool number_integer(json::number_integer_t) { return event(); }
  bool number_unsigned(json::number_unsigned_t) { return event(); }
  bool number_float(json::number_float_t, const json::string_t&) { return event(); }
  bool string(json::string_t&) { return event(); }
  bool binary(json::binary_t&) { return event(); }
  bool start_object(std::size_t) { return open(); }
  bool key(json::string_t& k) {
    if (!keys.back().insert(k).second)
      throw NotAHeader{fmt::format("gives the key '{}' twice in one object", k.substr(0, 60))};
    return event();
  }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(); }
  bool end_array() { return close(); }
  [[noreturn]] bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) { throw e; }
};

// One tensor as the header describes it, checked against the data section of `data_bytes` bytes.
struct HeaderEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

HeaderEntry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& v,
                        uint64_t data_bytes) {
  auto bad = [&](std::string_view why) { refuse(path, fmt::format("tensor '{}': {}", cut(name), why)); };
  if (!v.is_object()) bad(fmt::format("expected an object with dtype, shape and data_offsets, got {}", brief(v)));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) bad(fmt::format("the entry has no \"{}\"", key));

  HeaderEntry e{name, DType::f32, Shape{}, 0, 0};
  const auto& dt = v["dtype"];
  if (!dt.is_string() || !parse_safetensors_dtype(dt.get_ref<const std::string&>(), e.dtype))
    bad(fmt::format("unsupported dtype {} (supported: F32, F64, I32)", brief(dt)));

  // The element count is bounded by the data section, which keeps every product below from overflowing.
  const auto& sh = v["shape"];
  if (!sh.is_array()) bad(fmt::format("shape must be an array of integers, got {}", brief(sh)));
  if (sh.size() > static_cast<size_t>(Shape::kMaxRank))
    bad(fmt::format("shape {} has rank {}, above the supported {}", brief(sh), sh.size(), Shape::kMaxRank));
  uint64_t count = 1;
  bool empty = false;
  std::vector<uint64_t> dims;
  for (const auto& d : sh) {
    if (!d.is_number_integer()) bad(fmt::format("shape {} holds a non-integer", brief(sh)));
    if (!d.is_number_unsigned()) bad(fmt::format("shape {} holds a negative dimension", brief(sh)));
    dims.push_back(d.get<uint64_t>());
    if (dims.back() == 0) empty = true;
  }
  if (!empty) {
    for (uint64_t d : dims)
      if (d > data_bytes || __builtin_mul_overflow(count, d, &count) || count > data_bytes)
        bad(fmt::format("shape {} is larger than the whole data section ({} bytes)", brief(sh), data_bytes));
  } else {
    count = 0;
    for (uint64_t d : dims)
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        bad(fmt::format("shape {} has a dimension out of range", brief(sh)));
  }
  for (uint64_t d : dims) e.shape.push_back(static_cast<int64_t>(d));

  const auto& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    bad(fmt::format("data_offsets must be two non-negative integers [begin, end], got {}", brief(off)));
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  if (e.begin > e.end) bad(fmt::format("data_offsets [{}, {}] end before they begin", e.begin, e.end));
  if (e.end > data_bytes)
    bad(fmt::format("data_offsets [{}, {}] leave the data section of {} bytes (the file is truncated or corrupt)",
                    e.begin, e.end, data_bytes));
  uint64_t nbytes = count * dtype_size(e.dtype);
  if (e.end - e.begin != nbytes)
    bad(fmt::format("data_offsets [{}, {}] span {} bytes, but shape {} of {} needs {} bytes", e.begin, e.end,
                    e.end - e.begin, brief(sh), safetensors_dtype(e.dtype), nbytes));
  return e;
}

}  // namespace

uint64_t fnv1a64(std::string_view bytes, uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

const Tensor* Checkpoint::find(std::string_view name) const {
  for (const auto& nt : tensors)
    if (nt.name == name) return &nt.tensor;
  return nullptr;
}

const Tensor& Checkpoint::at(std::string_view name) const {
  if (const Tensor* t = find(name)) return *t;
  std::string names;
  for (size_t i = 0; i < tensors.size() && i < 12; ++i) names += (i ? ", " : "") + tensors[i].name;
  if (tensors.size() > 12) names += ", ...";
  fail("checkpoint has no tensor '{}' (it holds {} tensors: {})", name, tensors.size(), names);
}

void save_checkpoint(const std::string& path, const Checkpoint& ck) {
  std::set<std::string_view> seen;
  uint64_t checksum = fnv1a64({});
  for (const auto& nt : ck.tensors) {
    if (nt.name == "__metadata__") fail("save_checkpoint '{}': the tensor name '__metadata__' is reserved", path);
    if (!seen.insert(nt.name).second) fail("save_checkpoint '{}': two tensors are named '{}'", path, nt.name);
    if (!nt.tensor.defined()) fail("save_checkpoint '{}': tensor '{}' is undefined", path, nt.name);
    checksum = fnv1a64({static_cast<const char*>(nt.tensor.raw()), nt.tensor.nbytes()}, checksum);
  }

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const auto& [k, v] : ck.metadata)
    if (k != kChecksumKey) meta[k] = v;
  meta[std::string(kChecksumKey)] = checksum_hex(checksum);
  header["__metadata__"] = std::move(meta);
  uint64_t offset = 0;
  for (const auto& nt : ck.tensors) {
    auto dims = nt.tensor.shape().dims();
    uint64_t end = offset + nt.tensor.nbytes();
    header[nt.name] = {{"dtype", safetensors_dtype(nt.tensor.dtype())},
                       {"shape", std::vector<int64_t>(dims.begin(), dims.end())},
                       {"data_offsets", {offset, end}}};
    offset = end;
  }

  std::string text;
  try {
    text = header.dump();
    header["__metadata__"][std::string(kHeaderChecksumKey)] =
        checksum_hex(header_checksum(nlohmann::json::parse(text)));
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    fail("save_checkpoint '{}': a tensor name or metadata string is not valid UTF-8 ({})", path, e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // 8 + N, and so the data section, aligned to 8 bytes
  if (text.size() > kMaxHeaderBytes)            // a file the loader would refuse is not written
    fail(
        "save_checkpoint '{}': the header would be {} bytes, above the {} bytes the loader accepts (its metadata "
        "holds {} bytes); nothing was written",
        path, text.size(), kMaxHeaderBytes, header["__metadata__"].dump().size());

  std::string head;
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) head.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  head += text;
  // The tensors' bytes go to the file from where they are: no copy of the model in memory.
  std::vector<std::string_view> pieces{head};
  for (const auto& nt : ck.tensors) pieces.emplace_back(static_cast<const char*>(nt.tensor.raw()), nt.tensor.nbytes());
  write_file_atomic(path, pieces);
}

Checkpoint load_checkpoint(const std::string& path) {
  return parse_checkpoint(read_file(path, kMaxCheckpointBytes, 2), path);
}

Checkpoint parse_checkpoint(std::string_view file, const std::string& path) {
  if (file.size() < 8)
    refuse(path, fmt::format("truncated: {} bytes, too short for the 8-byte header length", file.size()));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<unsigned char>(file[static_cast<size_t>(i)])} << (8 * i);
  if (n > kMaxHeaderBytes)
    refuse(path, fmt::format("header length {} is above the limit of {} bytes: not a safetensors file, or a "
                             "corrupt one",
                             n, kMaxHeaderBytes));
  if (n > file.size() - 8)
    refuse(path,
           fmt::format("truncated: the header length is {} bytes but only {} bytes follow it", n, file.size() - 8));
  std::string_view text = file.substr(8, n);
  // JSON has no NUL, but the JSON reader takes one for the end of its input: what follows would go unread.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    refuse(path,
           fmt::format("a NUL byte at offset {} of the header: not a safetensors file, or a corrupt one", 8 + nul));

  nlohmann::json header;
  try {
    // Two linear passes: the bounds on the events the text makes, then the tree. (The JSON reader's parser with a
    // callback scans an object's members at the end of each member that is an object: quadratic in a header of
    // many tensors.)
    HeaderBounds bounds;
    nlohmann::json::sax_parse(text, &bounds);
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number out of range (1e400)
    refuse(path, fmt::format("the header is not valid JSON (not a safetensors file?): {}", e.what()));
  } catch (const NotAHeader& e) {
    refuse(path, fmt::format("the header {}: not a safetensors file, or a corrupt one", e.why));
  }
  if (!header.is_object())
    refuse(path, fmt::format("the header is a JSON {}, not an object (not a safetensors file?)", header.type_name()));

  if (const auto meta = header.find("__metadata__"); meta != header.end() && meta->is_object()) {
    if (const auto sum = meta->find(std::string(kHeaderChecksumKey)); sum != meta->end()) {
      const std::string actual = checksum_hex(header_checksum(header));
      if (!sum->is_string() || sum->get_ref<const std::string&>() != actual)
        refuse(path, fmt::format("header checksum mismatch: the header hashes to {} but records {} (the file is "
                                 "corrupt, or its header was edited)",
                                 actual, brief(*sum)));
    }
  }

  std::string_view data = file.substr(8 + n);
  Checkpoint ck;
  std::vector<HeaderEntry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) refuse(path, "__metadata__ must be an object of strings");
      for (const auto& [mk, mv] : value.items()) {
        for (std::string_view name : {kChecksumKey, kHeaderChecksumKey})
          if (one_byte_from(mk, name))
            refuse(path, fmt::format("__metadata__ key '{}' is '{}' with one byte changed (the file is corrupt)",
                                     cut(mk), name));
        if (!mv.is_string())
          refuse(path, fmt::format("__metadata__ entry '{}' is {}, not a string", cut(mk), brief(mv)));
        ck.metadata[mk] = mv.get<std::string>();
      }
    } else {
      entries.push_back(parse_entry(path, key, value, data.size()));
    }
  }

  // The tensors must tile the data section: in order of their offsets, each begins where the previous ended.
  std::sort(entries.begin(), entries.end(), [](const HeaderEntry& a, const HeaderEntry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t covered = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const HeaderEntry& e = entries[i];
    if (e.begin < covered)
      refuse(path, fmt::format("tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", cut(entries[i - 1].name),
                               entries[i - 1].begin, entries[i - 1].end, cut(e.name), e.begin, e.end));
    if (e.begin > covered)
      refuse(path, fmt::format("bytes [{}, {}) of the data section belong to no tensor", covered, e.begin));
    covered = e.end;
  }
  if (covered != data.size())
    refuse(path, fmt::format("the data section holds {} bytes but its tensors use {}", data.size(), covered));

  if (auto it = ck.metadata.find(std::string(kChecksumKey)); it != ck.metadata.end()) {
    std::string actual = checksum_hex(fnv1a64(data));
    if (it->second != actual)
      refuse(path, fmt::format("checksum mismatch: the data hashes to {} but the header records {} (the file is "
                               "corrupt)",
                               actual, it->second));
    ck.metadata.erase(it);
  }
  ck.metadata.erase(std::string(kHeaderChecksumKey));

  ck.tensors.reserve(entries.size());
  for (const HeaderEntry& e : entries) {
    Tensor t = Tensor::empty(e.dtype, e.shape);
    if (e.end > e.begin) std::memcpy(t.raw(), data.data() + e.begin, e.end - e.begin);
    ck.tensors.push_back({e.name, std::move(t)});
  }
  return ck;
}

void save_parameters(const std::string& path, const Module& module, std::map<std::string, std::string> metadata) {
  Checkpoint ck;
  for (const auto& p : module.parameters()) ck.tensors.push_back({p.name, p.value});
  ck.metadata = std::move(metadata);
  save_checkpoint(path, ck);
}

void load_parameters(const std::string& path, Module& module) { load_parameters(load_checkpoint(path), module, path); }

void load_parameters(const Checkpoint& ck, Module& module, const std::string& path,
                     std::span<const std::string_view> ignore_prefixes) {
  std::vector<std::string> missing, unexpected, mismatched;
  std::vector<const Tensor*> found;
  std::set<std::string_view> names;
  for (const auto& p : module.parameters()) {
    names.insert(p.name);
    const Tensor* t = ck.find(p.name);
    if (!t) missing.push_back(p.name);
    else if (t->dtype() != DType::f32 || !(t->shape() == p.value.shape()))
      mismatched.push_back(fmt::format("{} is {} {} in the file, float32 {} in the module", p.name, t->dtype(),
                                       t->shape(), p.value.shape()));
    found.push_back(t);
  }
  for (const auto& nt : ck.tensors) {
    if (names.count(nt.name)) continue;
    bool ignored = false;
    for (std::string_view prefix : ignore_prefixes) ignored = ignored || std::string_view(nt.name).starts_with(prefix);
    if (!ignored) unexpected.push_back(nt.name);
  }
  for (size_t k = 0; k < found.size() && mismatched.empty(); ++k)
    if (found[k]) refuse_non_finite_weight(*found[k], module.parameters()[k].name, path);
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    std::string why;
    auto list = [&](std::string_view what, const std::vector<std::string>& items) {
      if (items.empty()) return;
      why += fmt::format("{}{} {}: {}", why.empty() ? "" : "; ", items.size(), what, fmt::join(items, ", "));
    };
    list("missing from the file", missing);
    list("unexpected (the module has no such parameter)", unexpected);
    list("of another shape", mismatched);
    fail("cannot load '{}' into {}: {}; nothing was loaded", path,
         module.name().empty() ? std::string("the model") : "module '" + module.name() + "'", why);
  }
  for (size_t k = 0; k < found.size(); ++k) module.parameters()[k].value.copy_from(*found[k]);
}

void refuse_non_finite_weight(const Tensor& t, std::string_view name, const std::string& path) {
  if (t.dtype() != DType::f32) return;
  const float* v = t.data<float>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i)
    if (!std::isfinite(v[i]))
      fail("cannot load '{}': parameter {} holds {} at element {} (a NaN or infinite weight); nothing was loaded", path,
           name, v[i], i);
}

const std::string& training_metadata(const Checkpoint& ck, const std::string& key, const std::string& path) {
  auto it = ck.metadata.find(key);
  if (it == ck.metadata.end())
    fail("checkpoint {}: not a tapegrad training checkpoint (no '{}' in its metadata)", path, key);
  return it->second;
}

std::optional<uint64_t> metadata_count(std::string_view text, uint64_t max) {
  if (text.empty()) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    if (__builtin_mul_overflow(v, uint64_t{10}, &v) || __builtin_add_overflow(v, uint64_t(c - '0'), &v))
      return std::nullopt;
  }
  if (v > max) return std::nullopt;
  return v;
}

}  // namespace tapegrad
