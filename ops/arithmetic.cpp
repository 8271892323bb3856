// Element-wise arithmetic with NumPy broadcasting: add, sub, mul, div; and the linear maps neg, scale.
//
// For y = a ∘ b (shapes aligned from the right; a size-1 or missing axis repeats):
//   VJP  ā[i_a] += Σ ȳ[o] · ∂y/∂a   over all outputs o that read a[i_a]   (the sum over broadcast axes)
//        b̄[i_b] += Σ ȳ[o] · ∂y/∂b
//   JVP  ẏ[o] = ∂y/∂a · ȧ[i_a] + ∂y/∂b · ḃ[i_b]
// with the partials
//   add  ∂a = 1      ∂b = 1
//   sub  ∂a = 1      ∂b = −1
//   mul  ∂a = b      ∂b = a
//   div  ∂a = 1/b    ∂b = −a/b²
// Second order (Tape::hvp), the tangent of the VJP at a fixed ȳ:
//   ā̇[i_a] += Σ ȳ[o]·(∂aa·ȧ + ∂ab·ḃ),   ḃ̄[i_b] += Σ ȳ[o]·(∂ab·ȧ + ∂bb·ḃ)
// with the second partials (add and sub: all 0)
//   mul  ∂aa = 0     ∂ab = 1       ∂bb = 0
//   div  ∂aa = 0     ∂ab = −1/b²   ∂bb = 2a/b³
#include <array>

#include "ops/sheet.hpp"
#include "engine/parallel.hpp"
#include "ops/common.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

// Output shape and, per output axis, the element stride of a and b (0 where that input is broadcast).
struct Broadcast {
  Shape out;
  std::array<int64_t, Shape::kMaxRank> stride_a{}, stride_b{};
  bool same_shapes = false;  // a, b and the output have one shape
};

Broadcast broadcast(const char* op, const Shape& a, const Shape& b) {
  Broadcast bc;
  const int r = std::max(a.rank(), b.rank());
  std::array<int64_t, Shape::kMaxRank> dims{};
  for (int d = 0; d < r; ++d) {
    int da = d - (r - a.rank()), db = d - (r - b.rank());
    int64_t sa = da >= 0 ? a[da] : 1, sb = db >= 0 ? b[db] : 1;
    if (sa != sb && sa != 1 && sb != 1)
      fail("{}: shapes {} and {} do not broadcast (axis {}: {} vs {})", op, a, b, d, sa, sb);
    dims[static_cast<size_t>(d)] = std::max(sa, sb);
    if (sa == 0 || sb == 0) dims[static_cast<size_t>(d)] = 0;
  }
  bc.out = Shape(std::span<const int64_t>(dims.data(), static_cast<size_t>(r)));
  bc.same_shapes = a == b;
  int64_t ca = 1, cb = 1;
  for (int d = r - 1; d >= 0; --d) {
    int da = d - (r - a.rank()), db = d - (r - b.rank());
    int64_t sa = da >= 0 ? a[da] : 1, sb = db >= 0 ? b[db] : 1;
    bc.stride_a[static_cast<size_t>(d)] = sa == 1 ? 0 : ca;
    bc.stride_b[static_cast<size_t>(d)] = sb == 1 ? 0 : cb;
    ca *= sa;
    cb *= sb;
  }
  return bc;
}

// Calls f(o, ia, ib) for every output element o, in order. When a and b have the output's shape (no broadcast:
// o ↦ o is a bijection, nothing is summed), the elements are split across the engine's threads instead.
template <class F>
void for_each_broadcast(const Broadcast& bc, F&& f) {
  const int r = bc.out.rank();
  const int64_t n = bc.out.numel();
  if (n == 0) return;
  if (r == 0) return f(int64_t{0}, int64_t{0}, int64_t{0});
  if (bc.same_shapes) {
    parallel_for(n, 16384, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) f(o, o, o);
    });
    return;
  }
  const int64_t inner = bc.out[r - 1];
  const int64_t sa = bc.stride_a[static_cast<size_t>(r - 1)], sb = bc.stride_b[static_cast<size_t>(r - 1)];
  std::array<int64_t, Shape::kMaxRank> idx{};
  int64_t ia = 0, ib = 0;
  for (int64_t o = 0; o < n; o += inner) {
    for (int64_t k = 0; k < inner; ++k) f(o + k, ia + k * sa, ib + k * sb);
    for (int d = r - 2; d >= 0; --d) {  // advance the outer multi-index
      auto du = static_cast<size_t>(d);
      ia += bc.stride_a[du];
      ib += bc.stride_b[du];
      if (++idx[du] < bc.out[d]) break;
      ia -= bc.stride_a[du] * bc.out[d];
      ib -= bc.stride_b[du] * bc.out[d];
      idx[du] = 0;
    }
  }
}

