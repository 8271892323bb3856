#include "engine/tensor.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "engine/parallel.hpp"

namespace tapegrad {

std::string_view dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::i32: return "int32";
  }
  return "?";
}

size_t dtype_size(DType d) { return d == DType::f64 ? 8 : 4; }

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  for (int64_t d : dims) push_back(d);
}

void Shape::push_back(int64_t d) {
  if (rank_ == kMaxRank) fail("shape: rank above {} is not supported", kMaxRank);
  if (d < 0) fail("shape: negative dimension {} in {}", d, str());
  dims_[static_cast<size_t>(rank_++)] = d;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if ((*this)[i] != o[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "(";
  for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string((*this)[i]);
  return s + ")";
}

int normalize_axis(std::string_view op, int axis, int rank) {
  int a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank) fail("{}: axis {} is out of range for a tensor of rank {}", op, axis, rank);
  return a;
}

Tensor Tensor::empty(DType dtype, Shape shape) {
  size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) fail("out of memory allocating a tensor of shape {}", shape);
  return Tensor(dtype, shape, p, std::shared_ptr<void>(p, std::free));
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t = empty(dtype, shape);
  t.fill_zero();
  return t;
}

template <class T>
Tensor Tensor::from(Shape shape, std::span<const T> values) {
  if (static_cast<int64_t>(values.size()) != shape.numel())
    fail("Tensor::from: {} values given for shape {} ({} elements)", values.size(), shape, shape.numel());
  Tensor t = empty(dtype_of<T>(), shape);
  if (!values.empty()) std::memcpy(t.raw(), values.data(), values.size_bytes());
  return t;
}
template Tensor Tensor::from<float>(Shape, std::span<const float>);
template Tensor Tensor::from<double>(Shape, std::span<const double>);
template Tensor Tensor::from<int32_t>(Shape, std::span<const int32_t>);

double Tensor::item(int64_t i) const {
  if (i < 0 || i >= numel()) fail("item: index {} out of range for shape {}", i, shape_);
  switch (dtype_) {
    case DType::f32: return static_cast<const float*>(data_)[i];
    case DType::f64: return static_cast<const double*>(data_)[i];
    case DType::i32: return static_cast<const int32_t*>(data_)[i];
  }
  return 0;
}

std::vector<double> Tensor::to_vector() const {
  std::vector<double> v(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) v[static_cast<size_t>(i)] = item(i);
  return v;
}

Tensor Tensor::view(Shape shape) const {
  if (shape.numel() != numel()) fail("view: cannot view shape {} as {}", shape_, shape);
  return Tensor(dtype_, shape, data_, owner_);
}

Tensor Tensor::clone() const {
  Tensor t = empty(dtype_, shape_);
  if (numel()) std::memcpy(t.raw(), data_, nbytes());
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return clone();
  Tensor t = empty(dtype, shape_);
  for (int64_t i = 0; i < numel(); ++i) {
    double v = item(i);
    switch (dtype) {
      case DType::f32: static_cast<float*>(t.raw())[i] = static_cast<float>(v); break;
      case DType::f64: static_cast<double*>(t.raw())[i] = v; break;
      case DType::i32: static_cast<int32_t*>(t.raw())[i] = static_cast<int32_t>(v); break;
    }
  }
  return t;
}

// Large fills (the tape zeroes every gradient it allocates) are split across the engine's threads: one memset
// per range of 64 KiB pages.
void Tensor::fill_zero() const {
  const size_t bytes = nbytes();
  if (bytes == 0) return;
  constexpr size_t kPiece = size_t{64} << 10;
  auto* p = static_cast<std::byte*>(data_);
  parallel_for(static_cast<int64_t>((bytes + kPiece - 1) / kPiece), 4, [=](int64_t begin, int64_t end) {
    const size_t from = static_cast<size_t>(begin) * kPiece, to = std::min(bytes, static_cast<size_t>(end) * kPiece);
    std::memset(p + from, 0, to - from);
  });
}

void Tensor::copy_from(const Tensor& src) const {
  if (src.dtype_ != dtype_ || !(src.shape_ == shape_))
    fail("copy: source {} {} does not match destination {} {}", src.dtype_, src.shape_, dtype_, shape_);
  if (numel()) std::memcpy(data_, src.data_, nbytes());
}

void Tensor::accumulate(const Tensor& src) const {
  if (src.dtype_ != dtype_ || !(src.shape_ == shape_))
    fail("accumulate: {} {} cannot be added into {} {}", src.dtype_, src.shape_, dtype_, shape_);
  dispatch_float("accumulate", dtype_, [&]<class T>(T) {
    T* d = data<T>();
    const T* s = src.data<T>();
    for (int64_t i = 0, n = numel(); i < n; ++i) d[i] += s[i];
  });
}

}  // namespace tapegrad
