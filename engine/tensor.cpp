#include "engine/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ostream>

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

namespace {

// Normal draws per parallel range: a draw (a logarithm and a cosine) is ~40 ns, so a range of
// this many is ~0.6 ms, well above the pool's cost of a range.
constexpr int64_t kDrawsPerRange = 1 << 14;

// A float tensor whose elements are draw(), in row-major order.
template <class Draw>
Tensor tensor_of_draws(const char* what, DType dtype, Shape shape, Draw draw) {
  if (dtype == DType::i32) fail("{}: expected dtype float32 or float64, got int32 (shape {})", what, shape);
  Tensor t = Tensor::empty(dtype, shape);
  dispatch_float(what, dtype, [&]<class T>(T) {
    T* p = t.data<T>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = static_cast<T>(draw());
  });
  return t;
}

}  // namespace

Tensor Tensor::full(DType dtype, Shape shape, double value) {
  return tensor_of_draws("full", dtype, shape, [&] { return value; });
}

Tensor Tensor::randn(DType dtype, Shape shape, Rng& rng, double mean, double std) {
  if (!(std >= 0) || !std::isfinite(std) || !std::isfinite(mean))
    fail("randn: expected a finite mean and a finite std ≥ 0, got mean {} and std {} (shape {})", mean, std, shape);
  if (dtype == DType::i32) fail("randn: expected dtype float32 or float64, got int32 (shape {})", shape);
  // Element i is rng.normal()'s i-th value: the draws 2i+1 and 2i+2 from here, made on the pool's threads (the
  // generator is a counter) and equal bit for bit to drawing them one by one.
  Tensor t = Tensor::empty(dtype, shape);
  const Rng at = rng;
  dispatch_float("randn", dtype, [&]<class T>(T) {
    T* p = t.data<T>();
    parallel_for(t.numel(), kDrawsPerRange, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const auto k = static_cast<uint64_t>(2 * i);
        const double u1 = Rng::unit(at.ahead(k + 1)), u2 = Rng::unit(at.ahead(k + 2));
        p[i] = static_cast<T>(mean + std * Rng::box_muller(u1, u2));
      }
    });
  });
  rng.skip(2 * static_cast<uint64_t>(t.numel()));
  return t;
}
Tensor Tensor::randn(DType dtype, Shape shape, uint64_t seed, double mean, double std) {
  Rng rng(seed);
  return randn(dtype, shape, rng, mean, std);
}

Tensor Tensor::uniform(DType dtype, Shape shape, Rng& rng, double lo, double hi) {
  if (!(lo <= hi) || !std::isfinite(lo) || !std::isfinite(hi))
    fail("uniform: expected finite bounds lo ≤ hi, got [{}, {}) (shape {})", lo, hi, shape);
  return tensor_of_draws("uniform", dtype, shape, [&] { return rng.uniform(lo, hi); });
}
Tensor Tensor::uniform(DType dtype, Shape shape, uint64_t seed, double lo, double hi) {
  Rng rng(seed);
  return uniform(dtype, shape, rng, lo, hi);
}

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

namespace {

// Prints nested brackets, one level per axis, as NumPy does: the last axis on one line, each outer axis a line
// (and a blank line between blocks of rank ≥ 3) per entry, shortened to the first and last kEdge entries.
class TensorPrinter {
 public:
  static constexpr int64_t kSummarizeAbove = 1000;  // elements
  static constexpr int64_t kEdge = 3;

  explicit TensorPrinter(const Tensor& t) : t_(t), summarize_(t.numel() > kSummarizeAbove) {
    const Shape& s = t.shape();
    int64_t stride = 1;
    for (int d = s.rank() - 1; d >= 0; --d) {
      stride_[static_cast<size_t>(d)] = stride;
      stride *= s[d];
    }
  }

  std::string print() {
    std::string measure;
    block(measure, 0, 0);  // the first pass finds the widest number
    std::string out;
    block(out, 0, 0);
    return out;
  }

