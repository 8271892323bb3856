// Reductions: sum and mean, over all elements or along one axis.
//
// Around the reduced axis x is read as (outer, n, inner); the all-elements form is outer = inner = 1,
// n = numel. With c = 1 for sum and c = 1/n for mean:
//   y[o, i] = c · Σ_j x[o, j, i]                          y: (outer, inner), shaped as x without the axis
// The map is linear, so its derivatives are the map's transpose and the map itself:
//   VJP  x̄[o, j, i] += c · ȳ[o, i]                        (ȳ repeated along the reduced axis)
//   JVP  ẏ[o, i]    += c · Σ_j ẋ[o, j, i]
// keepdim only puts a 1 in place of the axis in the shape of y; the elements are the same.
#include "ops/sheet.hpp"
#include "ops/common.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

// x read as (outer, n, inner) around the reduced axis, and the shape of y.
struct AxisSplit {
  int64_t outer = 1, n = 1, inner = 1;
  Shape out;
};

AxisSplit split_all(const Shape& s) {
  AxisSplit sp;
  sp.n = s.numel();
  return sp;  // out = ()
}

AxisSplit split_axis(const char* op, const Shape& s, int axis, bool keepdim) {
  const int r = s.rank();
  if (axis < -r || axis >= r)
    fail("{}: axis {} is out of range for x of shape {} (valid axes: {}..{})", op, axis, s, -r, r - 1);
  const int a = normalize_axis(op, axis, r);
  AxisSplit sp;
  for (int d = 0; d < r; ++d) {
    if (d < a) sp.outer *= s[d];
    if (d > a) sp.inner *= s[d];
    if (d != a) sp.out.push_back(s[d]);
    else if (keepdim) sp.out.push_back(1);
  }
  sp.n = s[a];
  return sp;
}

// y[o, i] += c · Σ_j x[o, j, i]                   x: (outer, n, inner), y: (outer, inner)
// A contiguous reduced axis (inner = 1, which includes the all-elements sum) is summed in double: 10⁶ terms
// of 0.1f summed in float32 come out 1% high, in double they round to the float32 nearest the true sum.
// Otherwise whole rows x[o, j, :] are added into y[o, :], a unit-stride inner loop in T.
template <class T>
void reduce_forward(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, double c) {
  if (inner == 1) {
    for (int64_t o = 0; o < outer; ++o) {
      const T* row = x + o * n;
      double acc[4] = {0, 0, 0, 0};  // four independent chains of additions
      int64_t j = 0;
      for (; j + 4 <= n; j += 4)
        for (int u = 0; u < 4; ++u) acc[u] += static_cast<double>(row[j + u]);
      for (; j < n; ++j) acc[0] += static_cast<double>(row[j]);
      y[o] += static_cast<T>(c * ((acc[0] + acc[1]) + (acc[2] + acc[3])));
    }
    return;
  }
  const T ct = static_cast<T>(c);
  for (int64_t o = 0; o < outer; ++o) {
    T* yo = y + o * inner;
    for (int64_t j = 0; j < n; ++j) {
      const T* xj = x + (o * n + j) * inner;
      for (int64_t i = 0; i < inner; ++i) yo[i] += ct * xj[i];
    }
  }
}

// x̄[o, j, i] += c · ȳ[o, i]                       ȳ: (outer, inner), x̄: (outer, n, inner)
template <class T>
void reduce_vjp(const T* gy, T* gx, int64_t outer, int64_t n, int64_t inner, double c) {
  const T ct = static_cast<T>(c);
  for (int64_t o = 0; o < outer; ++o) {
    const T* go = gy + o * inner;
    for (int64_t j = 0; j < n; ++j) {
      T* gxj = gx + (o * n + j) * inner;
      for (int64_t i = 0; i < inner; ++i) gxj[i] += ct * go[i];
    }
  }
}

// ẏ[o, i] += c · Σ_j ẋ[o, j, i]: the forward map applied to the tangent, the map being linear.
//                                                 ẋ: (outer, n, inner), ẏ: (outer, inner)
template <class T>
void reduce_jvp(const T* tx, T* ty, int64_t outer, int64_t n, int64_t inner, double c) {
  reduce_forward(tx, ty, outer, n, inner, c);
}

