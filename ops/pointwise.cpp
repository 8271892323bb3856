// Element-wise functions y = f(x):  VJP x̄ += f′(x)·ȳ,  JVP ẏ = f′(x)·ẋ.
// Each f′ is written with whatever of x and y makes it cheapest; the node keeps those two tensors.
//   exp   f′ = y
//   log   f′ = 1/x                                   (x > 0)
//   tanh  f′ = 1 − y²
//   relu  f′ = [x > 0]                               (0 at the kink x = 0)
//   elu   y = x (x > 0), α(eˣ − 1) (x ≤ 0);  f′ = 1 (x > 0), y + α (x ≤ 0)
// gelu has its own node below: it keeps tanh u instead of y, so that its derivative needs no second tanh.
#include <bit>
#include <cmath>

#include "engine/parallel.hpp"
#include "ops/common.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

struct Exp {
  static constexpr const char* name = "exp";
  template <class T> T f(T x) const { return std::exp(x); }
  template <class T> T df(T, T y) const { return y; }
};
struct Log {
  static constexpr const char* name = "log";
  template <class T> T f(T x) const { return std::log(x); }
  template <class T> T df(T x, T) const { return 1 / x; }
};
struct Tanh {
  static constexpr const char* name = "tanh";
  template <class T> T f(T x) const { return std::tanh(x); }
  template <class T> T df(T, T y) const { return 1 - y * y; }
};
struct Relu {
  static constexpr const char* name = "relu";
  template <class T> T f(T x) const { return x > 0 ? x : T(0); }
  template <class T> T df(T x, T) const { return x > 0 ? T(1) : T(0); }
};
struct Elu {
  static constexpr const char* name = "elu";
  double alpha;
  template <class T> T f(T x) const { return x > 0 ? x : T(alpha) * std::expm1(x); }
  template <class T> T df(T x, T y) const { return x > 0 ? T(1) : y + T(alpha); }
};

template <class Fn>
Var pointwise(Var x, Fn fn) {
  expect_float(Fn::name, x);
  Tape& tape = x.tape();
  const Tensor xv = x.value();
  Tensor y = tape.empty(x.dtype(), x.shape());
  const int64_t n = y.numel();
  dispatch_float(Fn::name, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = xv.data<T>();
    T* py = y.data<T>();
    for (int64_t i = 0; i < n; ++i) py[i] = fn.f(px[i]);
  });
  // out += f′(x) ⊙ in: the VJP with (out, in) = (x̄, ȳ), the JVP with (ẏ, ẋ).
  auto apply_derivative = [=](const Tensor& out, const Tensor& in) {
    dispatch_float(Fn::name, out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T *px = xv.data<T>(), *py = y.data<T>(), *pi = in.data<T>();
      T* po = out.data<T>();
      for (int64_t i = 0; i < n; ++i) po[i] += fn.df(px[i], py[i]) * pi[i];
    });
  };
  return tape.record(
      Fn::name, {x}, y, [=](const Tensor& g, std::span<const Tensor> gin) { apply_derivative(gin[0], g); },
      [=](std::span<const Tensor> tin, const Tensor& ty) { apply_derivative(ty, tin[0]); });
}

// ---- gelu ----
// GPT-2's tanh form, per element (notation of the header):
//   y = ½x(1 + t),   t = tanh u,   u = √(2/π)(x + 0.044715x³)
//   f′(x) = ½(1 + t) + ½x(1 − t²)·√(2/π)(1 + 3·0.044715x²)          (dt/du = 1 − t², du/dx = √(2/π)(1 + 3·0.044715x²))
// The node keeps x and t; VJP x̄ += f′(x)·ȳ and JVP ẏ = f′(x)·ẋ read t instead of evaluating tanh again.
constexpr double kGeluC = 0.7978845608028654;  // √(2/π)
constexpr double kGeluA = 0.044715;

// tanh in float32 without a libm call and without branches, so that loops over it vectorize:
//   |u| < 0.625   tanh u = u·P(u²), P of degree 5 fitted to tanh(u)/u on [0, 0.625²]
//   |u| ≥ 0.625   tanh |u| = (1 − e)/(1 + e) with e = exp(−2|u|) ≤ 0.29, so 1 − e does not cancel;
//                 exp(z) = 2ⁿ·exp(r), n = round(z/ln 2), r = z − n·ln 2 ∈ [−ln 2/2, ln 2/2] (ln 2 split in a
//                 high part with 16 bits and a low part, so n·ln2_hi is exact), exp(r) a degree-6 polynomial
//                 fitted on that interval (relative error 1e-7); |u| is clamped at 9, where tanh is 1 in float32.
// Error at most 1.6 ulp over every positive float (checked exhaustively against double tanh); tanh(±∞) = ±1,
// NaN stays NaN (it takes the first branch).
inline float tanh_f32(float u) {
  const float a = std::fabs(u);
  const float w = a * a;
  const float near_zero =
      a * (1.0f + w * (-0.33333259821f + w * (0.13331127167f + w * (-0.05372107029f +
                                                                   w * (0.02059099264f + w * -0.00565999281f)))));
  const float z = -2.0f * (a < 9.0f ? a : 9.0f);
  constexpr float kRound = 12582912.0f;  // 1.5·2²³: adding it rounds z/ln 2 to an integer in the low mantissa bits
  const float shifted = z * 1.44269504089f + kRound;
  const int32_t n = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  const float nf = shifted - kRound;
  const float r = (z - nf * 0.693145751953125f) - nf * 1.428606765330187e-06f;
  const float exp_r =
      1.0f + r * (1.0f + r * (0.49999991059f + r * (0.16666419804f +
                                                   r * (0.04166822508f + r * (0.00837481674f + r * 0.00138369261f)))));
  const float e = exp_r * std::bit_cast<float>((n + 127) << 23);  // 2ⁿ, n ∈ [−26, −1]
  const float away_from_zero = (1.0f - e) / (1.0f + e);
  return std::copysign(a >= 0.625f ? away_from_zero : near_zero, u);
}
inline float gelu_tanh(float u) { return tanh_f32(u); }
inline double gelu_tanh(double u) { return std::tanh(u); }