 private:
  std::string number(int64_t i) const {
    if (t_.dtype() == DType::i32) return fmt::format("{}", t_.data<int32_t>()[i]);
    return fmt::format("{:.6g}", t_.item(i));
  }

  // The entries of axis d shown: all, or the first and last kEdge with a gap (−1) between.
  std::vector<int64_t> shown(int d) const {
    const int64_t n = t_.shape()[d];
    std::vector<int64_t> idx;
    if (summarize_ && n > 2 * kEdge) {
      for (int64_t i = 0; i < kEdge; ++i) idx.push_back(i);
      idx.push_back(-1);
      for (int64_t i = n - kEdge; i < n; ++i) idx.push_back(i);
    } else {
      for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    }
    return idx;
  }

  void block(std::string& out, int d, int64_t offset) {
    const int rank = t_.rank();
    if (rank == 0) {
      cell(out, 0);
      return;
    }
    out += '[';
    const std::vector<int64_t> idx = shown(d);
    for (size_t k = 0; k < idx.size(); ++k) {
      if (k > 0) {
        out += ',';
        if (d == rank - 1) {
          out += ' ';
        } else {
          out.append(static_cast<size_t>(rank - d - 1), '\n');
          out.append(static_cast<size_t>(d + 1), ' ');
        }
      }
      if (idx[k] < 0) {
        out += "...";
        continue;
      }
      const int64_t at = offset + idx[k] * stride_[static_cast<size_t>(d)];
      if (d == rank - 1) cell(out, at);
      else block(out, d + 1, at);
    }
    out += ']';
  }

  void cell(std::string& out, int64_t i) {
    const std::string s = number(i);
    width_ = std::max(width_, s.size());
    out.append(width_ - s.size(), ' ');
    out += s;
  }

  const Tensor& t_;
  bool summarize_;
  std::array<int64_t, Shape::kMaxRank> stride_{};
  size_t width_ = 0;
};

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "Tensor (undefined)";
  std::string head = fmt::format("Tensor {} {}", dtype_, shape_);
  return head + (rank() == 0 ? " " : "\n") + TensorPrinter(*this).print();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

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
// per range of 16 KiB pieces, so from 128 KiB up. The default model's gradient buffers are mostly 384 KiB (B·T·C
// floats); split at 64 KiB pieces (from 512 KiB) they stayed whole and took 0.80-0.84 ms a step on 2 threads
// against 0.55-0.68 on 1; split at 16 KiB, 0.41-0.44 ms (AMD EPYC Zen 4, three alternating runs each).
void Tensor::fill_zero() {
  const size_t bytes = nbytes();
  if (bytes == 0) return;
  constexpr size_t kPiece = size_t{16} << 10;
  auto* p = static_cast<std::byte*>(data_);
  parallel_for(static_cast<int64_t>((bytes + kPiece - 1) / kPiece), 4, [=](int64_t begin, int64_t end) {
    const size_t from = static_cast<size_t>(begin) * kPiece, to = std::min(bytes, static_cast<size_t>(end) * kPiece);
    std::memset(p + from, 0, to - from);
  });
}

void Tensor::copy_from(const Tensor& src) {
  if (src.dtype_ != dtype_ || !(src.shape_ == shape_))
    fail("copy: source {} {} does not match destination {} {}", src.dtype_, src.shape_, dtype_, shape_);
  if (numel()) std::memcpy(data_, src.data_, nbytes());
}

void Tensor::accumulate(const Tensor& src) {
  if (src.dtype_ != dtype_ || !(src.shape_ == shape_))
    fail("accumulate: {} {} cannot be added into {} {}", src.dtype_, src.shape_, dtype_, shape_);
  dispatch_float("accumulate", dtype_, [&]<class T>(T) {
    T* d = data<T>();
    const T* s = src.data<T>();
    for (int64_t i = 0, n = numel(); i < n; ++i) d[i] += s[i];
  });
}

}  // namespace tapegrad
