// The seam between a Python op and the C++ gradchecker: a tapegrad Function that records one node whose forward,
// VJP, JVP and second-order rule call back into Python. gradcheck() and gradcheck_second_order()
// (checker/) then run on it unchanged, so a PyTorch op gets the CLI's checks, diagnoses and messages.
//
// The Python side is an object (tapegrad/_ops.py: a torch callable or numpy callables behind one interface) with
//   forward(xs, keep)           → (y, state)     xs float64 arrays; keep: the node is recorded, so keep what the
//                                                 rules need (the torch graph) in state
//   vjp(state, ȳ)               → [x̄ᵢ or None]   x̄ᵢ = J_iᵀ ȳ (None: zero)
//   jvp(state, [ẋᵢ or None])    → ẏ, None or str ẏ = Σᵢ J_i ẋᵢ; None: the op has no JVP (NoJvp, a "no JVP" note);
//                                                 a str: why it cannot be had (as vjp_tangent's str)
//   vjp_tangent(state, ȳ, [ẋⱼ]) → [ẋ̄ᵢ] or str   ẋ̄ᵢ = Σⱼ ∂ⱼ(J_iᵀȳ)[ẋⱼ]; a str: why the op has no second
//                                                 order (its backward is not differentiable), which the checker
//                                                 reports as the reason its hvp rows are skipped
// and, optionally, the checker's full Jacobians in blocks (checker/gradcheck.hpp RuleBlocks), one call
// for what would be one call per row or per column:
//   vjp_rows(xs, yshape, wanted) → [[x̄ᵢ or None] for each j]  x̄ᵢ = J_iᵀ e_j for every unit ȳ = e_j of y, in
//                                  order, for each input i with wanted[i] (None, or left out, for the others)
//   unit_steps(xs, i, ε)        → (plus, minus)   f(x with x_i[k] moved by ±ε), row k for each k, y flattened
//   full_worth_its_cost(xs, yshape, wanted) → [bool]  optional: which wanted inputs to check in full under the
//                                  default limit (the others by projections; checker/gradcheck.hpp RuleBlocks)
// A Python exception raised by any of them crosses the C++ code as pybind11::error_already_set (the tape and the
// checker hold everything by RAII and catch only tapegrad's own errors) and comes out as the same exception.
// The GIL is held throughout: every step of such a check calls Python.
#pragma once

#include <memory>
#include <string>

#include <pybind11/pybind11.h>

#include "engine/functions.hpp"
#include "checker/gradcheck.hpp"

namespace tapegrad::python {

namespace py = pybind11;

struct PythonOp {
  py::object impl;            // the object above
  std::string name;           // the node's name on the tape and in the report
  bool second_order = false;  // record the node with its second-order rule (for gradcheck_second_order)
};

Function python_function(const PythonOp& op);
// The op's blocks, where its object has vjp_rows and unit_steps; else null.
std::unique_ptr<RuleBlocks> python_blocks(const PythonOp& op);

}  // namespace tapegrad::python
