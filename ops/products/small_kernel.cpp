// The engine's own product kernel, on AVX-512: float32 tiles, and bf16 tiles on AVX512_BF16 (below the float32 ones)
// (ops/products/products.hpp and small_products.hpp say when each runs).
// This file is compiled for AVX-512 (CMakeLists.txt) and called only on a CPU that has it; it uses no inline
// function or template of external linkage (its own are in an anonymous namespace), so no code made for AVX-512
// can stand in, at link time, for a copy another file made for a CPU without it.
//
// C (m, n) = α·op(A)·P + β·C, with op(A)[i, p] = a[i·a_row + p·a_col] (as is: (lda, 1), transposed: (1, lda)) and
// P = op(B) packed (ops/products/small_products.cpp): (k, ·) rows of ld floats, zero from column n to the next
// multiple of 16.
//
// C goes in tiles of R rows × V vectors of 16 floats. For a tile, with its accumulators in registers,
//   for p = 0 … k−1:   acc[r][v] = fma(op(A)[i0 + r, p], P[p, j0 + 16v : j0 + 16(v + 1)], acc[r][v])
// so every element of C is one running sum over p in the order 0 … k−1, then C = α·acc (+ β·C where β ≠ 0). That
// order depends on nothing but k: a product gives the same bits in every run, on any thread, whatever the rows
// around it.
// R × V accumulators, V ≤ 4 vectors (64 columns), P's V vectors of row p and one broadcast of op(A) stay within
// AVX-512's 32 registers: R = 6 rows for V = 4 (24 accumulators; each p costs 4 loads and 6 broadcasts for 24
// FMAs), R = 8 for V ≤ 3, so that the 32- and 64-row blocks of attention go in whole tiles (with 6 rows, a 32-row
// block ended in a tile of 2 that ran at a third of the pace). How C is cut into tiles changes no element's sum.
#include "ops/products/small_products.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)

// GCC 12 says the unpack intrinsics (transpose_16x16) read an uninitialized vector: its header passes an
// undefined one as the source of lanes its mask never selects. Nothing reads it; the warning is silenced there.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

namespace {

// The rows of a tile of V vectors.
constexpr int64_t tile_rows_for(int64_t vectors) { return vectors >= 4 ? 6 : 8; }
constexpr int kMaxVectors = 4;
constexpr int64_t kWidth = 16;

__mmask16 first_lanes(int64_t count) { return static_cast<__mmask16>((1u << count) - 1u); }

// C's tile from its R × V sums: C = α·sum + β·C on the tile's rows, its columns before n (β = 0: C is not read).
template <int R, int V>
inline void store_tile(const __m512 (&acc)[R][V], int64_t n, int64_t j0, float alpha, float beta, float* c,
                       int64_t ldc) {
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int v = 0; v < V; ++v) {
    const int64_t col = j0 + v * kWidth;
    const int64_t cols = n - col < kWidth ? n - col : kWidth;
    if (cols <= 0) break;
    const __mmask16 lanes = first_lanes(cols);
    for (int r = 0; r < R; ++r) {
      float* out = c + r * ldc + col;
      __m512 y = _mm512_mul_ps(va, acc[r][v]);
      if (beta != 0.0f) y = _mm512_add_ps(y, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(lanes, out)));
      _mm512_mask_storeu_ps(out, lanes, y);
    }
  }
}

// The float32 tile: k steps of one row of P (V vectors) and R broadcasts of op(A).
template <int R, int V>
struct FloatTile {
  static void run(int64_t k, int64_t n, int64_t j0, float alpha, const float* a, int64_t a_row, int64_t a_col,
                  const float* p_rows, int64_t ld, float beta, float* c, int64_t ldc) {
    __m512 acc[R][V];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
    for (int64_t p = 0; p < k; ++p) {
      __m512 b[V];
      for (int v = 0; v < V; ++v) b[v] = _mm512_loadu_ps(p_rows + p * ld + j0 + v * kWidth);
      for (int r = 0; r < R; ++r) {
        const __m512 x = _mm512_set1_ps(a[r * a_row + p * a_col]);
        for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(x, b[v], acc[r][v]);
      }
    }
    store_tile<R, V>(acc, n, j0, alpha, beta, c, ldc);
  }
};

