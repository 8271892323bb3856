// The memory a training run of the GPT needs, estimated from its configuration before anything is allocated:
// tapegrad train prints it and refuses a run whose estimate exceeds what the process may use
// (inspect/process_memory.hpp).
#pragma once

#include <cstdint>

#include "../inspect/process_memory.hpp"
#include "gpt.hpp"

namespace tapegrad {

struct TrainingMemory {
  double parameters = 0;       // the count
  double parameter_bytes = 0;  // values and gradients, float32
  double optimizer_bytes = 0;  // AdamW's two moments
  double tape_bytes = 0;       // one training step's tape: what forward keeps for backward, and backward's buffers
  double eval_bytes = 0;       // the fixed evaluation batches: token ids and targets of eval_iters batches per split
  double hvp_bytes = 0;        // with --sharpness-every: a Hessian-vector product's tape and the power iteration's
  double total() const { return parameter_bytes + optimizer_bytes + tape_bytes + eval_bytes + hvp_bytes; }
};

// From the shapes alone (in double: a configuration of 10⁵ layers is estimated, not overflowed). The tape's share
// counts, per block, the float32 tensors the nodes keep for backward at batch × context rows (layer norms, c_attn,
// the heads, the attention map or its O(T) state, the MLP's two hidden tensors, the projections and residuals,
// dropout masks), then the embeddings, the final norm and the logits, and room for the largest gradients backward
// holds at once. With `sharpness` (train --sharpness-every), the Hessian-vector products of models/sharpness.hpp too.
// The test memory_estimate (tests/memory_estimate_check.sh) holds it against the measured peak.
TrainingMemory estimate_training_memory(const GPTConfig& model, int64_t batch, int64_t eval_iters = 0,
                                        bool sharpness = false);

}  // namespace tapegrad
