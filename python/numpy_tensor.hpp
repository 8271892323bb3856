// numpy arrays and tapegrad tensors across the boundary. Every function here is called with the GIL held.
//   view     a C-contiguous float32/float64/int32 array as a Tensor over the same memory (no copy); the Tensor keeps the
//            array alive, and lets it go under the GIL whichever thread drops the last reference
//   copy     a Tensor into a new numpy array of its dtype (the tape's memory does not outlive a clear())
// Shapes, dtypes and layouts that do not fit become a tapegrad::Error naming the op and the shape.
#pragma once

#include <string_view>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "engine/tensor.hpp"

namespace tapegrad::python {

namespace py = pybind11;

// "(2, 3)": a numpy array's shape as Shape::str() prints it.
std::string shape_text(const py::array& a);
// The array's shape as a Shape; throws naming `op` beyond Shape::kMaxRank.
Shape shape_of(const py::array& a, std::string_view op);

// The array as a Tensor over its memory. It must be float32, float64 or int32 (indices) and C-contiguous (a
// transposed or sliced array is refused, naming `op`, rather than copied behind the caller's back).
Tensor view_of(const py::object& array, std::string_view op);
// Any array-like of numbers as a float64 array, copied only where its dtype or layout asks for it; its shape must
// be `expected` (the callback's result for a value of that shape).
py::array_t<double> float64_result(const py::object& value, const Shape& expected, std::string_view op,
                                   std::string_view what);
// A copy of t in a new array (float32, float64 or int32).
py::array copy_to_numpy(const Tensor& t);

}  // namespace tapegrad::python