struct Add {
  static constexpr const char* name = "add";
  template <class T>
  static T f(T a, T b) {
    return a + b;
  }
  template <class T>
  static T da(T, T) {
    return 1;
  }
  template <class T>
  static T db(T, T) {
    return 1;
  }
  static constexpr bool linear = true;
};
struct Sub {
  static constexpr const char* name = "sub";
  template <class T>
  static T f(T a, T b) {
    return a - b;
  }
  template <class T>
  static T da(T, T) {
    return 1;
  }
  template <class T>
  static T db(T, T) {
    return -1;
  }
  static constexpr bool linear = true;
};
struct Mul {
  static constexpr const char* name = "mul";
  template <class T>
  static T f(T a, T b) {
    return a * b;
  }
  template <class T>
  static T da(T, T b) {
    return b;
  }
  template <class T>
  static T db(T a, T) {
    return a;
  }
  static constexpr bool linear = false;
  template <class T>
  static T daa(T, T) {
    return 0;
  }
  template <class T>
  static T dab(T, T) {
    return 1;
  }
  template <class T>
  static T dbb(T, T) {
    return 0;
  }
};
struct Div {
  static constexpr const char* name = "div";
  template <class T>
  static T f(T a, T b) {
    return a / b;
  }
  template <class T>
  static T da(T, T b) {
    return 1 / b;
  }
  template <class T>
  static T db(T a, T b) {
    return -a / (b * b);
  }
  static constexpr bool linear = false;
  template <class T>
  static T daa(T, T) {
    return 0;
  }
  template <class T>
  static T dab(T, T b) {
    return -1 / (b * b);
  }
  template <class T>
  static T dbb(T a, T b) {
    return 2 * a / (b * b * b);
  }
};

// The second-order rule of the header for Op (mul, div).
template <class Op>
auto binary_second_order(const Broadcast& bc, const Tensor& av, const Tensor& bv) {
  return [=](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
    dispatch_float(Op::name, g.dtype(), [&]<class T>(T) {
      const T *pa = av.data<T>(), *pb = bv.data<T>(), *pg = g.data<T>();
      const T* ta = tin[0].defined() ? tin[0].data<T>() : nullptr;
      const T* tb = tin[1].defined() ? tin[1].data<T>() : nullptr;
      auto tangent = [&](int64_t i, int64_t j, T d_a, T d_b) {
        return (ta ? d_a * ta[i] : T(0)) + (tb ? d_b * tb[j] : T(0));
      };
      if (gin_dot[0].defined()) {
        T* out = gin_dot[0].data<T>();
        for_each_broadcast(bc, [&](int64_t o, int64_t i, int64_t j) {
          out[i] += pg[o] * tangent(i, j, Op::daa(pa[i], pb[j]), Op::dab(pa[i], pb[j]));
        });
      }
      if (gin_dot[1].defined()) {
        T* out = gin_dot[1].data<T>();
        for_each_broadcast(bc, [&](int64_t o, int64_t i, int64_t j) {
          out[j] += pg[o] * tangent(i, j, Op::dab(pa[i], pb[j]), Op::dbb(pa[i], pb[j]));
        });
      }
    });
  };
}

