// The memory a training run of the GPT needs, estimated from its configuration before anything is allocated, and
// the memory this process may use: tapegrad train prints the one and refuses a run whose estimate exceeds the other.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "gpt.hpp"

namespace tapegrad {

struct ClaimText;  // checker/formulas/claim.hpp

struct TrainingMemory {
  double parameters = 0;       // the count
  double parameter_bytes = 0;  // values and gradients, float32
  double optimizer_bytes = 0;  // AdamW's two moments
  double tape_bytes = 0;       // one training step's tape: what forward keeps for backward, and backward's buffers
  double eval_bytes = 0;       // the fixed evaluation batches: token ids and targets of eval_iters batches per split
  double total() const { return parameter_bytes + optimizer_bytes + tape_bytes + eval_bytes; }
};

// From the shapes alone (in double: a configuration of 10⁵ layers is estimated, not overflowed). The tape's share
// counts, per block, the float32 tensors the nodes keep for backward at batch × context rows (layer norms, c_attn,
// the heads, the attention map or its O(T) state, the MLP's two hidden tensors, the projections and residuals,
// dropout masks), then the embeddings, the final norm and the logits, and room for the largest gradients backward
// holds at once. tests/training_memory_test.cpp holds it against the measured peak.
TrainingMemory estimate_training_memory(const GPTConfig& model, int64_t batch, int64_t eval_iters = 0);

// Bytes this process may still take: MemAvailable of /proc/meminfo, or the cgroup's memory.max less its
// memory.current where that is smaller; nothing where neither can be read. TAPEGRAD_MEMORY_LIMIT in the environment
// (bytes, or a number with K, M or G: binary units) caps it further, for a machine shared with other work; a value
// that is not such a size throws an Error naming the variable.
std::optional<double> memory_available();

// Refuses, in one line, work that needs more memory than memory_available(): "WHAT needs about 8.8 GiB of memory,
// more than the 6.1 GiB available; ADVICE". Every command calls it with its estimate before it allocates.
void require_memory(double bytes, std::string_view what, std::string_view advice);
// Refuses a claim (checker/formulas/claim.hpp) whose check would need more memory than memory_available(), from its
// inputs' shapes, before anything of that size is allocated: `tapegrad claim` and tapegrad.claim in Python.
void require_claim_memory(const ClaimText& claim);
// For a command's header: "about 812.3 MiB estimated, 20.1 GiB available" ("available unknown" where it is).
std::string memory_outlook(double bytes);

// The process's resident memory now (VmRSS) and at its peak so far (VmHWM), from /proc/self/status; 0 if unknown.
double resident_bytes();
double peak_resident_bytes();

// "812 bytes", "3.2 KiB", "812.3 MiB", "5.8 GiB"
std::string bytes_text(double bytes);

}  // namespace tapegrad
