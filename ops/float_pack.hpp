// FloatPack<W>: kPackVectors vectors of W bytes (W/4 floats each) held as one value, for element-wise kernels whose
// work per element is a long chain of dependent operations (ops/gelu.hpp's erfc and exp: two polynomials, a
// division, two exps, about ninety vector operations).
//
// Why. A loop that takes one vector per iteration gives the CPU one chain at a time in program order: each step
// waits for the one before it (3-4 cycles of latency), and the next iteration's chain reaches the scheduler only
// once this one's ninety operations have been dispatched. An operation on a FloatPack applies to its eight vectors
// one after another, so eight independent chains advance side by side and the units stay busy. One thread of an
// AMD EPYC Zen 5, the exact GELU's forward on 393,216 floats (the default model's MLP): 0.30 ms one AVX-512 vector
// at a time, 0.27 / 0.24 / 0.21 / 0.20 ms with 3 / 4 / 6 / 8 vectors a pack; the x86-64-v3 copy (AVX2) 0.63 ms one
// vector at a time, 0.52 ms with eight 32-byte vectors a pack (and 1.4 ms with 64-byte vectors, which GCC splits in
// two badly), so each copy takes packs of its own vector width.
//
// The same bits. Each lane of a pack gets exactly the operations the float code gives that element, in the same
// order, each correctly rounded (IEEE), and nothing is contracted into FMA (the library builds with
// -ffp-contract=off): a kernel written once over a value type V (float or FloatPack<W>) gives the same bits either
// way, and tests/ops_pointwise_test.cpp compares every 997th float32 bit pattern.
//
// GCC's and Clang's vector extensions (vector_size): a comparison gives a mask of int32 lanes (−1 true, 0 false).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

// Every function here is inlined into its caller (always_inline), so GCC's note that a 64-byte vector passed by
// value changes the ABI without AVX-512 concerns no call that is made.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace tapegrad {

inline constexpr int kPackVectors = 8;

// The vector width of the library's own flags (x86-64-v3: AVX2, 32 bytes); an AVX-512 copy of a kernel asks for 64.
#if defined(__AVX__)
inline constexpr int kPortableVectorBytes = 32;
#else
inline constexpr int kPortableVectorBytes = 16;
#endif

#define TAPEGRAD_PACK_INLINE __attribute__((always_inline)) inline

template <int W>
struct IntPack {
  typedef int32_t Vector __attribute__((vector_size(W)));
  Vector v[kPackVectors];
};

template <int W>
struct FloatPack {
  typedef float Vector __attribute__((vector_size(W)));
  static constexpr int64_t kFloats = kPackVectors * W / 4;
  Vector v[kPackVectors];

  FloatPack() = default;
  TAPEGRAD_PACK_INLINE explicit FloatPack(float c) {
    for (int k = 0; k < kPackVectors; ++k) {
      Vector lane = {};
      v[k] = lane + c;  // c in every lane (0 + c is c for every c but −0, which no caller passes)
    }
  }
  TAPEGRAD_PACK_INLINE static FloatPack load(const float* p) {
    FloatPack r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
  }
  TAPEGRAD_PACK_INLINE void store(float* p) const { std::memcpy(p, v, sizeof v); }
};

// Element-wise arithmetic, pack with pack or with a float on either side.
#define TAPEGRAD_PACK_OPERATOR(op)                                                              \
  template <int W>                                                                              \
  TAPEGRAD_PACK_INLINE FloatPack<W> operator op(const FloatPack<W>& a, const FloatPack<W>& b) { \
    FloatPack<W> r;                                                                             \
    for (int k = 0; k < kPackVectors; ++k) r.v[k] = a.v[k] op b.v[k];                           \
    return r;                                                                                   \
  }                                                                                             \
  template <int W>                                                                              \
  TAPEGRAD_PACK_INLINE FloatPack<W> operator op(const FloatPack<W>& a, float b) {               \
    FloatPack<W> r;                                                                             \
    for (int k = 0; k < kPackVectors; ++k) r.v[k] = a.v[k] op b;                                \
    return r;                                                                                   \
  }                                                                                             \
  template <int W>                                                                              \
  TAPEGRAD_PACK_INLINE FloatPack<W> operator op(float a, const FloatPack<W>& b) {               \
    FloatPack<W> r;                                                                             \
    for (int k = 0; k < kPackVectors; ++k) r.v[k] = a op b.v[k];                                \
    return r;                                                                                   \
  }