// C's rows [row_begin, row_end) in tiles: column panels of up to 4 vectors, tile_rows_for(V) rows a tile and fewer at
// the end, each Tile<rows, V>::run(depth, n, j0, α, op(A)'s rows, a_row, a_col, P, ld, β, C's rows, ldc). `depth`
// is k, or its pairs for the bf16 tiles; A is float or its bf16 pairs, and so is P.
template <template <int, int> class Tile, int V, class A, class P>
inline void run_tile(int64_t rows, int64_t depth, int64_t n, int64_t j0, float alpha, const A* a, int64_t a_row,
                     int64_t a_col, const P* p_rows, int64_t ld, float beta, float* c, int64_t ldc) {
  switch (rows) {
    case 8:
      if constexpr (V <= 3) return Tile<8, V>::run(depth, n, j0, alpha, a, a_row, a_col, p_rows, ld, beta, c, ldc);
      [[fallthrough]];
    case 7:
      if constexpr (V <= 3) return Tile<7, V>::run(depth, n, j0, alpha, a, a_row, a_col, p_rows, ld, beta, c, ldc);
      [[fallthrough]];
    case 6: return Tile<6, V>::run(depth, n, j0, alpha, a, a_row, a_col, p_rows, ld, beta, c, ldc);
    case 5: return Tile<5, V>::run(depth, n, j0, alpha, a, a_row, a_col, p_rows, ld, beta, c, ldc);
    case 4: return Tile<4, V>::run(depth, n, j0, alpha, a, a_row, a_col, p_rows, ld, beta, c, ldc);
    case 3: return Tile<3, V>::run(depth, n, j0, alpha, a, a_row, a_col, p_rows, ld, beta, c, ldc);
    case 2: return Tile<2, V>::run(depth, n, j0, alpha, a, a_row, a_col, p_rows, ld, beta, c, ldc);
    default: return Tile<1, V>::run(depth, n, j0, alpha, a, a_row, a_col, p_rows, ld, beta, c, ldc);
  }
}
template <template <int, int> class Tile, class A, class P>
inline void run_tiles(int64_t row_begin, int64_t row_end, int64_t depth, int64_t n, float alpha, const A* a,
                      int64_t a_row, int64_t a_col, const P* p_rows, int64_t ld, float beta, float* c, int64_t ldc) {
  const int64_t n_pad = (n + kWidth - 1) / kWidth * kWidth;
  for (int64_t j0 = 0; j0 < n_pad; j0 += kMaxVectors * kWidth) {
    const int64_t vectors = (n_pad - j0) / kWidth;
    const int64_t rows_per_tile = tile_rows_for(vectors);
    for (int64_t i0 = row_begin; i0 < row_end; i0 += rows_per_tile) {
      const int64_t rows = row_end - i0 < rows_per_tile ? row_end - i0 : rows_per_tile;
      const A* a_i = a + i0 * a_row;
      float* c_i = c + i0 * ldc;
      if (vectors >= 4) run_tile<Tile, 4>(rows, depth, n, j0, alpha, a_i, a_row, a_col, p_rows, ld, beta, c_i, ldc);
      else if (vectors == 3)
        run_tile<Tile, 3>(rows, depth, n, j0, alpha, a_i, a_row, a_col, p_rows, ld, beta, c_i, ldc);
      else if (vectors == 2)
        run_tile<Tile, 2>(rows, depth, n, j0, alpha, a_i, a_row, a_col, p_rows, ld, beta, c_i, ldc);
      else run_tile<Tile, 1>(rows, depth, n, j0, alpha, a_i, a_row, a_col, p_rows, ld, beta, c_i, ldc);
    }
  }
}

// bf16 tiles (bf16 mode, a CPU with AVX512_BF16): the same tiles over pairs of k. P2 holds op(B) rounded to
// bfloat16, row q of it the pairs (op(B)[2q, j], op(B)[2q + 1, j]) for every column j, one 32-bit lane each; A holds
// op(A)'s pairs (op(A)[i, 2q], op(A)[i, 2q + 1]) at a[i·a_row + q·a_col]. For q = 0 … k2 − 1, vdpbf16ps adds both
// products of a pair to a float32 sum: each product of two bfloat16 numbers is exact in float32, each addition
// rounded (the CPU flushes subnormals to zero there). The order depends on k alone, as in the float32 tiles.
#define TAPEGRAD_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
template <int R, int V>
struct Bf16Tile {
  TAPEGRAD_BF16_TARGET static void run(int64_t k2, int64_t n, int64_t j0, float alpha, const uint32_t* a, int64_t a_row,
                                       int64_t a_col, const uint32_t* p_rows, int64_t ld, float beta, float* c,
                                       int64_t ldc) {
    __m512 acc[R][V];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
    for (int64_t q = 0; q < k2; ++q) {
      __m512i b[V];
      for (int v = 0; v < V; ++v) b[v] = _mm512_loadu_si512(p_rows + q * ld + j0 + v * kWidth);
      for (int r = 0; r < R; ++r) {
        const __m512i x = _mm512_set1_epi32(static_cast<int>(a[r * a_row + q * a_col]));
        for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)x, (__m512bh)b[v]);
      }
    }
    store_tile<R, V>(acc, n, j0, alpha, beta, c, ldc);
  }
};

