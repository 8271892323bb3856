// exp and tanh for float32 kernels, without a libm call and without branches, so that the loops that call them
// vectorize (the library builds with -O3 and no trapping math). The float64 overloads are the standard ones:
// float64 is the gradchecker's precision and stays on libm.
//
// exp(z) = 2ⁿ·exp(r),  n = round(z/ln 2),  r = z − n·ln 2 ∈ [−ln 2/2, ln 2/2]
//   ln 2 is split into a high part with 16 significant bits and a low part, so n·ln2_hi is exact and r carries
//   no cancellation error; exp(r) is a degree-6 polynomial fitted to exp on that interval (relative error 1e-7);
//   2ⁿ is built in the exponent bits. z is clamped to [−87.3, 88] (n ∈ [−126, 127]); the result is 0 below
//   (exp(−87.3) is about the smallest normal float: what is lost is below 1.2e-38) and +∞ above exp(88) =
//   1.65e38 (the kernels call it on z ≤ 0: softmax rows, log-sum-exp, tanh); NaN stays NaN. Error at most
//   1.4 ulp on [−87.3, 88] (every 7th float checked against double exp).
//
// tanh(u):
//   |u| < 0.625   tanh u = u·P(u²), P of degree 5 fitted to tanh(u)/u on [0, 0.625²]
//   |u| ≥ 0.625   tanh |u| = (1 − e)/(1 + e) with e = exp(−2|u|) ≤ 0.29, so 1 − e does not cancel; |u| is
//                 clamped at 9, where tanh is 1 in float32
//   Error at most 1.6 ulp over every positive float (checked exhaustively against double tanh); tanh(±∞) = ±1,
//   NaN stays NaN.
//
// Row reductions Σ_j a_j, Σ_j a_j·b_j and max_j a_j, in eight independent lanes: element j < 8⌊n/8⌋ goes to lane
// j mod 8, the rest to lane 0, and the lanes are combined pairwise at the end. The additions of a row no longer
// wait on each other (the loop vectorizes), and the order of the sum is fixed by n alone, so the result is the
// same in every run.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "float_pack.hpp"

