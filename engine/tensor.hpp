// Tensors: dtype, shape and a pointer to contiguous row-major data.
//
// A Tensor is a view. It owns its memory only when made by Tensor::zeros/empty/from (a shared owner is
// kept); tensors made by a Tape point into the tape's arena and live until the tape is cleared.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "rng.hpp"

namespace tapegrad {

// Every misuse of the library throws this, with a message that names the op and the shapes.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

// f32 trains, f64 gradchecks, i32 holds token ids and class targets (never differentiable).
enum class DType : uint8_t { f32, f64, i32 };
std::string_view dtype_name(DType d);
size_t dtype_size(DType d);
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}

class Shape {
 public:
  static constexpr int kMaxRank = 6;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t& operator[](int i) { return dims_[static_cast<size_t>(i)]; }
  int64_t back() const { return dims_[static_cast<size_t>(rank_ - 1)]; }
  int64_t numel() const;
  // Product of all dimensions but the last: the number of rows when the last axis is a row.
  int64_t rows() const { return rank_ == 0 ? 1 : numel() / back(); }
  std::span<const int64_t> dims() const { return {dims_.data(), static_cast<size_t>(rank_)}; }
  void push_back(int64_t d);
  bool operator==(const Shape& o) const;
  std::string str() const;  // "(2, 3, 4)"

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

// Resolves a possibly negative axis against a rank; throws naming `op` if out of range.
int normalize_axis(std::string_view op, int axis, int rank);

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape, void* data, std::shared_ptr<void> owner = nullptr)
      : dtype_(dtype), shape_(shape), data_(data), owner_(std::move(owner)) {}

  // Owning tensors (64-byte aligned, zero-filled for zeros()).
  static Tensor empty(DType dtype, Shape shape);
  static Tensor zeros(DType dtype, Shape shape);
  static Tensor full(DType dtype, Shape shape, double value);  // every element `value`, in a float dtype
  template <class T>
  static Tensor from(Shape shape, std::span<const T> values);
  template <class T>
  static Tensor from(Shape shape, std::initializer_list<T> values) {
    return from<T>(shape, std::span<const T>(values.begin(), values.size()));
  }
  // Seeded random tensors: one draw per element in row-major order from engine/rng.hpp's generator, in double,
  // then rounded to the float dtype. The same seed gives the same values on every run: uniform draws are integer
  // arithmetic, normal ones Box–Muller through the C library's log1p and cos. A tensor from a seed starts a fresh
  // generator; one from an Rng continues it, so several tensors drawn from one Rng differ.
  //   randn    N(mean, std²)
  //   uniform  U[lo, hi)
  static Tensor randn(DType dtype, Shape shape, uint64_t seed, double mean = 0, double std = 1);
  static Tensor randn(DType dtype, Shape shape, Rng& rng, double mean = 0, double std = 1);
  static Tensor uniform(DType dtype, Shape shape, uint64_t seed, double lo = 0, double hi = 1);
  static Tensor uniform(DType dtype, Shape shape, Rng& rng, double lo = 0, double hi = 1);

  bool defined() const { return data_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  const void* raw() const { return data_; }
  void* raw() { return data_; }

  // A const Tensor is read-only: its data are const T*. Writing needs a non-const handle (a copy of a Tensor is
  // another handle to the same data, so a node's VJP that writes a saved tensor says so with a non-const one).
  template <class T>
  const T* data() const {
    check_dtype(dtype_of<T>());
    return static_cast<const T*>(data_);
  }
  template <class T>
  T* data() {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(data_);
  }
  // Element i of a float tensor, as double (for tests and reports, not for kernels).
  double item(int64_t i = 0) const;
  std::vector<double> to_vector() const;
  // The dtype, the shape and the values, nested as the shape is, numbers right-aligned to one width:
  //   Tensor float32 (2, 3)
  //   [[  1, 0.5,  -2],
  //    [  3,   4, 2.5]]
  // Beyond 1000 elements each axis longer than 6 shows its first 3 and last 3 entries around "...", as NumPy
  // does. operator<< and fmt ("{}") print the same.
  std::string str() const;

  // Same data, another shape of the same size (no copy).
  Tensor view(Shape shape) const;
  // A deep copy that owns its memory.
  Tensor clone() const;
  // A deep copy converted to another float dtype.
  Tensor to(DType dtype) const;
  void fill_zero();
  void copy_from(const Tensor& src);
  // this += src (same dtype and shape): how gradients accumulate.
  void accumulate(const Tensor& src);

 private:
  void check_dtype(DType asked) const {
    if (asked != dtype_) fail("tensor of dtype {} read as {}", dtype_name(dtype_), dtype_name(asked));
  }
  DType dtype_ = DType::f32;
  Shape shape_;
  void* data_ = nullptr;
  std::shared_ptr<void> owner_;
};

// Calls f(T{}) with T = float or double for a float dtype; throws naming `op` otherwise. The kernels' callers
// take T as a template lambda:  dispatch_float(op, x.dtype(), [&]<class T>(T) { kernel(x.data<T>(), ...); });
template <class F>
decltype(auto) dispatch_float(std::string_view op, DType dtype, F&& f) {
  if (dtype == DType::f32) return f(float{});
  if (dtype == DType::f64) return f(double{});
  fail("{}: expected a float32 or float64 tensor, got {}", op, dtype_name(dtype));
}

std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace tapegrad

template <>
struct fmt::formatter<tapegrad::Tensor> : fmt::formatter<std::string> {
  auto format(const tapegrad::Tensor& t, fmt::format_context& ctx) const {
    return fmt::formatter<std::string>::format(t.str(), ctx);
  }
};
template <>
struct fmt::formatter<tapegrad::Shape> : fmt::formatter<std::string> {
  auto format(const tapegrad::Shape& s, fmt::format_context& ctx) const {
    return fmt::formatter<std::string>::format(s.str(), ctx);
  }
};
template <>
struct fmt::formatter<tapegrad::DType> : fmt::formatter<std::string_view> {
  auto format(tapegrad::DType d, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(tapegrad::dtype_name(d), ctx);
  }
};