// The node y = c · Σ_j x[o, j, i]; y starts at zero since the forward kernel adds.
Var reduce(const char* op, Var x, const AxisSplit& sp, bool is_mean) {
  if (is_mean && sp.n == 0)
    fail("{}: the mean over zero elements is undefined (x of shape {}, reduced extent 0)", op, x.shape());
  Tape& tape = x.tape();
  const double c = is_mean ? 1.0 / static_cast<double>(sp.n) : 1.0;
  const int64_t outer = sp.outer, n = sp.n, inner = sp.inner;
  const Tensor xv = x.value();
  Tensor y = tape.zeros(x.dtype(), sp.out);
  dispatch_float(op, x.dtype(), [&]<class T>(T) { reduce_forward(xv.data<T>(), y.data<T>(), outer, n, inner, c); });
  return tape.record(
      op, {x}, y,
      [=](const Tensor& g, std::span<Tensor> gin) {
        if (!gin[0].defined()) return;
        dispatch_float(op, g.dtype(),
                       [&]<class T>(T) { reduce_vjp(g.data<T>(), gin[0].data<T>(), outer, n, inner, c); });
      },
      [=](std::span<const Tensor> tin, Tensor& ty) {
        if (!tin[0].defined()) return;
        dispatch_float(op, ty.dtype(),
                       [&]<class T>(T) { reduce_jvp(tin[0].data<T>(), ty.data<T>(), outer, n, inner, c); });
      },
      Tape::linear_in_inputs);
}

}  // namespace

Var sum(Var x) {
  expect_float("sum", x);
  return reduce("sum", x, split_all(x.shape()), false);
}
Var sum(Var x, int axis, bool keepdim) {
  expect_float("sum", x);
  return reduce("sum", x, split_axis("sum", x.shape(), axis, keepdim), false);
}
Var mean(Var x) {
  expect_float("mean", x);
  return reduce("mean", x, split_all(x.shape()), true);
}
Var mean(Var x, int axis, bool keepdim) {
  expect_float("mean", x);
  return reduce("mean", x, split_axis("mean", x.shape(), axis, keepdim), true);
}

std::vector<OpSheet> reduce_ops() {
  OpSheets r;
  struct Reduction {
    const char* name;
    Var (*all)(Var);
    Var (*along)(Var, int, bool);
    const char* forward;
    const char* vjp;
    const char* jvp;
  };
  for (const Reduction& f : {Reduction{"sum", sum, sum, "y[o,i] = Σ_j x[o,j,i] (over one axis, or all of x)",
                                       "x̄[o,j,i] += ȳ[o,i] (all of x for sum(x))", "ẏ[o,i] = Σ_j ẋ[o,j,i]"},
                             Reduction{"mean", mean, mean, "y[o,i] = Σ_j x[o,j,i]/n (n = reduced extent)",
                                       "x̄[o,j,i] += ȳ[o,i]/n", "ẏ[o,i] = Σ_j ẋ[o,j,i]/n (n = reduced extent)"}}) {
    auto whole = [fn = f.all](Tape&, std::span<const Var> x) { return fn(x[0]); };
    auto along = [fn = f.along](int axis, bool keepdim) {
      return [=](Tape&, std::span<const Var> x) { return fn(x[0], axis, keepdim); };
    };
    r.add({.name = f.name,
           .family = "reduce",
           .forward = f.forward,
           .vjp = f.vjp,
           .jvp = f.jvp,
           .second_order = kNoSecondOrderTerm,
           // Its gradcheck cases, each checked to first and second order by the suite:
           .cases = {{"all elements", {{"x", {3, 4}}}, whole},
                     {"all elements of a scalar", {{"x", {}}}, whole},
                     {"axis 0", {{"x", {3, 4, 2}}}, along(0, false)},
                     {"last axis", {{"x", {2, 3, 5}}}, along(2, false)},
                     {"axis -2", {{"x", {2, 4, 3}}}, along(-2, false)},
                     {"axis 1, keepdim", {{"x", {2, 3, 4}}}, along(1, true)},
                     {"axis -1, keepdim", {{"x", {4, 3}}}, along(-1, true)}},
           // No axis: over all of x.
           .inputs = 1,
           .call = [over_all = f.all, over_axis = f.along](std::span<const Var> x, const OpArgs& a) {
             return a.has("axis") ? over_axis(x[0], a.axis("axis"), a.flag("keepdim", false)) : over_all(x[0]);
           }});
  }
  return r.ops;
}

}  // namespace tapegrad
