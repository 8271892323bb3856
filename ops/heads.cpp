// The attention block's head split and merge, each one copy (models/gpt.cpp), in place of slice + reshape +
// permute (two copies and two gradient buffers) and permute + reshape.
//
// split_heads: x (B, T, W), h heads of d columns from column `offset` → y (B, h, T, d):
//   y[b, i, t, e] = x[b, t, offset + i·d + e]                      (i < h, e < d)
// merge_heads: y (B, h, T, d) → z (B, T, h·d):
//   z[b, t, i·d + e] = y[b, i, t, e]
// Both move elements without changing them (y = P·x, P a 0/1 matrix with one 1 per row), so, as for the shape ops:
//   VJP  x̄ += Pᵀ·ȳ  (split: x̄[b, t, offset + i·d + e] += ȳ[b, i, t, e]; columns outside the heads get nothing)
//   JVP  ẏ = P·ẋ    (the same move on the tangent)
// Each kernel walks the (b, t, i) rows of d contiguous elements; the (b, t) pairs run on the engine's threads.
#include <algorithm>

#include "ops/sheet.hpp"
#include "engine/parallel.hpp"
#include "ops/common.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

// The row walk shared by both ops: x (B, T, W) with heads at column `offset`, y (B, h, T, d).
struct HeadsGeometry {
  int64_t B, T, W, h, d, offset;
  int64_t x_row(int64_t b, int64_t t, int64_t i) const { return (b * T + t) * W + offset + i * d; }
  int64_t y_row(int64_t b, int64_t t, int64_t i) const { return ((b * h + i) * T + t) * d; }
  // (b, t) pairs per range: ~16k elements at least.
  int64_t grain() const { return std::max<int64_t>(1, 16384 / std::max<int64_t>(h * d, 1)); }
};

// Calls f(x_offset, y_offset) for every row of d elements, the (b, t) pairs split across the engine's threads.
template <class F>
void for_each_head_row(const HeadsGeometry& g, F&& f) {
  parallel_for(g.B * g.T, g.grain(), [&](int64_t begin, int64_t end) {
    for (int64_t bt = begin; bt < end; ++bt) {
      const int64_t b = bt / g.T, t = bt % g.T;
      for (int64_t i = 0; i < g.h; ++i) f(g.x_row(b, t, i), g.y_row(b, t, i));
    }
  });
}

// y[y_row + e] = x[x_row + e]: split_heads forward, merge_heads forward with the roles exchanged.
template <class T>
void gather_heads(const HeadsGeometry& g, const T* x, T* y) {
  for_each_head_row(g, [&](int64_t xo, int64_t yo) { std::copy_n(x + xo, g.d, y + yo); });
}
template <class T>
void scatter_heads(const HeadsGeometry& g, const T* y, T* x) {
  for_each_head_row(g, [&](int64_t xo, int64_t yo) { std::copy_n(y + yo, g.d, x + xo); });
}
// x̄[x_row + e] += ȳ[y_row + e]  (split_heads VJP, merge_heads JVP)
template <class T>
void add_to_rows(const HeadsGeometry& g, const T* y, T* x) {
  for_each_head_row(g, [&](int64_t xo, int64_t yo) {
    for (int64_t e = 0; e < g.d; ++e) x[xo + e] += y[yo + e];
  });
}
// ȳ[y_row + e] += x̄[x_row + e]  (split_heads JVP, merge_heads VJP)
template <class T>
void add_to_heads(const HeadsGeometry& g, const T* x, T* y) {
  for_each_head_row(g, [&](int64_t xo, int64_t yo) {
    for (int64_t e = 0; e < g.d; ++e) y[yo + e] += x[xo + e];
  });
}

}  // namespace