namespace tapegrad {

namespace fast_math_detail {

constexpr float kExpLow = -87.3f, kExpHigh = 88.0f;  // the clamp of z

// 2ⁿ·exp(r) for z already in the clamped range. V is float, or a FloatPack (ops/float_pack.hpp): the same
// operations on each lane.
template <class V>
TAPEGRAD_PACK_INLINE V exp_reduced(V z) {
  constexpr float kRound = 12582912.0f;  // 1.5·2²³: adding it rounds z/ln 2 to an integer in the low mantissa bits
  const V shifted = z * 1.44269504089f + kRound;
  const auto n = float_bits(shifted) - std::bit_cast<int32_t>(kRound);
  const V nf = shifted - kRound;
  const V r = (z - nf * 0.693145751953125f) - nf * 1.428606765330187e-06f;
  const V exp_r =
      1.0f + r * (1.0f + r * (0.49999991059f +
                              r * (0.16666419804f + r * (0.04166822508f + r * (0.00837481674f + r * 0.00138369261f)))));
  return exp_r * bits_float((n + 127) << 23);  // 2ⁿ, n ∈ [−126, 127]
}

}  // namespace fast_math_detail

inline float fast_exp(float z) {
  using namespace fast_math_detail;
  const float c = z > kExpHigh ? kExpHigh : (z < kExpLow ? kExpLow : z);  // NaN passes through
  const float e = exp_reduced(c);
  return z < kExpLow ? 0.0f : (z > kExpHigh ? INFINITY : e);
}
inline double fast_exp(double z) { return std::exp(z); }

// fast_exp(z) for z ≤ 0 or NaN (a Gaussian's exp(−x²/2)), without the upper clamp that such z never reach: the
// same bits, two vector operations fewer of about twenty. V is float or a FloatPack (double: the overload below).
template <class V>
TAPEGRAD_PACK_INLINE V fast_exp_nonpositive(V z) {
  using namespace fast_math_detail;
  const auto below = z < kExpLow;
  const V e = exp_reduced(select(below, V(kExpLow), z));  // NaN passes through
  return select(below, V(0.0f), e);
}
inline double fast_exp_nonpositive(double z) { return std::exp(z); }

inline float fast_tanh(float u) {
  const float a = std::fabs(u);
  const float w = a * a;
  const float near_zero =
      a * (1.0f + w * (-0.33333259821f +
                       w * (0.13331127167f + w * (-0.05372107029f + w * (0.02059099264f + w * -0.00565999281f)))));
  const float e = fast_math_detail::exp_reduced(-2.0f * (a < 9.0f ? a : 9.0f));
  const float away_from_zero = (1.0f - e) / (1.0f + e);
  return std::copysign(a >= 0.625f ? away_from_zero : near_zero, u);  // NaN takes the first branch
}
inline double fast_tanh(double u) { return std::tanh(u); }

// 1 − |tanh u|, without taking it from tanh u: where |tanh u| is near 1 its rounding (a few units of 2⁻²⁴ in
// float32) would be most of the difference. |u| < 0.625: 1 − |t| ≥ 0.44 from the polynomial's t, no cancellation;
// else 2e/(1 + e), e = exp(−2|u|) (1 − t = 2e/(1 + e) for t = (1 − e)/(1 + e)), accurate to a few units of
// rounding however small it is. NaN stays NaN.
template <class T>
inline T tanh_complement(T u) {
  const T a = std::fabs(u);
  if (!(a >= T(0.625))) return 1 - std::fabs(fast_tanh(u));
  const T e = fast_exp_nonpositive(-2 * a);
  return 2 * e / (1 + e);
}

// The functions below are inlined (lanes_at always): GCC's note that a 64-byte vector returned by value changes the
// ABI without AVX-512 (float64's eight lanes) concerns no call that is made.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
// N lanes of T as one vector (GCC's and Clang's vector extensions; float32 or float64), and N of them read from p.
template <class T, int N>
struct LaneVectorOf;
template <int N>
struct LaneVectorOf<float, N> {
  typedef float type __attribute__((vector_size(N * sizeof(float))));
};
template <int N>
struct LaneVectorOf<double, N> {
  typedef double type __attribute__((vector_size(N * sizeof(double))));
};
template <class T, int N = 8>
using LaneVector = typename LaneVectorOf<T, N>::type;
template <class T, int N = 8>
TAPEGRAD_PACK_INLINE LaneVector<T, N> lanes_at(const T* p) {
  LaneVector<T, N> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// A vector's eight lanes added in pairs, lane 0 given as s0 (with the row's tail added to it): the rule's last step.
template <class T>
TAPEGRAD_PACK_INLINE T combine_lanes(const LaneVector<T>& s, T s0) {
  return ((s0 + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// Σ_j a_j (lane_sum_rows) and Σ_j a_j·b_j (lane_dot_rows) of R rows at once, rows ld apart, by the header's rule:
// each row's eight lanes are one vector of eight, element j < 8⌊n/8⌋ added to lane j mod 8 in order, the tail to
// lane 0, the lanes combined in pairs. A row's sum is a chain of n/8 dependent additions; the R rows' chains advance
// side by side, where one row after another would wait on each. A row's sum is the same whatever R is.
template <int R, class T>
TAPEGRAD_PACK_INLINE void lane_sum_rows(const T* a, int64_t ld, int64_t n, T (&out)[R]) {
  LaneVector<T> acc[R] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int r = 0; r < R; ++r) acc[r] += lanes_at(a + r * ld + j);
  for (int r = 0; r < R; ++r) {
    T s0 = acc[r][0];
    for (int64_t t = j; t < n; ++t) s0 += a[r * ld + t];
    out[r] = combine_lanes(acc[r], s0);
  }
}
template <int R, class T>
TAPEGRAD_PACK_INLINE void lane_dot_rows(const T* a, int64_t lda, const T* b, int64_t ldb, int64_t n, T (&out)[R]) {
  LaneVector<T> acc[R] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int r = 0; r < R; ++r) acc[r] += lanes_at(a + r * lda + j) * lanes_at(b + r * ldb + j);
  for (int r = 0; r < R; ++r) {
    T s0 = acc[r][0];
    for (int64_t t = j; t < n; ++t) s0 += a[r * lda + t] * b[r * ldb + t];
    out[r] = combine_lanes(acc[r], s0);
  }
}

// One row: lane_sum_rows and lane_dot_rows of R = 1.
template <class T>
inline T lane_sum(const T* a, int64_t n) {
  T out[1];
  lane_sum_rows<1>(a, 0, n, out);
  return out[0];
}
template <class T>
inline T lane_dot(const T* a, const T* b, int64_t n) {
  T out[1];
  lane_dot_rows<1>(a, 0, b, 0, n, out);
  return out[0];
}

// max(init, max_j a_j); a NaN entry is skipped (as by a > m ? a : m). The header's eight lanes are one vector here:
// written as eight named scalars, the selects are not vectorized by GCC (docs/performance.md, "What the kernels'
// structure bought").
template <class T>
inline T lane_max(const T* a, int64_t n, T init) {
  auto keep = [](T x, T m) { return x > m ? x : m; };
  LaneVector<T> s;
  for (int lane = 0; lane < 8; ++lane) s[lane] = init;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const LaneVector<T> x = lanes_at(a + j);
    s = x > s ? x : s;
  }
  T s0 = s[0];
  for (; j < n; ++j) s0 = keep(a[j], s0);
  return keep(keep(keep(s[1], s0), keep(s[3], s[2])), keep(keep(s[5], s[4]), keep(s[7], s[6])));
}

#pragma GCC diagnostic pop

}  // namespace tapegrad
