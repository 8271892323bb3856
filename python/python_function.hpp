// The seam between a Python op and the C++ gradchecker: a tapegrad Function that records one node whose forward,
// VJP, JVP and second-order rule call back into Python. gradcheck() and gradcheck_second_order()
// (engine/gradcheck/) then run on it unchanged, so a PyTorch op gets the CLI's checks, diagnoses and messages.
//
// The Python side is an object (tapegrad/_ops.py: a torch callable or numpy callables behind one interface) with
//   forward(xs, keep)           → (y, state)     xs float64 arrays; keep: the node is recorded, so keep what the
//                                                 rules need (the torch graph) in state
//   vjp(state, ȳ)               → [x̄ᵢ or None]   x̄ᵢ = J_iᵀ ȳ (None: zero)
//   jvp(state, [ẋᵢ or None])    → ẏ or None      ẏ = Σᵢ J_i ẋᵢ; None: the op has no JVP (NoJvp, a "no JVP" note)
//   vjp_tangent(state, ȳ, [ẋⱼ]) → [ẋ̄ᵢ] or str   ẋ̄ᵢ = Σⱼ ∂ⱼ(J_iᵀȳ)[ẋⱼ]; a str: why the op has no second
//                                                 order (its backward is not differentiable), which the checker
//                                                 reports as the reason its hvp rows are skipped
// A Python exception raised by any of them crosses the C++ code as pybind11::error_already_set (the tape and the
// checker hold everything by RAII and catch only tapegrad's own errors) and comes out as the same exception.
// The GIL is held throughout: every step of such a check calls Python.
#pragma once

#include <string>

#include <pybind11/pybind11.h>

#include "engine/functions.hpp"

namespace tapegrad::python {

namespace py = pybind11;

struct PythonOp {
  py::object impl;           // the object above
  std::string name;          // the node's name on the tape and in the report
  bool second_order = false; // record the node with its second-order rule (for gradcheck_second_order)
};

Function python_function(const PythonOp& op);

}  // namespace tapegrad::python