Var split_heads(Var x, int64_t heads, int64_t offset, int64_t width) {
  constexpr const char* op = "split_heads";
  Tape& tape = tape_of(op, {x});
  expect_float(op, x);
  if (x.rank() != 3) fail("{}: x must be (B, T, W), got shape {}", op, x.shape());
  const Shape& s = x.shape();
  if (heads < 1 || width < heads || width % heads != 0)
    fail("{}: {} columns do not split into {} heads of equal width (x {})", op, width, heads, s);
  if (offset < 0 || offset + width > s[2])
    fail("{}: columns [{}, {}) are outside x {} (W = {})", op, offset, offset + width, s, s[2]);
  const HeadsGeometry g{s[0], s[1], s[2], heads, width / heads, offset};
  const Tensor xv = x.value();
  Tensor y = tape.empty(x.dtype(), {g.B, g.h, g.T, g.d});
  dispatch_float(op, x.dtype(), [&]<class T>(T) { gather_heads(g, xv.data<T>(), y.data<T>()); });
  return tape.record(
      op, {x}, y,
      [g](const Tensor& gy, std::span<Tensor> gin) {
        if (!gin[0].defined()) return;
        dispatch_float(op, gy.dtype(), [&]<class T>(T) { add_to_rows(g, gy.data<T>(), gin[0].data<T>()); });
      },
      [g](std::span<const Tensor> tin, Tensor& ty) {
        dispatch_float(op, ty.dtype(), [&]<class T>(T) { add_to_heads(g, tin[0].data<T>(), ty.data<T>()); });
      },
      Tape::linear_in_inputs);
}

Var merge_heads(Var y) {
  constexpr const char* op = "merge_heads";
  Tape& tape = tape_of(op, {y});
  expect_float(op, y);
  if (y.rank() != 4) fail("{}: y must be (B, h, T, d), got shape {}", op, y.shape());
  const Shape& s = y.shape();
  const HeadsGeometry g{s[0], s[2], s[1] * s[3], s[1], s[3], 0};
  const Tensor yv = y.value();
  Tensor z = tape.empty(y.dtype(), {g.B, g.T, g.W});
  dispatch_float(op, y.dtype(), [&]<class T>(T) { scatter_heads(g, yv.data<T>(), z.data<T>()); });
  return tape.record(
      op, {y}, z,
      [g](const Tensor& gz, std::span<Tensor> gin) {
        if (!gin[0].defined()) return;
        dispatch_float(op, gz.dtype(), [&]<class T>(T) { add_to_heads(g, gz.data<T>(), gin[0].data<T>()); });
      },
      [g](std::span<const Tensor> tin, Tensor& tz) {
        dispatch_float(op, tz.dtype(), [&]<class T>(T) { add_to_rows(g, tin[0].data<T>(), tz.data<T>()); });
      },
      Tape::linear_in_inputs);
}

std::vector<OpSheet> heads_ops() {
  OpSheets r;
  r.add({.name = "split_heads",
         .family = "heads",
         .forward = "y[b,i,t,e] = x[b,t,offset+i·d+e]: (B, T, C) columns to (B, h, T, d) heads",
         .vjp = "x̄[b,t,offset+i·d+e] += ȳ[b,i,t,e]",
         .jvp = "ẏ[b,i,t,e] = ẋ[b,t,offset+i·d+e]",
         .second_order = kNoSecondOrderTerm,
         // Its gradcheck cases, each checked to first and second order by the suite:
         .cases = {{"x (2, 3, 8), 2 heads from column 2",
                    {{"x", {2, 3, 8}}},
                    [](Tape&, std::span<const Var> x) { return split_heads(x[0], 2, 2, 4); }},
                   {"x (1, 4, 6), 3 heads, all columns",
                    {{"x", {1, 4, 6}}},
                    [](Tape&, std::span<const Var> x) { return split_heads(x[0], 3, 0, 6); }}},
         .inputs = 1,
         .call = [](std::span<const Var> x, const OpArgs& a) {
           return split_heads(x[0], a.integer("heads"), a.integer("offset", 0), a.integer("width"));
         }});
  r.add({.name = "merge_heads",
         .family = "heads",
         .forward = "z[b,t,i·d+e] = y[b,i,t,e]: (B, h, T, d) heads to (B, T, h·d)",
         .vjp = "ȳ[b,i,t,e] += z̄[b,t,i·d+e]",
         .jvp = "ż[b,t,i·d+e] = ẏ[b,i,t,e]",
         .second_order = kNoSecondOrderTerm,
         // Its gradcheck cases, each checked to first and second order by the suite:
         .cases = {{"y (2, 3, 4, 2)",
                    {{"y", {2, 3, 4, 2}}},
                    [](Tape&, std::span<const Var> x) { return merge_heads(x[0]); }}},
         .inputs = 1,
         .call = [](std::span<const Var> x, const OpArgs&) { return merge_heads(x[0]); }});
  return r.ops;
}

}  // namespace tapegrad
