// tapegrad in one include: #include <tapegrad/tapegrad.hpp> (installed under include/tapegrad/, and in a build
// of these sources under <build>/include/tapegrad/). Every public header of engine/, ops/, inspect/, checker/ and
// models/ is listed here but a test framework's (checker/doctest.hpp); the test public_headers fails when one is
// missing. The headers include each other by paths relative to themselves, so they resolve the same in the source
// tree and in an installed tree, and never through a folder of the including project (a user's own ops/ or engine/
// cannot shadow them).
#pragma once

// engine/: the core: tensors, the arena, the tape (reverse, forward and second-order mode), scratch, the thread pool
#include "engine/arena.hpp"
#include "engine/functions.hpp"
#include "engine/no_jvp.hpp"
#include "engine/parallel.hpp"
#include "engine/rng.hpp"
#include "engine/scratch.hpp"
#include "engine/source_place.hpp"
#include "engine/tape.hpp"
#include "engine/tape_observer.hpp"
#include "engine/tensor.hpp"

// ops/: every op (ops.hpp), pointwise() for element-wise ops of one's own, the sheets and their registry, the kernels
// and checks the ops share, and the matrix products (ops/products/)
#include "ops/all_ops.hpp"
#include "ops/attention/attention.hpp"
#include "ops/attention/kernels.hpp"
#include "ops/common.hpp"
#include "ops/fast_math.hpp"
#include "ops/float_pack.hpp"
#include "ops/gelu.hpp"
#include "ops/ops.hpp"
#include "ops/pointwise.hpp"
#include "ops/products/blas.hpp"
#include "ops/products/blas_info.hpp"
#include "ops/products/onednn_gemm.hpp"
#include "ops/products/products.hpp"
#include "ops/products/small_products.hpp"
#include "ops/registry.hpp"
#include "ops/row_maps.hpp"
#include "ops/sheet.hpp"

// inspect/: what watches or draws a tape: the profile, anomaly detection, the allocation log, scope names, the drawing;
// and the memory the process may use
#include "inspect/allocation_log.hpp"
#include "inspect/anomaly.hpp"
#include "inspect/graphviz.hpp"
#include "inspect/heat_map.hpp"
#include "inspect/process_memory.hpp"
#include "inspect/profile.hpp"
#include "inspect/scope_names.hpp"
#include "inspect/tape_dot.hpp"

// checker/: the gradchecker and its diagnoses, claims, the formula language and the edit search, explain
#include "checker/claimed.hpp"
#include "checker/cli.hpp"
#include "checker/edges.hpp"
#include "checker/edges_probe.hpp"
#include "checker/explain.hpp"
#include "checker/finding.hpp"
#include "checker/finding_sheet.hpp"
#include "checker/formulas/claim.hpp"
#include "checker/formulas/derivative_edits.hpp"
#include "checker/formulas/edits.hpp"
#include "checker/formulas/exercise.hpp"
#include "checker/formulas/expression.hpp"
#include "checker/formulas/expression_tree.hpp"
#include "checker/gradcheck.hpp"
#include "checker/jacobian.hpp"
#include "checker/precision.hpp"
#include "checker/second_order.hpp"
#include "checker/testing.hpp"
#include "checker/trace.hpp"

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
