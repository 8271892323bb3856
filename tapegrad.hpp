// tapegrad in one include: #include <tapegrad/tapegrad.hpp> (installed under include/tapegrad/, and in a build
// of these sources under <build>/include/tapegrad/). Every public header of engine/, ops/ and models/ is listed
// here; the test public_headers fails when one is missing. The headers include each other by paths relative to
// themselves, so they resolve the same in the source tree and in an installed tree, and never through a folder of
// the including project (a user's own ops/ or engine/ cannot shadow them).
#pragma once

// engine/: tensors, the tape, forward and reverse mode, the products, the registry and the gradchecker
#include "engine/allocation_log.hpp"
#include "engine/anomaly.hpp"
#include "engine/arena.hpp"
#include "engine/blas.hpp"
#include "engine/blas_info.hpp"
#include "engine/functions.hpp"
#include "engine/gradcheck/cli.hpp"
#include "engine/gradcheck/explain.hpp"
#include "engine/gradcheck/gradcheck.hpp"
#include "engine/gradcheck/jacobian.hpp"
#include "engine/gradcheck/precision.hpp"
#include "engine/gradcheck/registry.hpp"
#include "engine/gradcheck/second_order.hpp"
#include "engine/graphviz.hpp"
#include "engine/no_jvp.hpp"
#include "engine/onednn_gemm.hpp"
#include "engine/op_sheet.hpp"
#include "engine/parallel.hpp"
#include "engine/products.hpp"
#include "engine/profile.hpp"
#include "engine/rng.hpp"
#include "engine/scratch.hpp"
#include "engine/scope_names.hpp"
#include "engine/source_place.hpp"
#include "engine/tape.hpp"
#include "engine/tape_dot.hpp"
#include "engine/tape_observer.hpp"
#include "engine/tensor.hpp"

// ops/: every op (ops.hpp), pointwise() for element-wise ops of one's own, the kernels and checks the ops share, and
// in ops/formulas/ the formula language, claims and the edit search, which build ops
#include "ops/all_ops.hpp"
#include "ops/attention/attention.hpp"
#include "ops/attention/kernels.hpp"
#include "ops/common.hpp"
#include "ops/fast_math.hpp"
#include "ops/formulas/claim.hpp"
#include "ops/formulas/edits.hpp"
#include "ops/formulas/expression.hpp"
#include "ops/formulas/expression_tree.hpp"
#include "ops/gelu.hpp"
#include "ops/ops.hpp"
#include "ops/pointwise.hpp"
#include "ops/row_maps.hpp"

// models/: modules and layers, optimizers, the training loop, the GPT, data, checkpoints
#include "models/attention_kinds.hpp"
#include "models/checkpoint.hpp"
#include "models/data.hpp"
#include "models/files.hpp"
#include "models/gpt.hpp"
#include "models/layers.hpp"
#include "models/loop.hpp"
#include "models/module.hpp"
#include "models/optim.hpp"
#include "models/plot.hpp"
#include "models/run_memory.hpp"
#include "models/sharpness.hpp"
#include "models/stats.hpp"
#include "models/trainer.hpp"
