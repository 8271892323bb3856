#include "models/run_memory.hpp"

#include <algorithm>

#include "models/attention_kinds.hpp"

namespace tapegrad {

namespace {
constexpr double kHvpTapes = 2;  // an HVP's tape, in training steps' tapes
}  // namespace

TrainingMemory estimate_training_memory(const GPTConfig& m, int64_t batch, int64_t eval_iters, bool sharpness) {
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
  // A Hessian-vector product (models/sharpness.cpp) records the loss on a tape of its own, beside the training
  // step's, whose arena keeps its memory between steps. Forward over reverse (engine/tape.cpp, Tape::hvp): the
  // forward's values, a tangent for each of them, and a backward of two lanes, the cotangents and their tangents:
  // twice one step's tape. Then the power iteration's float32 vectors of the parameters' size: the direction, the
  // gradient and H·v as the tape returns them and summed per parameter, and the next direction.
  if (sharpness) e.hvp_bytes = kHvpTapes * e.tape_bytes + 6 * 4 * e.parameters;
  return e;
}

}  // namespace tapegrad