template <class Op>
Var binary(Var a, Var b) {
  Tape& tape = tape_of(Op::name, {a, b});
  expect_float(Op::name, a);
  expect_float(Op::name, b);
  expect_same_dtype(Op::name, a, b);
  const Broadcast bc = broadcast(Op::name, a.shape(), b.shape());
  const Tensor av = a.value(), bv = b.value();
  Tensor y = tape.empty(a.dtype(), bc.out);
  dispatch_float(Op::name, a.dtype(), [&]<class T>(T) {
    const T *pa = av.data<T>(), *pb = bv.data<T>();
    T* py = y.data<T>();
    for_each_broadcast(bc, [&](int64_t o, int64_t i, int64_t j) { py[o] = Op::f(pa[i], pb[j]); });
  });
  auto vjp = [=](const Tensor& g, std::span<Tensor> gin) {
    dispatch_float(Op::name, g.dtype(), [&]<class T>(T) {
      const T *pa = av.data<T>(), *pb = bv.data<T>(), *pg = g.data<T>();
      if (gin[0].defined()) {
        T* ga = gin[0].data<T>();
        for_each_broadcast(bc, [&](int64_t o, int64_t i, int64_t j) { ga[i] += pg[o] * Op::da(pa[i], pb[j]); });
      }
      if (gin[1].defined()) {
        T* gb = gin[1].data<T>();
        for_each_broadcast(bc, [&](int64_t o, int64_t i, int64_t j) { gb[j] += pg[o] * Op::db(pa[i], pb[j]); });
      }
    });
  };
  auto jvp = [=](std::span<const Tensor> tin, Tensor& ty) {
    dispatch_float(Op::name, ty.dtype(), [&]<class T>(T) {
      const T *pa = av.data<T>(), *pb = bv.data<T>();
      T* pt = ty.data<T>();
      if (tin[0].defined()) {
        const T* ta = tin[0].data<T>();
        for_each_broadcast(bc, [&](int64_t o, int64_t i, int64_t j) { pt[o] += Op::da(pa[i], pb[j]) * ta[i]; });
      }
      if (tin[1].defined()) {
        const T* tb = tin[1].data<T>();
        for_each_broadcast(bc, [&](int64_t o, int64_t i, int64_t j) { pt[o] += Op::db(pa[i], pb[j]) * tb[j]; });
      }
    });
  };
  if constexpr (Op::linear) return tape.record(Op::name, {a, b}, y, vjp, jvp, Tape::linear_in_inputs);
  else return tape.record(Op::name, {a, b}, y, vjp, jvp, binary_second_order<Op>(bc, av, bv));
}

// y = s·x:  x̄ += s·ȳ,  ẏ = s·ẋ   (neg is s = −1)
Var linear_scale(const char* op, Var x, double s) {
  expect_float(op, x);
  Tape& tape = x.tape();
  const Tensor xv = x.value();
  Tensor y = tape.empty(x.dtype(), x.shape());
  auto axpy = [s](const char* name, Tensor& dst, const Tensor& src) {  // dst += s·src
    dispatch_float(name, dst.dtype(), [&]<class T>(T) {
      T* d = dst.data<T>();
      const T* p = src.data<T>();
      for (int64_t i = 0, n = dst.numel(); i < n; ++i) d[i] += static_cast<T>(s) * p[i];
    });
  };
  y.fill_zero();
  axpy(op, y, xv);
  return tape.record(
      op, {x}, y, [=](const Tensor& g, std::span<Tensor> gin) { axpy(op, gin[0], g); },
      [=](std::span<const Tensor> tin, Tensor& ty) { axpy(op, ty, tin[0]); }, Tape::linear_in_inputs);
}

}  // namespace

Var add(Var a, Var b) { return binary<Add>(a, b); }
Var sub(Var a, Var b) { return binary<Sub>(a, b); }
Var mul(Var a, Var b) { return binary<Mul>(a, b); }
Var div(Var a, Var b) { return binary<Div>(a, b); }
Var neg(Var x) { return linear_scale("neg", x, -1.0); }
Var scale(Var x, double s) { return linear_scale("scale", x, s); }

