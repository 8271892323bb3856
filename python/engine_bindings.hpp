// The engine from Python: a Tape, its values (Var), the built-in ops by name on numpy arrays, backward, grad, jvp,
// hvp, and explain. Pure C++ work (an op's forward, backward, forward mode, hvp) runs with the GIL released.
#pragma once

#include <new>
#include <string>

#include <pybind11/pybind11.h>

namespace tapegrad::python {

void bind_engine(pybind11::module_& m);

// An op that could not allocate its result or its work: a MemoryError in Python (module.cpp's translator) whose
// message names the op and its inputs' shapes, where std::bad_alloc says only "std::bad_alloc".
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

}  // namespace tapegrad::python
