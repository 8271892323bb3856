#include "python/numpy_tensor.hpp"

#include <cstring>
#include <memory>
#include <vector>

namespace tapegrad::python {

std::string shape_text(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t d = 0; d < a.ndim(); ++d) s += (d ? ", " : "") + std::to_string(a.shape(d));
  return s + ")";
}

Shape shape_of(const py::array& a, std::string_view op) {
  if (a.ndim() > Shape::kMaxRank)
    fail("{}: an array of shape {} has {} axes; tapegrad tensors have at most {}", op, shape_text(a), a.ndim(),
         Shape::kMaxRank);
  std::vector<int64_t> dims(a.shape(), a.shape() + a.ndim());
  return Shape(std::span<const int64_t>(dims));
}

Tensor view_of(const py::object& array, std::string_view op) {
  if (!py::isinstance<py::array>(array))
    fail("{}: expected a numpy array, got {}", op, std::string(py::str(py::type::of(array).attr("__name__"))));
  const auto a = py::reinterpret_borrow<py::array>(array);
  DType dtype;
  if (a.dtype().is(py::dtype::of<float>())) dtype = DType::f32;
  else if (a.dtype().is(py::dtype::of<double>())) dtype = DType::f64;
  else if (a.dtype().is(py::dtype::of<int32_t>())) dtype = DType::i32;
  else
    fail("{}: an array of dtype {} and shape {}; tapegrad takes float32, float64, or int32 (indices)", op,
         std::string(py::str(a.dtype())), shape_text(a));
  if (!(a.flags() & py::array::c_style))
    fail("{}: the array of shape {} is not C-contiguous (a transpose or a slice); pass np.ascontiguousarray(x)", op,
         shape_text(a));
  // The Tensor holds a reference to the array; the last Tensor to go releases it under the GIL.
  auto* held = new py::object(a);
  std::shared_ptr<void> owner(held, [](void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
  return Tensor(dtype, shape_of(a, op), const_cast<void*>(a.data()), std::move(owner));
}

py::array_t<double> float64_result(const py::object& value, const Shape& expected, std::string_view op,
                                   std::string_view what) {
  if (value.is_none()) fail("{}: the {} is None; expected an array of shape {}", op, what, expected.str());
  auto a = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(value);
  if (!a) fail("{}: the {} is not an array of numbers", op, what);
  if (!(shape_of(a, op) == expected))
    fail("{}: the {} has shape {}; expected {}", op, what, shape_text(a), expected.str());
  return a;
}

py::array copy_to_numpy(const Tensor& t) {
  std::vector<py::ssize_t> dims(t.shape().dims().begin(), t.shape().dims().end());
  py::array a;
  switch (t.dtype()) {
    case DType::f32: a = py::array_t<float>(dims); break;
    case DType::f64: a = py::array_t<double>(dims); break;
    case DType::i32: a = py::array_t<int32_t>(dims); break;
    default: fail("copy to numpy: a tensor of dtype {} has no numpy counterpart here", dtype_name(t.dtype()));
  }
  if (t.nbytes()) std::memcpy(a.mutable_data(), t.raw(), t.nbytes());
  return a;
}

}  // namespace tapegrad::python
