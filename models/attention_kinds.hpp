// The attention kinds a GPT block can use, in one table that the model, the command line (train's --attention
// choices and help, compare's list), the bench and the error messages read. The posts are cited by their short
// names (docs/derivations.md, "Sources").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tapegrad {

struct AttentionKind {
  // The attention node that mixes the heads' values (ops/attention/attention.hpp).
  enum class Node { softmax, tiled, beta, linear };
  // Where the block's keys K′ and values V′ come from, per head i, X the block input, X_i its columns of head i:
  //   projected        K′ = X W^K, V′ = X W^V (c_attn holds q, k, v)
  //   values_input     K′ = X W^K, V′ = X_i   (c_attn holds q, k)
  //   input            K′ = V′ = X_i          (c_attn holds q)
  //   values_mixed     K′ = X_i, V′ = (W^A X)_i with W^A = tril(Θ), Θ a learned T×T matrix per layer
  enum class KeysValues { projected, values_input, input, values_mixed };

  std::string_view name;
  std::string_view description;  // what it computes, one line
  std::string_view source;       // the posts, by short name
  Node node;
  KeysValues keys_values;
  int64_t projections;  // rows of c_attn in units of n_embd: 3 (q, k, v), 2 (q, k), 1 (q)
  bool compared;        // in `tapegrad compare`'s default list (tiled is left out: it computes softmax's map)

  bool mixing_matrix() const { return keys_values == KeysValues::values_mixed; }
  // Standard attention on c_attn's q | k | v: one attention_qkv node, with no head split or merge on the tape.
  bool packed_heads() const { return node == Node::softmax && keys_values == KeysValues::projected; }
  // Parameters of one block's attention without biases: c_attn, c_proj and W^A (n_embd C, context T).
  int64_t parameter_count(int64_t C, int64_t T) const {
    return projections * C * C + C * C + (mixing_matrix() ? T * T : 0);
  }
};

// Every kind, in the order the command line lists them.
const std::vector<AttentionKind>& attention_kind_table();
// The kind called `name`; throws an Error listing the kinds there are.
const AttentionKind& attention_kind(std::string_view name);
// The kinds' names, in the table's order.
const std::vector<std::string>& attention_kinds();
// "softmax, tiled, beta, ...": for help texts and error messages.
std::string attention_kind_list();
// The names of the kinds in compare's default list.
std::vector<std::string> compared_attention_kinds();
// One line per kind: name, description and source, for --help.
std::string attention_kind_help();

}  // namespace tapegrad
