// The built-in ops: every file of ops/ that records nodes ends with one sheet function, <family>_ops(), and is
// listed here by that function, one line each. A file that records nodes without a line here fails the test
// "every file of ops/ that records a node has its sheet listed" (tests/gradcheck_registration_test.cpp), as does an
// op recorded on a tape without a sheet.
#include "ops/all_ops.hpp"

// X(sheet function): one line per file of ops/, in the order `tapegrad gradcheck --list` shows them.
#define TAPEGRAD_OP_SHEETS(X) \
  X(arithmetic_ops)           /* ops/arithmetic.cpp */ \
  X(pointwise_ops)            /* ops/pointwise.cpp */ \
  X(reduce_ops)               /* ops/reduce.cpp */ \
  X(shape_ops)                /* ops/shape.cpp */ \
  X(matmul_ops)               /* ops/matmul.cpp */ \
  X(linear_ops)               /* ops/linear.cpp */ \
  X(softmax_ops)              /* ops/softmax.cpp */ \
  X(row_normalize_ops)        /* ops/row_normalize.cpp */ \
  X(layer_norm_ops)           /* ops/layer_norm.cpp */ \
  X(embedding_ops)            /* ops/embedding.cpp */ \
  X(cross_entropy_ops)        /* ops/cross_entropy.cpp */ \
  X(mse_loss_ops)             /* ops/mse_loss.cpp */ \
  X(attention_ops)            /* ops/attention/softmax.cpp */ \
  X(beta_attention_ops)       /* ops/attention/beta.cpp */ \
  X(linear_attention_ops)     /* ops/attention/linear.cpp */ \
  X(tiled_attention_ops)      /* ops/attention/tiled.cpp */ \
  X(heads_ops)                /* ops/heads.cpp */ \
  X(mlp_ops)                  /* ops/mlp.cpp */

namespace tapegrad {

#define TAPEGRAD_DECLARE_SHEET(sheet) std::vector<OpInfo> sheet();
TAPEGRAD_OP_SHEETS(TAPEGRAD_DECLARE_SHEET)
#undef TAPEGRAD_DECLARE_SHEET

std::vector<OpInfo> builtin_ops() {
  std::vector<OpInfo> all;
  auto take = [&all](std::vector<OpInfo> ops) {
    for (OpInfo& op : ops) all.push_back(std::move(op));
  };
#define TAPEGRAD_TAKE_SHEET(sheet) take(sheet());
  TAPEGRAD_OP_SHEETS(TAPEGRAD_TAKE_SHEET)
#undef TAPEGRAD_TAKE_SHEET
  return all;
}

}  // namespace tapegrad
