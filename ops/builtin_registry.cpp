// builtin_registry() (declared in ops/ops.hpp): the registry of the tooling (ops/registry.hpp) filled
// from the ops' sheets (ops/all_ops.hpp). It sits here, on the floor above the ops, because it joins the two: the
// ops themselves include nothing of the tooling.
#include <mutex>

#include "ops/registry.hpp"
#include "ops/all_ops.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

Registry& builtin_registry() {
  static Registry registry;
  static std::once_flag once;
  std::call_once(once, [] { registry.add(builtin_ops()); });
  return registry;
}

}  // namespace tapegrad
