// Shape ops: reshape, permute (transpose is a permute), slice, concat.
//
// Each moves elements without changing them: y = P·x for a 0/1 matrix P with at most one 1 per row. So each is
// linear, its JVP is the same move applied to ẋ (ẏ = P·ẋ), and its VJP is the move backwards, added into x̄
// (x̄ += Pᵀ·ȳ). Elements of x that y does not read (outside a slice) get no gradient.
//
// The forward copies work for every dtype (int32 ids can be reshaped, sliced, joined); the derivatives exist
// for float32 and float64 only, as elsewhere.
#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include <fmt/ranges.h>

#include "ops/sheet.hpp"
#include "ops/common.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

// Calls f(T{}) with the element type of any dtype (the forward copies only move elements).
template <class F>
void dispatch_any(const char* op, DType dtype, F&& f) {
  if (dtype == DType::i32) return f(int32_t{});
  dispatch_float(op, dtype, f);
}

// The axis in [0, rank); an axis outside [−rank, rank) throws naming the op and the shape.
int resolve_axis(const char* op, int axis, const Shape& s) {
  const int r = s.rank();
  if (axis < -r || axis >= r)
    fail("{}: axis {} is out of range for x of shape {} (valid axes: {}..{})", op, axis, s, -r, r - 1);
  return normalize_axis(op, axis, r);
}

// x read as (outer, n, inner) around an axis: outer = Π of the sizes before it, inner = Π of those after.
void split_around(const Shape& s, int axis, int64_t& outer, int64_t& inner) {
  outer = 1;
  inner = 1;
  for (int d = 0; d < axis; ++d) outer *= s[d];
  for (int d = axis + 1; d < s.rank(); ++d) inner *= s[d];
}

// dst[k] += src[k], k < n
template <class T>
void add_into(T* dst, const T* src, int64_t n) {
  for (int64_t k = 0; k < n; ++k) dst[k] += src[k];
}

// ---------------------------------------------------------------------------------------------------------
// reshape: y[l] = x[l] for every row-major flat index l; y shares x's memory (values are never written).
//   VJP  x̄[l] += ȳ[l]        JVP  ẏ[l] = ẋ[l]
template <class T>
void reshape_vjp(const T* gy, T* gx, int64_t n) {
  add_into(gx, gy, n);
}
template <class T>
void reshape_jvp(const T* tx, T* ty, int64_t n) {
  add_into(ty, tx, n);
}

// ---------------------------------------------------------------------------------------------------------
// permute: y.shape[d] = x.shape[p[d]] and y[i_0, …, i_{r−1}] = x[j] with j_{p[d]} = i_d, i.e. y's axis d walks x
// with x's stride of axis p[d]. So y[o] = x[off(o)] with off(o) = Σ_d i_d·stride_x[p[d]]:
//   VJP  x̄[off(o)] += ȳ[o]    (off is a bijection: the inverse permutation)
//   JVP  ẏ[o] = ẋ[off(o)]
//
// The walk over y in row-major order, with per axis the stride of x along it. Size-1 axes are dropped, and
// an axis that continues the previous one in x too (stride_prev = stride·size) is merged into it, so that an
// identity permutation is one run and (B, T, h, d) → (B, h, T, d) walks runs of d.
struct PermuteWalk {
  int rank = 0;
  std::array<int64_t, Shape::kMaxRank> size{}, x_stride{};
};

PermuteWalk permute_walk(const Shape& xs, std::span<const int> perm) {
  std::array<int64_t, Shape::kMaxRank> stride{};
  int64_t s = 1;
  for (int d = xs.rank() - 1; d >= 0; --d) {
    stride[static_cast<size_t>(d)] = s;
    s *= xs[d];
  }
  PermuteWalk w;
  for (int p : perm) {
    const int64_t n = xs[p], st = stride[static_cast<size_t>(p)];
    if (n == 1) continue;
    auto last = static_cast<size_t>(w.rank - 1);
    if (w.rank > 0 && w.x_stride[last] == st * n) {
      w.size[last] *= n;
      w.x_stride[last] = st;
      continue;
    }
    w.size[static_cast<size_t>(w.rank)] = n;
    w.x_stride[static_cast<size_t>(w.rank)] = st;
    ++w.rank;
  }
  if (w.rank == 0) {  // a single element
    w.size[0] = 1;
    w.x_stride[0] = 1;
    w.rank = 1;
  }
  return w;
}

