// The engine from Python: a Tape, its values (Var), the built-in ops by name on numpy arrays, backward, grad, jvp,
// hvp, and explain. Pure C++ work (an op's forward, backward, forward mode, hvp) runs with the GIL released.
#pragma once

#include <pybind11/pybind11.h>

namespace tapegrad::python {

void bind_engine(pybind11::module_& m);

}  // namespace tapegrad::python
