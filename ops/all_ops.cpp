// The built-in ops, one registration function per file in ops/. A new op file adds its line here.
#include <mutex>

#include "engine/gradcheck/registry.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

void register_arithmetic(Registry&);
void register_pointwise(Registry&);
void register_reduce(Registry&);
void register_shape(Registry&);
void register_matmul(Registry&);
void register_linear(Registry&);
void register_softmax(Registry&);
void register_row_normalize(Registry&);
void register_layer_norm(Registry&);
void register_embedding(Registry&);
void register_cross_entropy(Registry&);
void register_mse_loss(Registry&);
void register_attention(Registry&);
void register_beta_attention(Registry&);
void register_linear_attention(Registry&);
void register_tiled_attention(Registry&);
void register_heads(Registry&);
void register_mlp(Registry&);

Registry& builtin_registry() {
  static Registry registry;
  static std::once_flag once;
  std::call_once(once, [] {
    register_arithmetic(registry);
    register_pointwise(registry);
    register_reduce(registry);
    register_shape(registry);
    register_matmul(registry);
    register_linear(registry);
    register_softmax(registry);
    register_row_normalize(registry);
    register_layer_norm(registry);
    register_embedding(registry);
    register_cross_entropy(registry);
    register_mse_loss(registry);
    register_attention(registry);
    register_beta_attention(registry);
    register_linear_attention(registry);
    register_tiled_attention(registry);
    register_heads(registry);
    register_mlp(registry);
  });
  return registry;
}

}  // namespace tapegrad