// Elements per thread worth a hand-off to the pool (a few microseconds of work).
constexpr int64_t kGeluGrain = 16384;

// y = ½x(1 + t), t = tanh u                                                   y, t, x: (n)
template <class T>
void gelu_forward(T* y, T* t, const T* x, int64_t n) {
  parallel_for(n, kGeluGrain, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T xi = x[i];
      const T ti = gelu_tanh(T(kGeluC) * (xi + T(kGeluA) * xi * xi * xi));
      t[i] = ti;
      y[i] = T(0.5) * xi * (1 + ti);
    }
  });
}

// out += f′(x) ⊙ in: the VJP with (out, in) = (x̄, ȳ), the JVP with (ẏ, ẋ).      out, x, t, in: (n)
template <class T>
void gelu_derivative(T* out, const T* x, const T* t, const T* in, int64_t n) {
  parallel_for(n, kGeluGrain, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T xi = x[i], ti = t[i];
      const T du_dx = T(kGeluC) * (1 + 3 * T(kGeluA) * xi * xi);
      out[i] += (T(0.5) * (1 + ti) + T(0.5) * xi * (1 - ti * ti) * du_dx) * in[i];
    }
  });
}

}  // namespace

Var gelu(Var x) {
  constexpr const char* op = "gelu";
  expect_float(op, x);
  Tape& tape = x.tape();
  const Tensor xv = x.value();
  Tensor y = tape.empty(x.dtype(), x.shape());
  Tensor t = tape.empty(x.dtype(), x.shape());
  const int64_t n = y.numel();
  dispatch_float(op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    gelu_forward(y.data<T>(), t.data<T>(), xv.data<T>(), n);
  });
  auto apply_derivative = [xv, t, n](const Tensor& out, const Tensor& in) {
    dispatch_float(op, out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      gelu_derivative(out.data<T>(), xv.data<T>(), t.data<T>(), in.data<T>(), n);
    });
  };
  return tape.record(
      op, {x}, y, [=](const Tensor& g, std::span<const Tensor> gin) { apply_derivative(gin[0], g); },
      [=](std::span<const Tensor> tin, const Tensor& ty) { apply_derivative(ty, tin[0]); });
}

Var exp(Var x) { return pointwise(x, Exp{}); }
Var log(Var x) { return pointwise(x, Log{}); }
Var tanh(Var x) { return pointwise(x, Tanh{}); }
Var relu(Var x) { return pointwise(x, Relu{}); }
Var elu(Var x, double alpha) { return pointwise(x, Elu{alpha}); }

void register_pointwise(Registry& r) {
  auto unary = [&r](const char* name, const char* equation, Fill fill, Var (*fn)(Var)) {
    r.add({name, "pointwise", equation, {}});
    r.add_case(name, {"matrix", {{"x", {4, 5}, fill}}, [fn](Tape&, std::span<const Var> x) { return fn(x[0]); }});
  };
  unary("exp", "x̄ += y·ȳ; ẏ = y·ẋ", Fill::normal, exp);
  unary("log", "x̄ += ȳ/x; ẏ = ẋ/x", Fill::positive, log);
  unary("tanh", "x̄ += (1 − y²)·ȳ; ẏ = (1 − y²)·ẋ", Fill::normal, tanh);
  unary("relu", "x̄ += [x > 0]·ȳ; ẏ = [x > 0]·ẋ", Fill::away_from_zero, relu);
  unary("gelu", "x̄ += gelu′(x)·ȳ with gelu′ of the tanh form; ẏ = gelu′(x)·ẋ", Fill::normal, gelu);
  r.add({"elu", "pointwise", "x̄ += ȳ (x > 0), (y + α)·ȳ (x ≤ 0); ẏ likewise", {}});
  r.add_case("elu", {"alpha = 1", {{"x", {4, 5}, Fill::away_from_zero}},
                     [](Tape&, std::span<const Var> x) { return elu(x[0]); }});
  r.add_case("elu", {"alpha = 0.5", {{"x", {3, 3}, Fill::away_from_zero}},
                     [](Tape&, std::span<const Var> x) { return elu(x[0], 0.5); }});
}

}  // namespace tapegrad
