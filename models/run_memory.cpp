#include "models/run_memory.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include "models/attention_kinds.hpp"
#include "checker/formulas/claim.hpp"

namespace tapegrad {

TrainingMemory estimate_training_memory(const GPTConfig& m, int64_t batch, int64_t eval_iters) {
  const double C = static_cast<double>(m.n_embd), T = static_cast<double>(m.block_size);
  const double V = static_cast<double>(m.vocab_size), L = static_cast<double>(m.n_layer);
  const double H = static_cast<double>(m.n_head), B = static_cast<double>(batch), rows = B * T;
  const AttentionKind& kind = attention_kind(m.attention);
  const double proj = static_cast<double>(kind.projections);
  const double bias = m.bias ? 1 : 0;

  TrainingMemory e;
  // Per block: two norms (w, b), c_attn and c_proj (and W^A), the MLP's 4C × C matrices (and biases).
  const double attention = proj * C * C + C * C + (kind.mixing_matrix() ? T * T : 0) + bias * (proj * C + C);
  const double block = 2 * (C + bias * C) + attention + 8 * C * C + bias * (4 * C + C);
  e.parameters = V * C + T * C + L * block + (C + bias * C);  // wte (tied to the head), wpe, blocks, ln_f
  e.parameter_bytes = 2 * 4 * e.parameters;
  e.optimizer_bytes = 2 * 4 * e.parameters;

  // Float32 elements one block keeps, at rows = B·T: ln_1 and ln_2 (out + μ, ρ), c_attn's output, the heads split
  // out of it and merged again (not for standard attention, whose node attention_qkv reads and writes the packed
  // layout), the attention's output, c_proj's output, the MLP's u and Φ(u) or tanh (4C each) and its output, and
  // with dropout the two residual sums (without, c_proj's and the MLP's outputs are the sums: they take the
  // residual) and one mask per residual branch. The attention map: B·h·T² for the nodes that keep it (softmax, β),
  // O(T) state for the tiled node and C-sized state for linear attention.
  const bool dropout = m.dropout > 0;
  const double dropout_masks = dropout ? 2 * rows * C : 0, residual_sums = dropout ? 2 * rows * C : 0;
  const double heads = kind.packed_heads() ? 0 : rows * proj * C + rows * C;
  const bool keeps_map = kind.node != AttentionKind::Node::tiled && kind.node != AttentionKind::Node::linear;
  const double map = keeps_map ? B * H * T * T : B * H * T * 4;
  const double per_block = 2 * (rows * C + 2 * rows) + rows * proj * C + heads + rows * C + rows * C + residual_sums +
                           2 * rows * 4 * C + rows * C + dropout_masks + map;
  // Embeddings (token and position rows, their sum), ln_f and the logits (cross-entropy keeps two numbers per row:
  // its exp(x − m) is one row at a time of the tape's scratch).
  const double head = 3 * rows * C + (rows * C + 2 * rows) + rows * V;
  // Backward holds a few gradients at once (recycled as it goes): room for four of the largest.
  const double largest = std::max({rows * V, rows * 4 * C, map});
  e.tape_bytes = 4 * (L * per_block + head + 4 * largest);
  e.eval_bytes = 2 * static_cast<double>(eval_iters) * 2 * rows * 4;  // two splits, x and y, int32
  return e;
}

void require_memory(double bytes, std::string_view what, std::string_view advice) {
  const std::optional<double> available = memory_available();
  if (available && bytes > *available)
    fail("{} needs about {} of memory, more than the {} available; {}", what, bytes_text(bytes), bytes_text(*available),
         advice);
}

void require_claim_memory(const ClaimText& c) {
  // The memory a claim takes is bounded by its inputs: float64 values on a few tapes (the forward, the claimed
  // derivatives, the finite differences' perturbed copies) whose intermediates are each at most a handful of
  // inputs' size. 64 float64 copies of the inputs is the estimate.
  double elements = 0;
  for (const InputSpec& in : c.inputs) elements += static_cast<double>(in.shape.numel());
  require_memory(64 * 8 * elements, fmt::format("claim {} ({:.4g} input elements)", c.where, elements),
                 "check the formula on smaller inputs: a derivative that holds on a 4x6 input holds on larger ones");
}

std::string memory_outlook(double bytes) {
  const std::optional<double> available = memory_available();
  return fmt::format("about {} estimated, {}", bytes_text(bytes),
                     available ? bytes_text(*available) + " available" : "available unknown");
}

namespace {

std::optional<double> read_number(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    return std::stod(text);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// TAPEGRAD_MEMORY_LIMIT's value: "4294967296", "512M", "4G".
double user_memory_limit(std::string_view text) {
  double number = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
  const std::string_view unit(end, static_cast<size_t>(text.data() + text.size() - end));
  double scale = 0;
  if (unit.empty()) scale = 1;
  else if (unit == "K" || unit == "k") scale = 1024.0;
  else if (unit == "M") scale = 1024.0 * 1024;
  else if (unit == "G") scale = 1024.0 * 1024 * 1024;
  if (ec != std::errc() || scale == 0 || !(number >= 0) || !std::isfinite(number))
    fail("TAPEGRAD_MEMORY_LIMIT={}: expected a size in bytes, or a number followed by K, M or G", text);
  return number * scale;
}

}  // namespace

std::optional<double> memory_available() {
  std::optional<double> available;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    double kb = 0;
    std::string unit;
    if (!(meminfo >> kb >> unit)) break;
    if (key == "MemAvailable:") {
      available = kb * 1024;
      break;
    }
  }
  const auto limit = read_number("/sys/fs/cgroup/memory.max"), used = read_number("/sys/fs/cgroup/memory.current");
  if (limit && used) available = available ? std::min(*available, *limit - *used) : *limit - *used;
  if (const char* cap = std::getenv("TAPEGRAD_MEMORY_LIMIT"); cap && *cap) {
    const double bytes = user_memory_limit(cap);
    available = available ? std::min(*available, bytes) : bytes;
  }
  return available;
}

static double status_bytes(const std::string& key) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind(key + ":", 0) == 0) {
      try {
        return std::stod(line.substr(key.size() + 1)) * 1024;  // "VmHWM:    81234 kB"
      } catch (const std::exception&) {
        return 0;
      }
    }
  return 0;
}

double resident_bytes() { return status_bytes("VmRSS"); }
double peak_resident_bytes() { return status_bytes("VmHWM"); }

std::string bytes_text(double bytes) {
  if (bytes >= 1024.0 * 1024 * 1024 * 1024) return fmt::format("{:.1f} TiB", bytes / (1024.0 * 1024 * 1024 * 1024));
  if (bytes >= 1024.0 * 1024 * 1024) return fmt::format("{:.1f} GiB", bytes / (1024.0 * 1024 * 1024));
  if (bytes >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024));
  if (bytes >= 1024.0) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  return fmt::format("{:.0f} bytes", bytes);
}

}  // namespace tapegrad