// The 16 × 16 block at `in` (rows of in_ld floats) written transposed at `out` (rows of out_ld): 16 loads, four
// rounds of 16 shuffles (pairs, quads, 128-bit lanes, halves), 16 stores.
inline void transpose_16x16(const float* in, int64_t in_ld, float* out, int64_t out_ld) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(in + i * in_ld);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    const __m512d t0 = _mm512_castps_pd(t[i]), t1 = _mm512_castps_pd(t[i + 1]);
    const __m512d t2 = _mm512_castps_pd(t[i + 2]), t3 = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  for (int h = 0; h < 16; h += 8)
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(out + i * out_ld, r[i]);
}

}  // namespace

namespace tapegrad::small_products_detail {

// The rows go in chunks whose op(A) (chunk × k floats) stays in the core's L2 while every column panel of P passes
// over it: with all m rows under each panel, a product of many rows (a split half of nanoGPT's (16384, 384, 384))
// read A from memory once per panel and ran at 186 GFLOP/s against oneDNN's 228. A chunk is a multiple of 24 rows,
// whole tiles of 6 and of 8.
constexpr int64_t kChunkBytes = 256 * 1024;

void product_avx512(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row, int64_t a_col,
                    const float* p_rows, int64_t ld, float beta, float* c, int64_t ldc) {
  const int64_t chunk = std::max<int64_t>(24, kChunkBytes / (4 * std::max<int64_t>(k, 1)) / 24 * 24);
  for (int64_t c0 = 0; c0 < m; c0 += chunk)
    run_tiles<FloatTile>(c0, std::min(m, c0 + chunk), k, n, alpha, a, a_row, a_col, p_rows, ld, beta, c, ldc);
}

void transpose_avx512(const float* in, int64_t in_ld, int64_t rows, int64_t cols, float* out, int64_t out_ld) {
  const int64_t full_rows = rows / 16 * 16, full_cols = cols / 16 * 16;
  for (int64_t i0 = 0; i0 < full_rows; i0 += 16)
    for (int64_t j0 = 0; j0 < full_cols; j0 += 16)
      transpose_16x16(in + i0 * in_ld + j0, in_ld, out + j0 * out_ld + i0, out_ld);
  // The edges: rows past the last whole block of 16, and columns past it in the whole blocks' rows.
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = i < full_rows ? full_cols : 0; j < cols; ++j)  // bytes: pack_pairs moves bf16 pairs this way
      std::memcpy(out + j * out_ld + i, in + i * in_ld + j, sizeof(float));
}

void product_bf16_avx512(int64_t m, int64_t n, int64_t k2, float alpha, const uint32_t* a, int64_t a_row, int64_t a_col,
                         const uint32_t* p_rows, int64_t ld, float beta, float* c, int64_t ldc) {
  run_tiles<Bf16Tile>(0, m, k2, n, alpha, a, a_row, a_col, p_rows, ld, beta, c, ldc);
}

TAPEGRAD_BF16_TARGET void pairs_across_rows_avx512bf16(uint32_t* out, int64_t ld_out, const float* x, int64_t rows,
                                                       int64_t cols, int64_t ldx) {
  // Lane j of a pair-row: the first row's bfloat16 in its low half, the second's in its high half.
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                              6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t q = 0; q < (rows + 1) / 2; ++q) {
    const float* first = x + 2 * q * ldx;
    const float* second = 2 * q + 1 < rows ? first + ldx : nullptr;
    for (int64_t j = 0; j < ld_out; j += kWidth) {
      const int64_t count = cols - j < kWidth ? std::max<int64_t>(cols - j, 0) : kWidth;
      const __mmask16 lanes = first_lanes(count);
      const __m512 lo = _mm512_maskz_loadu_ps(lanes, first + j);
      const __m512 hi = second ? _mm512_maskz_loadu_ps(lanes, second + j) : _mm512_setzero_ps();
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);  // lo's 16 bfloat16 in the low half, hi's above
      _mm512_storeu_si512(out + q * ld_out + j, _mm512_permutexvar_epi16(interleave, both));
    }
  }
}

}  // namespace tapegrad::small_products_detail

#endif