// Calls run(o, i, len, stride) for each run of y along the walk's last axis: y[o + k] ↔ x[i + k·stride], k < len.
// The kernels take unit-stride runs (the last axis kept in place) as contiguous copies and adds.
template <class F>
void for_each_run(const PermuteWalk& w, F&& run) {
  const auto last = static_cast<size_t>(w.rank - 1);
  const int64_t len = w.size[last], stride = w.x_stride[last];
  int64_t runs = 1;
  for (size_t d = 0; d < last; ++d) runs *= w.size[d];
  if (len == 0 || runs == 0) return;
  std::array<int64_t, Shape::kMaxRank> idx{};
  int64_t i = 0;
  for (int64_t q = 0, o = 0; q < runs; ++q, o += len) {
    run(o, i, len, stride);
    for (size_t d = last; d-- > 0;) {  // advance the outer multi-index
      i += w.x_stride[d];
      if (++idx[d] < w.size[d]) break;
      i -= w.x_stride[d] * w.size[d];
      idx[d] = 0;
    }
  }
}

// y[o] = x[off(o)]
template <class T>
void permute_forward(const PermuteWalk& w, const T* x, T* y) {
  for_each_run(w, [&](int64_t o, int64_t i, int64_t len, int64_t stride) {
    if (stride == 1) {
      std::copy_n(x + i, len, y + o);
      return;
    }
    for (int64_t k = 0; k < len; ++k) y[o + k] = x[i + k * stride];
  });
}
// x̄[off(o)] += ȳ[o]
template <class T>
void permute_vjp(const PermuteWalk& w, const T* gy, T* gx) {
  for_each_run(w, [&](int64_t o, int64_t i, int64_t len, int64_t stride) {
    if (stride == 1) return add_into(gx + i, gy + o, len);
    for (int64_t k = 0; k < len; ++k) gx[i + k * stride] += gy[o + k];
  });
}
// ẏ[o] += ẋ[off(o)]
template <class T>
void permute_jvp(const PermuteWalk& w, const T* tx, T* ty) {
  for_each_run(w, [&](int64_t o, int64_t i, int64_t len, int64_t stride) {
    if (stride == 1) return add_into(ty + o, tx + i, len);
    for (int64_t k = 0; k < len; ++k) ty[o + k] += tx[i + k * stride];
  });
}

// ---------------------------------------------------------------------------------------------------------
// slice: x read as (outer, n, inner), y as (outer, m, inner) with m = stop − start:
//   y[o, j, i] = x[o, start + j, i]
//   VJP  x̄[o, start + j, i] += ȳ[o, j, i]      JVP  ẏ[o, j, i] = ẋ[o, start + j, i]
// For each o the m·inner elements are contiguous in both, so each kernel moves `outer` blocks.
struct SliceGeometry {
  int64_t outer, n, inner, start, m;
  int64_t block() const { return m * inner; }
  int64_t x_offset(int64_t o) const { return (o * n + start) * inner; }
};

void slice_forward(const SliceGeometry& s, const std::byte* x, std::byte* y, size_t elem) {
  const auto block_bytes = static_cast<size_t>(s.block()) * elem;
  if (block_bytes == 0) return;
  for (int64_t o = 0; o < s.outer; ++o)
    std::memcpy(y + static_cast<size_t>(o * s.block()) * elem, x + static_cast<size_t>(s.x_offset(o)) * elem,
                block_bytes);
}
template <class T>
void slice_vjp(const SliceGeometry& s, const T* gy, T* gx) {
  for (int64_t o = 0; o < s.outer; ++o) add_into(gx + s.x_offset(o), gy + o * s.block(), s.block());
}
template <class T>
void slice_jvp(const SliceGeometry& s, const T* tx, T* ty) {
  for (int64_t o = 0; o < s.outer; ++o) add_into(ty + o * s.block(), tx + s.x_offset(o), s.block());
}

