#include "models/attention_kinds.hpp"

#include <fmt/format.h>

#include "engine/tensor.hpp"

namespace tapegrad {

const std::vector<AttentionKind>& attention_kind_table() {
  using N = AttentionKind::Node;
  using KV = AttentionKind::KeysValues;
  static const std::vector<AttentionKind> table{
      {"softmax", "standard multi-head attention, one fused node", "the attention-gradient and attention-bias posts",
       N::softmax, KV::projected, 3, true},
      {"tiled", "the same map, memory-lean tiled node", "the attention-bias post", N::tiled, KV::projected, 3, false},
      {"beta", "softmax replaced by β(x) = x/(1+‖x‖)", "the β-attention post", N::beta, KV::projected, 3, true},
      {"linear", "φ(q)ᵀS / φ(q)ᵀz with φ = elu + 1", "the linear-attention post", N::linear, KV::projected, 3, true},
      {"optimised", "no W^V: values are the input sliced per head", "the better-attention post", N::softmax,
       KV::values_input, 2, true},
      {"efficient", "no W^V, no W^K: keys and values are the input per head", "the better-attention post", N::softmax,
       KV::input, 1, true},
      {"super", "efficient, and values W^A·x with a learned lower-triangular W^A (T×T) per layer",
       "the better-attention post", N::softmax, KV::values_mixed, 1, true},
  };
  return table;
}

const std::vector<std::string>& attention_kinds() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& k : attention_kind_table()) v.emplace_back(k.name);
    return v;
  }();
  return names;
}

std::string attention_kind_list() { return fmt::format("{}", fmt::join(attention_kinds(), ", ")); }

const AttentionKind& attention_kind(std::string_view name) {
  for (const auto& k : attention_kind_table())
    if (k.name == name) return k;
  fail("unknown attention kind '{}' (one of {})", name, attention_kind_list());
}

std::vector<std::string> compared_attention_kinds() {
  std::vector<std::string> v;
  for (const auto& k : attention_kind_table())
    if (k.compared) v.emplace_back(k.name);
  return v;
}

std::string attention_kind_help() {
  std::string s;
  for (const auto& k : attention_kind_table()) s += fmt::format("\n  {:<10} {} ({})", k.name, k.description, k.source);
  return s;
}

}  // namespace tapegrad