TAPEGRAD_PACK_OPERATOR(+)
TAPEGRAD_PACK_OPERATOR(-)
TAPEGRAD_PACK_OPERATOR(*)
TAPEGRAD_PACK_OPERATOR(/)
#undef TAPEGRAD_PACK_OPERATOR

// a < b lane by lane: a mask (NaN compares false, as for floats).
template <int W>
TAPEGRAD_PACK_INLINE IntPack<W> operator<(const FloatPack<W>& a, float b) {
  IntPack<W> r;
  for (int k = 0; k < kPackVectors; ++k) r.v[k] = a.v[k] < b;
  return r;
}

// mask ? a : b, lane by lane.
template <int W>
TAPEGRAD_PACK_INLINE FloatPack<W> select(const IntPack<W>& mask, const FloatPack<W>& a, const FloatPack<W>& b) {
  FloatPack<W> r;
  for (int k = 0; k < kPackVectors; ++k) r.v[k] = mask.v[k] ? a.v[k] : b.v[k];
  return r;
}

// The bits of each lane as an int32, and back; int32 arithmetic on them.
template <int W>
TAPEGRAD_PACK_INLINE IntPack<W> float_bits(const FloatPack<W>& a) {
  IntPack<W> r;
  for (int k = 0; k < kPackVectors; ++k) r.v[k] = std::bit_cast<typename IntPack<W>::Vector>(a.v[k]);
  return r;
}
template <int W>
TAPEGRAD_PACK_INLINE FloatPack<W> bits_float(const IntPack<W>& a) {
  FloatPack<W> r;
  for (int k = 0; k < kPackVectors; ++k) r.v[k] = std::bit_cast<typename FloatPack<W>::Vector>(a.v[k]);
  return r;
}

// Integer lanes (the bits of a FloatPack): +, − and & by a constant, << by a count.
#define TAPEGRAD_INT_PACK_OPERATOR(op, Rhs)                                 \
  template <int W>                                                          \
  TAPEGRAD_PACK_INLINE IntPack<W> operator op(const IntPack<W>& a, Rhs b) { \
    IntPack<W> r;                                                           \
    for (int k = 0; k < kPackVectors; ++k) r.v[k] = a.v[k] op b;            \
    return r;                                                               \
  }
TAPEGRAD_INT_PACK_OPERATOR(+, int32_t)
TAPEGRAD_INT_PACK_OPERATOR(-, int32_t)
TAPEGRAD_INT_PACK_OPERATOR(<<, int)
TAPEGRAD_INT_PACK_OPERATOR(&, int32_t)
#undef TAPEGRAD_INT_PACK_OPERATOR

// The float counterparts, so that a kernel written over V compiles for V = float too.
TAPEGRAD_PACK_INLINE float select(bool mask, float a, float b) { return mask ? a : b; }
TAPEGRAD_PACK_INLINE int32_t float_bits(float a) { return std::bit_cast<int32_t>(a); }
TAPEGRAD_PACK_INLINE float bits_float(int32_t a) { return std::bit_cast<float>(a); }

// A V (a FloatPack or the element type T itself) from the elements at p, and back: a loop body written once over V.
template <class V, class T>
TAPEGRAD_PACK_INLINE V load_as(const T* p) {
  if constexpr (std::is_same_v<V, T>) return *p;
  else return V::load(p);
}
template <class T>
TAPEGRAD_PACK_INLINE void store_to(T* p, T v) {
  *p = v;
}
template <int W>
TAPEGRAD_PACK_INLINE void store_to(float* p, const FloatPack<W>& v) {
  v.store(p);
}

// |a|: the sign bit cleared (for floats what std::fabs does).
template <class V>
TAPEGRAD_PACK_INLINE V magnitude(const V& a) {
  return bits_float(float_bits(a) & 0x7FFFFFFF);
}

}  // namespace tapegrad

#pragma GCC diagnostic pop