// ---------------------------------------------------------------------------------------------------------
// concat along an axis: x_k read as (outer, n_k, inner), y as (outer, N, inner) with N = Σ_k n_k and
// off_k = Σ_{l<k} n_l:
//   y[o, off_k + j, i] = x_k[o, j, i]
//   VJP  x̄_k[o, j, i] += ȳ[o, off_k + j, i]      JVP  ẏ[o, off_k + j, i] = ẋ_k[o, j, i]
// For each (o, k) the n_k·inner elements are contiguous in both.
struct ConcatGeometry {
  int64_t outer, total, inner;  // total = N
  const int64_t* sizes;         // n_k, in the tape's arena
  size_t count;
};

void concat_forward(const ConcatGeometry& c, std::span<const Var> xs, std::byte* y, size_t elem) {
  int64_t off = 0;
  for (size_t k = 0; k < c.count; ++k) {
    const int64_t block = c.sizes[k] * c.inner;
    const auto* x = static_cast<const std::byte*>(xs[k].value().raw());
    if (block > 0)
      for (int64_t o = 0; o < c.outer; ++o)
        std::memcpy(y + static_cast<size_t>((o * c.total + off) * c.inner) * elem,
                    x + static_cast<size_t>(o * block) * elem, static_cast<size_t>(block) * elem);
    off += c.sizes[k];
  }
}
template <class T>
void concat_vjp(const ConcatGeometry& c, const T* gy, std::span<Tensor> gin) {
  int64_t off = 0;
  for (size_t k = 0; k < c.count; ++k) {
    const int64_t block = c.sizes[k] * c.inner;
    if (gin[k].defined()) {
      T* gx = gin[k].data<T>();
      for (int64_t o = 0; o < c.outer; ++o) add_into(gx + o * block, gy + (o * c.total + off) * c.inner, block);
    }
    off += c.sizes[k];
  }
}
template <class T>
void concat_jvp(const ConcatGeometry& c, std::span<const Tensor> tin, T* ty) {
  int64_t off = 0;
  for (size_t k = 0; k < c.count; ++k) {
    const int64_t block = c.sizes[k] * c.inner;
    if (tin[k].defined()) {
      const T* tx = tin[k].data<T>();
      for (int64_t o = 0; o < c.outer; ++o) add_into(ty + (o * c.total + off) * c.inner, tx + o * block, block);
    }
    off += c.sizes[k];
  }
}

}  // namespace

Var reshape(Var x, Shape shape) {
  (void)tape_of("reshape", {x});
  if (shape.numel() != x.shape().numel())
    fail("reshape: cannot reshape x of shape {} ({} elements) to {} ({} elements)", x.shape(), x.shape().numel(), shape,
         shape.numel());
  Tape& tape = x.tape();
  const int64_t n = x.shape().numel();
  return tape.record(
      "reshape", {x}, x.value().view(shape),
      [=](const Tensor& g, std::span<Tensor> gin) {
        if (!gin[0].defined()) return;
        dispatch_float("reshape", g.dtype(), [&]<class T>(T) { reshape_vjp(g.data<T>(), gin[0].data<T>(), n); });
      },
      [=](std::span<const Tensor> tin, Tensor& ty) {
        if (!tin[0].defined()) return;
        dispatch_float("reshape", ty.dtype(), [&]<class T>(T) { reshape_jvp(tin[0].data<T>(), ty.data<T>(), n); });
      },
      Tape::linear_in_inputs);
}

