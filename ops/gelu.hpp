// GELU kernels in both forms over raw buffers of n elements: the gelu and gelu_erf nodes (ops/gelu.cpp) and the
// fused MLP (mlp.cpp) call them. Each form saves one tensor s beside x in the forward, so that its derivative
// needs no second tanh or erf.
//
// The exact form, GELU(x) = x·Φ(x), Φ the standard normal CDF (PyTorch's nn.GELU(), nanoGPT's MLP):
//   y = x·Φ(x),   Φ(x) = ½ erfc(−x/√2),   φ(x) = Φ′(x) = exp(−x²/2)/√(2π)
//   f′(x) = Φ(x) + x·φ(x)                                              (product rule; s = Φ(x) is saved)
//   f″(x) = 2φ(x) + x·φ′(x) = (2 − x²)·φ(x)                            (φ′(x) = −x·φ(x))
// float64 takes erfc from libm. float32 takes it from a Chebyshev fit of Numerical Recipes (Press et al., 2nd ed.,
// § 6.2): erfc(z) = τ·exp(−z² + P(τ)), τ = 1/(1 + z/2), z ≥ 0, P of degree 9, relative error below 1.2e-7 for
// every z ≥ 0. Φ(x) is ½erfc(|x|/√2) for x < 0 and 1 − ½erfc(|x|/√2) for x ≥ 0, so it never subtracts two numbers
// close to each other; in float32, y = x·Φ(x) is within 5e-7 of float64's, relative, for every x with Φ(x) above
// 1e-30 (ops_pointwise_test measures it).
//
// GPT-2's tanh form, an approximation of the exact one (within 5e-4 of it), kept for models trained with it:
//   y = ½x(1 + t),   t = tanh u,   u = √(2/π)(x + 0.044715x³)
//   f′(x) = ½(1 + t) + ½x(1 − t²)·√(2/π)(1 + 3·0.044715x²)          (dt/du = 1 − t², du/dx = √(2/π)(1 + 3·0.044715x²))
// The saved s is the complement c = 1 − |t| (ops/fast_math.hpp's tanh_complement), and t's sign is x's (u is odd
// and increasing in x): then 1 + t = 2 − c for x ≥ 0 and c below, and 1 − t² = c(2 − c), none of them a difference
// of numbers near 1. Saving t instead, its float32 rounding near |t| = 1 (about 2⁻²⁴ absolute) became most of
// 1 ± t: a relative error of 2⁻²⁴/c in f′ and y where the pre-activation is large, which `tapegrad gradcheck
// --precision f32` showed as 1.3-2.2 times what rounding explains on the fused MLP. float32 takes tanh and exp
// from ops/fast_math.hpp (≤ 1.6 ulp, vectorized), float64 from libm.
//
// The elements run on the engine's threads; the branch on the form sits outside each loop. The kernels are
// compiled once, in the library (ops/gelu.cpp). On a CPU with AVX-512 the float32 loops run a second copy of
// themselves, compiled for it (GCC's target attribute), 16 floats to a vector instead of x86-64-v3's 8: the same
// operations in the same order, each correctly rounded, and no contraction into FMA (the library builds with
// -ffp-contract=off; ISO C++ mode has it off too), so every bit is the same. All 2³² float32 inputs gave the same
// y, s, f′ and f″ from both copies, in both forms; ops_pointwise_test checks every 997th. The exps skip the clamps
// that normal_tail and normal_pdf never reach (fast_exp_nonpositive, exp_reduced: the same bits), and the exact
// form's loops take eight vectors at a time (ops/float_pack.hpp: 128 floats in the AVX-512 copy, 64 in the portable
// one), so that the long chains of its erfc and exps interleave instead of waiting on each other: the same bits as
// one element at a time (ops_pointwise_test). What each of these bought, measured: docs/performance.md, "What the
// kernels' structure bought".
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

#include "../engine/parallel.hpp"
#include "fast_math.hpp"
#include "float_pack.hpp"