std::vector<OpSheet> arithmetic_ops() {
  OpSheets r;
  auto bin = [](Var (*op)(Var, Var)) { return [op](Tape&, std::span<const Var> x) { return op(x[0], x[1]); }; };
  struct Binary {
    const char* name;
    Var (*fn)(Var, Var);
    Fill b_fill;
    const char* forward;
    const char* vjp;
    const char* jvp;
    const char* second_order;
    const char* second_order_derivation;
  };
  for (const Binary& op :
       {Binary{"add", add, Fill::normal, "y = a + b (broadcast)", "ā += Σ_bcast ȳ, b̄ += Σ_bcast ȳ", "ẏ = ȧ + ḃ",
               kNoSecondOrderTerm, "6.1"},
        Binary{"sub", sub, Fill::normal, "y = a − b (broadcast)", "ā += Σ_bcast ȳ, b̄ −= Σ_bcast ȳ", "ẏ = ȧ − ḃ",
               kNoSecondOrderTerm, "6.1"},
        Binary{"mul", mul, Fill::normal, "y = a·b (broadcast)", "ā += Σ_bcast ȳ·b, b̄ += Σ_bcast ȳ·a", "ẏ = ȧ·b + a·ḃ",
               "ā̇ += Σ_bcast ȳ·ḃ, b̄̇ += Σ_bcast ȳ·ȧ", "6.2"},
        Binary{"div", div, Fill::positive, "y = a/b (broadcast)", "ā += Σ_bcast ȳ/b, b̄ −= Σ_bcast ȳ·a/b²",
               "ẏ = ȧ/b − a·ḃ/b²", "ā̇ −= Σ_bcast ȳ·ḃ/b², b̄̇ += Σ_bcast ȳ·(2a·ḃ/b³ − ȧ/b²)", "6.3"}}) {
    r.add({.name = op.name,
           .family = "arithmetic",
           .forward = op.forward,
           .vjp = op.vjp,
           .jvp = op.jvp,
           .second_order = op.second_order,
           .second_order_derivation = op.second_order_derivation,
           // Its gradcheck cases, each checked to first and second order by the suite:
           .cases = {{"same shape", {{"a", {3, 4}}, {"b", {3, 4}, op.b_fill}}, bin(op.fn)},
                     {"row broadcast", {{"a", {2, 3, 4}}, {"b", {4}, op.b_fill}}, bin(op.fn)},
                     {"both broadcast", {{"a", {2, 1, 4}}, {"b", {3, 1}, op.b_fill}}, bin(op.fn)},
                     {"scalar", {{"a", {2, 3}}, {"b", {}, op.b_fill}}, bin(op.fn)}},
           // a/0 is ±∞, and at |b| = 1e-200 the derivative a/b² overflows float64: IEEE's values, as documented
           .undefined_edges =
               op.fn == div ? std::vector<std::string>{"zeros=inf", "tiny=inf"} : std::vector<std::string>{},
           .inputs = 2,
           .call = [fn = op.fn](std::span<const Var> x, const OpArgs&) { return fn(x[0], x[1]); }});
  }
  r.add({.name = "neg",
         .family = "arithmetic",
         .forward = "y = −x",
         .vjp = "x̄ −= ȳ",
         .jvp = "ẏ = −ẋ",
         .second_order = kNoSecondOrderTerm,
         // Its gradcheck cases, each checked to first and second order by the suite:
         .cases = {{"matrix", {{"x", {3, 5}}}, [](Tape&, std::span<const Var> x) { return neg(x[0]); }}},
         .inputs = 1,
         .call = [](std::span<const Var> x, const OpArgs&) { return neg(x[0]); }});
  r.add({.name = "scale",
         .family = "arithmetic",
         .forward = "y = s·x",
         .vjp = "x̄ += s·ȳ",
         .jvp = "ẏ = s·ẋ",
         .second_order = kNoSecondOrderTerm,
         // Its gradcheck cases, each checked to first and second order by the suite:
         .cases = {{"s = -2.5", {{"x", {2, 3, 2}}}, [](Tape&, std::span<const Var> x) { return scale(x[0], -2.5); }}},
         .inputs = 1,
         .call = [](std::span<const Var> x, const OpArgs& a) { return scale(x[0], a.number("s", 1.0)); }});
  return r.ops;
}

}  // namespace tapegrad