Var permute(Var x, std::span<const int> perm) {
  (void)tape_of("permute", {x});
  const Shape& xs = x.shape();
  const int r = xs.rank();
  std::array<int, Shape::kMaxRank> p{};
  bool valid = static_cast<int>(perm.size()) == r;
  unsigned seen = 0;
  for (size_t d = 0; valid && d < perm.size(); ++d) {
    const int a = perm[d] < 0 ? perm[d] + r : perm[d];
    valid = a >= 0 && a < r && !(seen & (1u << a));
    if (valid) seen |= 1u << a;
    p[d] = a;
  }
  if (!valid) fail("permute: ({}) is not a permutation of the {} axes of x of shape {}", fmt::join(perm, ", "), r, xs);
  const std::span<const int> axes(p.data(), static_cast<size_t>(r));
  Shape out;
  for (int a : axes) out.push_back(xs[a]);
  const PermuteWalk w = permute_walk(xs, axes);
  Tape& tape = x.tape();
  const Tensor xv = x.value();
  Tensor y = tape.empty(x.dtype(), out);
  dispatch_any("permute", x.dtype(), [&]<class T>(T) { permute_forward(w, xv.data<T>(), y.data<T>()); });
  return tape.record(
      "permute", {x}, y,
      [=](const Tensor& g, std::span<Tensor> gin) {
        if (!gin[0].defined()) return;
        dispatch_float("permute", g.dtype(), [&]<class T>(T) { permute_vjp(w, g.data<T>(), gin[0].data<T>()); });
      },
      [=](std::span<const Tensor> tin, Tensor& ty) {
        if (!tin[0].defined()) return;
        dispatch_float("permute", ty.dtype(), [&]<class T>(T) { permute_jvp(w, tin[0].data<T>(), ty.data<T>()); });
      },
      Tape::linear_in_inputs);
}

// transpose(x, a, b) = permute(x, p) with p the identity but for p[a] = b, p[b] = a; it records "permute".
Var transpose(Var x, int axis0, int axis1) {
  (void)tape_of("transpose", {x});
  const int a = resolve_axis("transpose", axis0, x.shape());
  const int b = resolve_axis("transpose", axis1, x.shape());
  std::array<int, Shape::kMaxRank> p{};
  for (int d = 0; d < x.rank(); ++d) p[static_cast<size_t>(d)] = d;
  std::swap(p[static_cast<size_t>(a)], p[static_cast<size_t>(b)]);
  return permute(x, std::span<const int>(p.data(), static_cast<size_t>(x.rank())));
}

Var slice(Var x, int axis, int64_t start, int64_t stop) {
  (void)tape_of("slice", {x});
  const Shape& xs = x.shape();
  const int a = resolve_axis("slice", axis, xs);
  if (start < 0 || start > stop || stop > xs[a])
    fail("slice: [{}, {}) is out of bounds for axis {} of size {} (x of shape {}); expected 0 ≤ start ≤ stop ≤ {}",
         start, stop, axis, xs[a], xs, xs[a]);
  SliceGeometry s{};
  split_around(xs, a, s.outer, s.inner);
  s.n = xs[a];
  s.start = start;
  s.m = stop - start;
  Shape out = xs;
  out[a] = s.m;
  Tape& tape = x.tape();
  const Tensor xv = x.value();
  Tensor y = tape.empty(x.dtype(), out);
  slice_forward(s, static_cast<const std::byte*>(xv.raw()), static_cast<std::byte*>(y.raw()), dtype_size(x.dtype()));
  return tape.record(
      "slice", {x}, y,
      [=](const Tensor& g, std::span<Tensor> gin) {
        if (!gin[0].defined()) return;
        dispatch_float("slice", g.dtype(), [&]<class T>(T) { slice_vjp(s, g.data<T>(), gin[0].data<T>()); });
      },
      [=](std::span<const Tensor> tin, Tensor& ty) {
        if (!tin[0].defined()) return;
        dispatch_float("slice", ty.dtype(), [&]<class T>(T) { slice_jvp(s, tin[0].data<T>(), ty.data<T>()); });
      },
      Tape::linear_in_inputs);
}

