// Products on the engine's own kernel (ops/products/small_kernel.cpp, AVX-512): small ones, the large ones whose A is
// read as it is (products.hpp gives the rule; pack_columns_on_pool below), and bf16 mode's small ones (the bf16
// tiles, at the end). It was made for small products first: an attention head's
// products are thousands of calls a step of a few tens of thousands of multiply-adds each (at T = 64: (32, 32, 64),
// (64, 32, 32), (32, 64, 32), ...), where a library call's fixed cost (checks, choosing kernels, packing both
// operands for a blocking made for large ones) is much of the time. The kernel reads op(A) where it lies, reads
// op(B) as (k, n) rows — where it lies when B is used as is and n is a multiple of 16, else packed once into a
// buffer — and keeps each tile of C in registers over the whole of k.
//
// A packed operand can be shared: an op that multiplies several blocks by the same op(B) (attention's query blocks
// by Kᵀ and Vᵀ) packs it once, in a SharedOperand (ops/products/blas.hpp), and every product of its blocks reads
// that one copy. packings() counts the packings, so that a test can hold an op to one per operand and use.
//
// Declarations only, besides: the kernel's file is compiled for AVX-512 and must not define anything another
// file could link to.
#pragma once

#include <cstdint>
#include <vector>

namespace tapegrad {

namespace small_products_detail {
// C = α·op(A)·P + β·C, op(A)[i, p] = a[i·a_row + p·a_col], P (k, ·) rows of ld floats, readable (and zero, or at
// least finite) up to the next multiple of 16 past n (ops/products/small_kernel.cpp).
void product_avx512(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row, int64_t a_col,
                    const float* p_rows, int64_t ld, float beta, float* c, int64_t ldc);
// out[j·out_ld + i] = in[i·in_ld + j] for i < rows, j < cols, 16 × 16 blocks in registers; each element's 32 bits
// moved as they are (pack_pairs moves pairs of bfloat16 with it).
void transpose_avx512(const float* in, int64_t in_ld, int64_t rows, int64_t cols, float* out, int64_t out_ld);
// bf16 (AVX512_BF16): C = α·op(A)·P2 + β·C over k2 pairs of k, op(A)'s pairs at a[i·a_row + q·a_col], P2 (k2 rows
// of ld pairs, readable to the next multiple of 16 past n).
void product_bf16_avx512(int64_t m, int64_t n, int64_t k2, float alpha, const uint32_t* a, int64_t a_row, int64_t a_col,
                         const uint32_t* p_rows, int64_t ld, float beta, float* c, int64_t ldc);
// Rows 2q and 2q + 1 of x rounded and interleaved: out[q·ld_out + j] = (x[2q, j], x[2q + 1, j]) for j < cols, zero
// for cols ≤ j < ld_out (a multiple of 16) and in the second half where rows is odd.
void pairs_across_rows_avx512bf16(uint32_t* out, int64_t ld_out, const float* x, int64_t rows, int64_t cols,
                                  int64_t ldx);
}  // namespace small_products_detail

// True where the CPU runs the small kernel (AVX-512: CpuFeatures::avx512).
bool small_kernel_available();

// op(B) (k, n) as the kernel reads it: k rows of `ld` floats, columns n up to a multiple of 16 readable.
struct PackedColumns {
  const float* rows = nullptr;
  int64_t ld = 0, k = 0, n = 0;
};

// Packs op(B) (k, n) — b as is (rows of ldb) or transposed (b stored (n, k)) — into `storage`, zero-padded to a
// multiple of 16 columns, and counts one packing.
PackedColumns pack_columns(std::vector<float>& storage, bool trans_b, int64_t k, int64_t n, const float* b,
                           int64_t ldb);

// pack_columns on the engine's pool, each thread a range of P's 16-column blocks (for a product split over the
// pool: no thread waits while one packs), counted as one packing; B's own rows where it is used as is and n is a
// multiple of 16, as kernel_columns.
PackedColumns pack_columns_on_pool(std::vector<float>& storage, bool trans_b, int64_t k, int64_t n, const float* b,
                                   int64_t ldb);

// op(B) (k, n) as the kernel reads it: B's own rows where it is used as is and n is a multiple of 16 (nothing to
// transpose or pad), else packed into `storage` (pack_columns).
PackedColumns kernel_columns(std::vector<float>& storage, bool trans_b, int64_t k, int64_t n, const float* b,
                             int64_t ldb);

// C (m, n) = α·op(A)·P + β·C on the small kernel, n ≤ P.n and k = P.k (small_kernel_available() must hold).
void small_product(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                   const PackedColumns& p, float beta, float* c, int64_t ldc);

// C (m, n) = α·op(A)·op(B) + β·C on the small kernel, op(B) read in place where it can be, else packed into a
// buffer of the calling thread.
void small_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// bf16 mode. Where the CPU has AVX512_BF16 (with AVX-512), the products bf16 mode leaves below oneDNN's size run on
// the kernel's bf16 tiles: op(A) and op(B) rounded to bfloat16 (as round_to_bf16 rounds), the sums in float32.
bool small_bf16_kernel_available();

// op(B) (k, n) rounded to bfloat16 in pairs of k: (k + 1)/2 rows of ld 32-bit pairs, row q holding
// (op(B)[2q, j], op(B)[2q + 1, j]) in lane j, zero past n (to ld, a multiple of 16) and past k.
struct PackedPairs {
  const uint32_t* rows = nullptr;
  int64_t ld = 0, k = 0, n = 0;
};
// Rounds and packs op(B) (b as is, rows of ldb, or transposed, b stored (n, k)) into `storage`; counts one packing.
PackedPairs pack_pairs(std::vector<uint32_t>& storage, bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb);

// C (m, n) = α·op(A)·P + β·C with op(A) rounded to bfloat16 (into a buffer of the calling thread), n ≤ P.n, k = P.k.
void small_bf16_product(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                        const PackedPairs& p, float beta, float* c, int64_t ldc);

// C (m, n) = α·op(A)·op(B) + β·C with both operands rounded to bfloat16, on the kernel's bf16 tiles.
void small_bf16_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                      int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// How many operands the small kernel has packed in this process (every thread), in float32 or bf16.
uint64_t small_kernel_packings();

}  // namespace tapegrad
