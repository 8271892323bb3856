// The built-in ops' sheets (ops/sheet.hpp), every family's in one list: ops/all_ops.cpp.
#pragma once

#include <vector>

#include "sheet.hpp"

namespace tapegrad {

// Every built-in op's sheet, family by family in the order of ops/all_ops.cpp. builtin_registry() (ops/ops.hpp)
// is the registry filled from them.
std::vector<OpInfo> builtin_ops();

}  // namespace tapegrad