Var concat(std::span<const Var> xs, int axis) {
  if (xs.empty()) fail("concat: needs at least one input, got none (axis {})", axis);
  for (const Var& x : xs) (void)tape_of("concat", {xs[0], x});
  const Var& first = xs[0];
  Tape& tape = first.tape();
  const Shape& s0 = first.shape();
  const int a = resolve_axis("concat", axis, s0);
  Shape out = s0;
  int64_t total = 0;
  for (size_t k = 0; k < xs.size(); ++k) {
    const Var& x = xs[k];
    if (&x.tape() != &tape) fail("concat: input {} comes from another tape than input 0", k);
    if (x.dtype() != first.dtype())
      fail(
          "concat: dtypes differ: input 0 is {} {}, input {} is {} {} (mixing dtypes is an error, not a "
          "conversion)",
          first.dtype(), s0, k, x.dtype(), x.shape());
    bool same = x.rank() == s0.rank();
    for (int d = 0; same && d < s0.rank(); ++d) same = d == a || x.shape()[d] == s0[d];
    if (!same)
      fail("concat: input {} has shape {}, which does not match input 0 of shape {} outside axis {}", k, x.shape(), s0,
           axis);
    total += x.shape()[a];
  }
  out[a] = total;
  ConcatGeometry c{};
  split_around(s0, a, c.outer, c.inner);
  c.total = total;
  c.count = xs.size();
  // The n_k live in the tape's arena as long as the node (8-byte slots, 64-byte aligned).
  auto* sizes = static_cast<int64_t*>(tape.empty(DType::f64, Shape{static_cast<int64_t>(xs.size())}).raw());
  for (size_t k = 0; k < xs.size(); ++k) sizes[k] = xs[k].shape()[a];
  c.sizes = sizes;
  Tensor y = tape.empty(first.dtype(), out);
  concat_forward(c, xs, static_cast<std::byte*>(y.raw()), dtype_size(first.dtype()));
  return tape.record(
      "concat", xs, y,
      [=](const Tensor& g, std::span<Tensor> gin) {
        dispatch_float("concat", g.dtype(), [&]<class T>(T) { concat_vjp(c, g.data<T>(), gin); });
      },
      [=](std::span<const Tensor> tin, Tensor& ty) {
        dispatch_float("concat", ty.dtype(), [&]<class T>(T) { concat_jvp(c, tin, ty.data<T>()); });
      },
      Tape::linear_in_inputs);
}