namespace tapegrad {

// Which GELU: exact (x·Φ(x)) or GPT-2's tanh approximation.
enum class GeluForm { exact, tanh };

inline const char* gelu_form_name(GeluForm form) { return form == GeluForm::exact ? "exact" : "tanh"; }
inline std::optional<GeluForm> gelu_form_named(std::string_view name) {
  if (name == "exact") return GeluForm::exact;
  if (name == "tanh") return GeluForm::tanh;
  return std::nullopt;
}

// Which copy of the float32 loops runs: best (AVX-512 where the CPU has it) or portable (the library's own
// flags). Both give the same bits; tests compare them.
enum class GeluSimd { best, portable };

// The AVX-512 copy: x86-64 under GCC or Clang, on a CPU (and OS) with AVX-512 F, DQ, BW and VL, checked once; only
// in a library built for x86-64-v3 (__FMA__), which CMakeLists.txt builds with -ffp-contract=off: both copies could
// then use FMA and neither does. (Built for plain x86-64, the portable copy has no FMA and the AVX-512 one, under
// Clang's default -ffp-contract=on, would.) prefer-vector-width=512 asks GCC for 512-bit vectors under any -mtune
// (Skylake-AVX512's prefers 256).
#if defined(__x86_64__) && defined(__FMA__) && (defined(__GNUC__) || defined(__clang__))
#if defined(__clang__)
#define TAPEGRAD_GELU_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl")))
#else
#define TAPEGRAD_GELU_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,prefer-vector-width=512")))
#endif
#define TAPEGRAD_GELU_INLINE __attribute__((always_inline))
#define TAPEGRAD_GELU_HAS_AVX512 1
#else
#define TAPEGRAD_GELU_AVX512
#define TAPEGRAD_GELU_INLINE
#define TAPEGRAD_GELU_HAS_AVX512 0
#endif

// Whether the float32 kernels take their AVX-512 copy (GeluSimd::best) on this CPU: false where the library was
// built without one.
bool gelu_runs_avx512();

namespace gelu_detail {
constexpr double kC = 0.7978845608028654;  // √(2/π)
constexpr double kA = 0.044715;
constexpr double kSqrtHalf = 0.7071067811865476;    // 1/√2
constexpr double kInvSqrt2Pi = 0.3989422804014327;  // 1/√(2π)
constexpr int64_t kGrain = 16384;                   // elements per range: a few microseconds of work

// Φ(−a) = ½ erfc(z), z = a/√2, for a ≥ 0 (float32, the fit of the header). The fit's exp(−z² + P) is taken as
// exp(−a_h²/2)·exp(−(a − a_h)(a + a_h)/2 + P), a_h = a with its 12 low mantissa bits cleared: a_h² is exact in
// float32, so neither the rounding of a/√2 nor that of a² is amplified by the exp (each would cost up to 1e-5 of
// the result near a = 11, where Φ(−a) is 1e-30). a is clamped at 14, where Φ(−a) is below float32's range (and
// NaN goes to the clamp, its y staying NaN through y = x·Φ). The first exp's argument is ≤ 0, the second's within
// [−1.2, 0] (P ∈ [−1.09, 3e-8] for a ∈ [0, 14], and 0 ≤ (a − a_h)(a + a_h) < 2⁻¹¹a·2a ≤ 0.2): neither reaches
// fast_exp's upper clamp, the second not its lower one either, and leaving them out is the same bits for a
// fifth less of the loop (one thread of an AMD EPYC Zen 5, 768 × 512 elements: 0.81 → 0.65 ms).
// V is float or a FloatPack (ops/float_pack.hpp): the same operations on each lane.
template <class V>
TAPEGRAD_PACK_INLINE V normal_tail(V a) {
  a = select(a < 14.0f, a, V(14.0f));
  const V tau = 1.0f / (1.0f + 0.5f * static_cast<float>(kSqrtHalf) * a);
  const V p =
      -1.26551223f +
      tau * (1.00002368f +
             tau * (0.37409196f +
                    tau * (0.09678418f +
                           tau * (-0.18628806f +
                                  tau * (0.27886807f +
                                         tau * (-1.13520398f +
                                                tau * (1.48851587f + tau * (-0.82215223f + tau * 0.17087277f))))))));
  const V a_h = bits_float(float_bits(a) & ~int32_t{0xFFF});
  return 0.5f * tau * fast_exp_nonpositive(-0.5f * a_h * a_h) *
         fast_math_detail::exp_reduced(-0.5f * (a - a_h) * (a + a_h) + p);
}

// Φ(x) = ½ erfc(−x/√2)
template <class V>
TAPEGRAD_PACK_INLINE V normal_cdf(V x) {
  const V tail = normal_tail(magnitude(x));  // Φ(−|x|)
  return select(x < 0.0f, tail, 1.0f - tail);
}
inline double normal_cdf(double x) { return 0.5 * std::erfc(-x * kSqrtHalf); }

// φ(x) = exp(−x²/2)/√(2π)
template <class T>
TAPEGRAD_PACK_INLINE T normal_pdf(T x) {
  using Scalar = std::conditional_t<std::is_same_v<T, double>, double, float>;  // a FloatPack's lanes are float
  return T(static_cast<Scalar>(kInvSqrt2Pi)) * fast_exp_nonpositive(T(-0.5f) * x * x);
}

// The tanh form's 1 + t, t and 1 − t² from x and the saved c = 1 − |t|.
template <class T>
inline T one_plus_tanh(T x, T c) {
  return x >= 0 ? 2 - c : c;
}
template <class T>
inline T tanh_of(T x, T c) {
  return std::copysign(1 - c, x);
}
template <class T>
inline T one_minus_tanh_squared(T c) {
  return c * (2 - c);
}

// f′(x) from x and the saved s (c = 1 − |tanh u|, or Φ(x)).
template <GeluForm F, class T>
TAPEGRAD_PACK_INLINE T slope(T x, T s) {
  if constexpr (F == GeluForm::exact) {
    return s + x * normal_pdf(x);
  } else {
    const T du_dx = T(kC) * (1 + 3 * T(kA) * x * x);
    return T(0.5) * one_plus_tanh(x, s) + T(0.5) * x * one_minus_tanh_squared(s) * du_dx;
  }
}

// f″(x) from x and the saved s (second order, Tape::hvp):
//   exact  f″ = (2 − x²)·φ(x)
//   tanh   f″ = (1 − t²)·(u′ − x·t·u′² + ½x·u″),  u′ = √(2/π)(1 + 3·0.044715x²),  u″ = 6·√(2/π)·0.044715x
//          (f′ = ½(1 + t) + ½x·t′ with t′ = (1 − t²)u′, t″ = (1 − t²)(u″ − 2t·u′²); f″ = t′ + ½x·t″)
template <GeluForm F, class T>
inline T curvature(T x, T s) {
  if constexpr (F == GeluForm::exact) {
    return (2 - x * x) * normal_pdf(x);
  } else {
    const T du = T(kC) * (1 + 3 * T(kA) * x * x), d2u = 6 * T(kC) * T(kA) * x;
    return one_minus_tanh_squared(s) * (du - x * tanh_of(x, s) * du * du + T(0.5) * x * d2u);
  }
}

// y from x and the saved s.
template <GeluForm F, class T>
TAPEGRAD_PACK_INLINE T value(T x, T s) {
  if constexpr (F == GeluForm::exact) return x * s;
  else return T(0.5) * x * one_plus_tanh(x, s);
}

// body.template operator()<F>() with the form as a compile-time constant, so that each loop has no branch on it.
template <class Body>
inline void with_form(GeluForm form, Body&& body) {
  if (form == GeluForm::exact) body.template operator()<GeluForm::exact>();
  else body.template operator()<GeluForm::tanh>();
}

// Whether a float32 loop takes whole FloatPacks of W-byte vectors before its last elements (ops/float_pack.hpp):
// the exact form, whose erfc and exp are long chains of dependent operations. (The tanh form's branch on |u| does
// not go into packs; W = 0: one element at a time.)
template <GeluForm F, class T, int W>
inline constexpr bool in_packs = F == GeluForm::exact&& std::is_same_v<T, float>&& W > 0;

// body.template operator()<V>(i) over [begin, end): at i, a FloatPack's worth of elements from there (V =
// FloatPack<W>) where the loop goes in packs, then one element at a time (V = T). Each loop below writes its
// element once, over V, with load_as and store_to (ops/float_pack.hpp).
template <GeluForm F, class T, int W, class Body>
TAPEGRAD_GELU_INLINE inline void for_elements(int64_t begin, int64_t end, const Body& body) {
  int64_t i = begin;
  if constexpr (in_packs<F, T, W>)
    for (; i + FloatPack<W>::kFloats <= end; i += FloatPack<W>::kFloats) body.template operator()<FloatPack<W>>(i);
  for (; i < end; ++i) body.template operator()<T>(i);
}

// y[i] = GELU(x[i]) and s[i] for i in [begin, end)
template <GeluForm F, int W, class T>
TAPEGRAD_GELU_INLINE inline void forward_elements(T* y, T* s, const T* x, int64_t begin, int64_t end) {
  for_elements<F, T, W>(begin, end, [=]<class V>(int64_t i) TAPEGRAD_GELU_INLINE {
    const V xi = load_as<V>(x + i);
    V si;
    if constexpr (F == GeluForm::exact) si = normal_cdf(xi);
    else si = tanh_complement(T(kC) * (xi + T(kA) * xi * xi * xi));
    store_to(s + i, si);
    store_to(y + i, value<F>(xi, si));
  });
}

// Each loop over [begin, end) is a lambda marked TAPEGRAD_GELU_INLINE, taking the vector width in bytes as its
// third argument (a std::integral_constant), so that it is compiled again inside run_avx512 below with 64-byte
// vectors, 16 floats to a vector instead of the library's 8.
template <int W>
using VectorBytes = std::integral_constant<int, W>;
template <class Loop>
TAPEGRAD_GELU_AVX512 void run_avx512(const Loop& loop, int64_t begin, int64_t end) {
  loop(begin, end, VectorBytes<64>{});
}

// loop(begin, end, width) over the ranges of [0, n) on the engine's threads, `grain` at least per range: float32
// on the AVX-512 copy where the CPU has it (and simd is best), everything else as compiled.
template <class T, class Loop>
void each_range(GeluSimd simd, int64_t n, int64_t grain, const Loop& loop) {
  if constexpr (std::is_same_v<T, float>)
    if (simd == GeluSimd::best && gelu_runs_avx512())
      return parallel_for(n, grain, [&](int64_t begin, int64_t end) { run_avx512(loop, begin, end); });
  parallel_for(n, grain, [&](int64_t begin, int64_t end) { loop(begin, end, VectorBytes<kPortableVectorBytes>{}); });
}
}  // namespace gelu_detail

// y = GELU(x), saving s (Φ(x), or c = 1 − |tanh u|)                                 y, s, x: (n)
template <class T>
void gelu_forward(GeluForm form, T* y, T* s, const T* x, int64_t n, GeluSimd simd = GeluSimd::best) {
  using namespace gelu_detail;
  with_form(form, [=]<GeluForm F>() {
    each_range<T>(simd, n, kGrain, [=](int64_t begin, int64_t end, auto width) TAPEGRAD_GELU_INLINE {
      forward_elements<F, decltype(width)::value>(y, s, x, begin, end);
    });
  });
}

// y = GELU(x) from the saved s                                                 y, x, s: (n)
template <class T>
void gelu_from_saved(GeluForm form, T* y, const T* x, const T* s, int64_t n, GeluSimd simd = GeluSimd::best) {
  using namespace gelu_detail;
  with_form(form, [=]<GeluForm F>() {
    each_range<T>(simd, n, kGrain, [=](int64_t begin, int64_t end, auto) TAPEGRAD_GELU_INLINE {
      for (int64_t i = begin; i < end; ++i) y[i] = value<F>(x[i], s[i]);
    });
  });
}

// out += f′(x) ⊙ in: the VJP with (out, in) = (x̄, ȳ), the JVP with (ẏ, ẋ).      out, x, s, in: (n)
template <class T>
void gelu_derivative(GeluForm form, T* out, const T* x, const T* s, const T* in, int64_t n,
                     GeluSimd simd = GeluSimd::best) {
  using namespace gelu_detail;
  with_form(form, [=]<GeluForm F>() {
    each_range<T>(simd, n, kGrain, [=](int64_t begin, int64_t end, auto width) TAPEGRAD_GELU_INLINE {
      for_elements<F, T, decltype(width)::value>(begin, end, [=]<class V>(int64_t i) TAPEGRAD_GELU_INLINE {
        store_to(out + i, load_as<V>(out + i) + slope<F>(load_as<V>(x + i), load_as<V>(s + i)) * load_as<V>(in + i));
      });
    });
  });
}

// v ← f′(x) ⊙ v in place (a cotangent or tangent carried through the gelu)      v, x, s: (n)
template <class T>
void gelu_derivative_in_place(GeluForm form, T* v, const T* x, const T* s, int64_t n, GeluSimd simd = GeluSimd::best) {
  using namespace gelu_detail;
  with_form(form, [=]<GeluForm F>() {
    each_range<T>(simd, n, kGrain, [=](int64_t begin, int64_t end, auto width) TAPEGRAD_GELU_INLINE {
      for_elements<F, T, decltype(width)::value>(begin, end, [=]<class V>(int64_t i) TAPEGRAD_GELU_INLINE {
        store_to(v + i, load_as<V>(v + i) * slope<F>(load_as<V>(x + i), load_as<V>(s + i)));
      });
    });
  });
}

// y = GELU(x) from the saved s, and v ← f′(x) ⊙ v, in one pass over x and s: the fused MLP's backward
// (mlp.cpp), which needs h for W̄₂ and ū = gelu′(u) ⊙ h̄.                        y, v, x, s: (n)
template <class T>
void gelu_value_and_derivative_in_place(GeluForm form, T* y, T* v, const T* x, const T* s, int64_t n,
                                        GeluSimd simd = GeluSimd::best) {
  using namespace gelu_detail;
  with_form(form, [=]<GeluForm F>() {
    each_range<T>(simd, n, kGrain, [=](int64_t begin, int64_t end, auto width) TAPEGRAD_GELU_INLINE {
      for_elements<F, T, decltype(width)::value>(begin, end, [=]<class V>(int64_t i) TAPEGRAD_GELU_INLINE {
        const V xi = load_as<V>(x + i), si = load_as<V>(s + i);
        store_to(y + i, value<F>(xi, si));
        store_to(v + i, load_as<V>(v + i) * slope<F>(xi, si));
      });
    });
  });
}

// out += f″(x) ⊙ tx ⊙ g: the second-order term of x̄ = f′(x)·ȳ along ẋ (Tape::hvp).   out, x, s, tx, g: (n)
template <class T>
void gelu_curvature(GeluForm form, T* out, const T* x, const T* s, const T* tx, const T* g, int64_t n,
                    GeluSimd simd = GeluSimd::best) {
  using namespace gelu_detail;
  with_form(form, [=]<GeluForm F>() {
    each_range<T>(simd, n, kGrain, [=](int64_t begin, int64_t end, auto) TAPEGRAD_GELU_INLINE {
      for (int64_t i = begin; i < end; ++i) out[i] += curvature<F>(x[i], s[i]) * tx[i] * g[i];
    });
  });
}

// x ← x + b (b added to every row; none if null), then y = GELU(x) saving s                 y, s, x: (rows, cols)
// The fused MLP's first bias and gelu (mlp.cpp) in one pass over its pre-activation, by rows across the threads:
// each row gets its bias (the same single rounding as add_rows) just before its gelu, while it is in the L1 cache,
// rather than in a serial pass of its own. The backward's b̄₁ += Σ_rows ū fused with ū = gelu′ ⊙ h̄ the same way (by
// blocks of columns, so that each b̄₁ⱼ keeps its order of rows) was slower, so mlp.cpp keeps two passes there
// (docs/performance.md, "What the kernels' structure bought").
template <class T>
void gelu_forward_biased(GeluForm form, T* y, T* s, T* x, const T* b, int64_t rows, int64_t cols,
                         GeluSimd simd = GeluSimd::best) {
  using namespace gelu_detail;
  with_form(form, [=]<GeluForm F>() {
    each_range<T>(simd, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)),
                  [=](int64_t r0, int64_t r1, auto width) TAPEGRAD_GELU_INLINE {
                    for (int64_t r = r0; r < r1; ++r) {
                      T* xr = x + r * cols;
                      if (b)
                        for (int64_t j = 0; j < cols; ++j) xr[j] += b[j];
                      forward_elements<F, decltype(width)::value>(y + r * cols, s + r * cols, xr, 0, cols);
                    }
                  });
  });
}

// The kernels are compiled once, in the library (ops/gelu.cpp), with its flags: every caller runs the same code.
#define TAPEGRAD_GELU_KERNELS(how, T)                                                                      \
  how void gelu_forward<T>(GeluForm, T*, T*, const T*, int64_t, GeluSimd);                                 \
  how void gelu_from_saved<T>(GeluForm, T*, const T*, const T*, int64_t, GeluSimd);                        \
  how void gelu_derivative<T>(GeluForm, T*, const T*, const T*, const T*, int64_t, GeluSimd);              \
  how void gelu_derivative_in_place<T>(GeluForm, T*, const T*, const T*, int64_t, GeluSimd);               \
  how void gelu_value_and_derivative_in_place<T>(GeluForm, T*, T*, const T*, const T*, int64_t, GeluSimd); \
  how void gelu_curvature<T>(GeluForm, T*, const T*, const T*, const T*, const T*, int64_t, GeluSimd);     \
  how void gelu_forward_biased<T>(GeluForm, T*, T*, T*, const T*, int64_t, int64_t, GeluSimd);
TAPEGRAD_GELU_KERNELS(extern template, float)
TAPEGRAD_GELU_KERNELS(extern template, double)

}  // namespace tapegrad
