// The built-in ops' sheets (ops/sheet.hpp), every family's in one list. No one writes that list: the build generates
// builtin_ops() from the files of ops/ (cmake/generate_sheet_list.cmake), calling every function
// `std::vector<OpSheet> NAME()` that a file defines at the start of a line within namespace tapegrad.
#pragma once

#include <vector>

#include "sheet.hpp"

namespace tapegrad {

// Every built-in op's sheet, file by file in the order of their paths under ops/ (arithmetic.cpp,
// attention/beta.cpp, ...). builtin_registry() (ops/ops.hpp) is the registry filled from them.
std::vector<OpSheet> builtin_ops();

}  // namespace tapegrad