std::vector<OpSheet> shape_ops() {
  OpSheets r;
  auto reshaped = [](Shape s) { return [s](Tape&, std::span<const Var> x) { return reshape(x[0], s); }; };
  r.add({.name = "reshape",
         .family = "shape",
         .forward = "y[l] = x[l] in the new shape (the same row-major order)",
         .vjp = "x̄[l] += ȳ[l]",
         .jvp = "ẏ[l] = ẋ[l] (same row-major order)",
         .second_order = kNoSecondOrderTerm,
         // Its gradcheck cases, each checked to first and second order by the suite:
         .cases = {{"(2, 3, 4) → (6, 4)", {{"x", {2, 3, 4}}}, reshaped({6, 4})},
                   {"(4, 6) → (2, 2, 6)", {{"x", {4, 6}}}, reshaped({2, 2, 6})},
                   {"(1, 1) → ()", {{"x", {1, 1}}}, reshaped({})}},
         .inputs = 1,
         .call = [](std::span<const Var> x, const OpArgs& a) {
           const std::vector<int64_t> dims = a.integers("shape");
           return reshape(x[0], Shape(std::span<const int64_t>(dims)));
         }});

  auto permuted = [](std::vector<int> p) { return [p](Tape&, std::span<const Var> x) { return permute(x[0], p); }; };
  r.add({.name = "permute",
         .family = "shape",
         .forward = "y[o] = x[off(o)]: the axes of x in the order p",
         .vjp = "x̄[off(o)] += ȳ[o]",
         .jvp = "ẏ[o] = ẋ[off(o)], off(o) = Σ_d i_d·stride_x[p[d]]",
         .second_order = kNoSecondOrderTerm,
         // Its gradcheck cases, each checked to first and second order by the suite:
         .cases = {{"(B, T, h, d) → (B, h, T, d)", {{"x", {2, 3, 2, 4}}}, permuted({0, 2, 1, 3})},
                   {"(B, h, T, d) → (B, h, d, T)", {{"x", {2, 2, 3, 4}}}, permuted({0, 1, 3, 2})},
                   {"cyclic (2, 3, 4) → (4, 2, 3)", {{"x", {2, 3, 4}}}, permuted({2, 0, 1})},
                   {"transpose (3, 5) → (5, 3)",
                    {{"x", {3, 5}}},
                    [](Tape&, std::span<const Var> x) { return transpose(x[0]); }},
                   {"heads: reshape (B, T, C) to (B, T, h, d), permute to (B, h, T, d)",
                    {{"x", {2, 3, 8}}},
                    [](Tape&, std::span<const Var> x) {
                      const std::array<int, 4> p{0, 2, 1, 3};
                      return permute(reshape(x[0], {2, 3, 2, 4}), p);
                    }}},
         .inputs = 1,
         .call = [](std::span<const Var> x, const OpArgs& a) {
           std::vector<int> p;
           for (const int64_t d : a.integers("perm")) p.push_back(static_cast<int>(d));
           return permute(x[0], p);
         }});

  auto sliced = [](int axis, int64_t start, int64_t stop) {
    return [=](Tape&, std::span<const Var> x) { return slice(x[0], axis, start, stop); };
  };
  r.add({.name = "slice",
         .family = "shape",
         .forward = "y[o, j, i] = x[o, start + j, i], 0 ≤ j < stop − start",
         .vjp = "x̄[o, start + j, i] += ȳ[o, j, i]",
         .jvp = "ẏ[o, j, i] = ẋ[o, start + j, i]",
         .second_order = kNoSecondOrderTerm,
         // Its gradcheck cases, each checked to first and second order by the suite:
         .cases = {{"head 1 of 2 along the last axis: (2, 3, 8)[..., 4:8]", {{"x", {2, 3, 8}}}, sliced(-1, 4, 8)},
                   {"head 0 of 4 along the last axis: (3, 8)[:, 0:2]", {{"x", {3, 8}}}, sliced(1, 0, 2)},
                   {"middle axis: (2, 5, 3)[:, 1:4]", {{"x", {2, 5, 3}}}, sliced(1, 1, 4)},
                   {"axis 0: (4, 3)[2:3]", {{"x", {4, 3}}}, sliced(0, 2, 3)}},
         .inputs = 1,
         .call = [](std::span<const Var> x, const OpArgs& a) {
           return slice(x[0], a.axis("axis"), a.integer("start"), a.integer("stop"));
         }});

  auto joined = [](int axis) { return [=](Tape&, std::span<const Var> x) { return concat(x, axis); }; };
  r.add(
      {.name = "concat",
       .family = "shape",
       .forward = "y[o, off_k + j, i] = x_k[o, j, i]: the inputs one after another along an axis",
       .vjp = "x̄_k[o, j, i] += ȳ[o, off_k + j, i]",
       .jvp = "ẏ[o, off_k + j, i] = ẋ_k[o, j, i]",
       .second_order = kNoSecondOrderTerm,
       // Its gradcheck cases, each checked to first and second order by the suite:
       .cases = {{"3 inputs along the last axis", {{"a", {2, 3}}, {"b", {2, 1}}, {"c", {2, 4}}}, joined(-1)},
                 {"3 inputs along a middle axis", {{"a", {2, 1, 3}}, {"b", {2, 2, 3}}, {"c", {2, 3, 3}}}, joined(1)},
                 {"2 inputs along axis 0", {{"a", {2, 3}}, {"b", {1, 3}}}, joined(0)},
                 {"heads cut along the last axis and joined back",
                  {{"x", {2, 3, 6}}},
                  [](Tape&, std::span<const Var> x) {
                    const std::array<Var, 3> heads{slice(x[0], -1, 0, 2), slice(x[0], -1, 2, 4), slice(x[0], -1, 4, 6)};
                    return concat(heads, -1);
                  }}},
       .inputs = {1, InputCount::any},
       .call = [](std::span<const Var> x, const OpArgs& a) { return concat(x, a.axis("axis", 0)); }});
  return r.ops;
}

}  // namespace tapegrad
