#include "ops/products/small_products.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>

#include <fmt/core.h>

#include "engine/tensor.hpp"
#include "engine/parallel.hpp"
#include "ops/products/blas_info.hpp"
#include "ops/products/onednn_gemm.hpp"

namespace tapegrad {

namespace {
constexpr int64_t kWidth = 16;  // floats in an AVX-512 register: P's columns are padded to a multiple of it
std::atomic<uint64_t> packings{0};

int64_t padded_width(int64_t n) { return (n + kWidth - 1) / kWidth * kWidth; }

// Whether the kernel reads op(B) where it lies: B used as is, a width a multiple of 16 (nothing to move or pad).
bool read_in_place(bool trans_b, int64_t n) { return !trans_b && n % kWidth == 0; }

// P's columns [j0, end) (multiples of 16, P rows ld apart): P[p, j] = op(B)[p, j], b[p·ldb + j], or b[j·ldb + p]
// when B is stored transposed (B's rows are P's columns, moved 16 × 16 at a time in registers); zero from n on.
void pack_column_blocks(float* out, int64_t ld, bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb,
                        int64_t j0, int64_t end) {
  const int64_t j1 = std::min(end, n);
  if (j0 < j1) {
    if (trans_b) {
#if defined(__x86_64__)
      small_products_detail::transpose_avx512(b + j0 * ldb, ldb, j1 - j0, k, out + j0, ld);
#endif
    } else {
      for (int64_t p = 0; p < k; ++p)
        for (int64_t j = j0; j < j1; ++j) out[p * ld + j] = b[p * ldb + j];
    }
  }
  for (int64_t p = 0; p < k; ++p)
    for (int64_t j = std::max(j0, n); j < end; ++j) out[p * ld + j] = 0.0f;
}

// op(B) packed whole into `storage` (pack_column_blocks), by the calling thread or, on_pool, each thread of the pool
// a range of the 16-column blocks; counted as one packing.
PackedColumns pack_columns_into(std::vector<float>& storage, bool trans_b, int64_t k, int64_t n, const float* b,
                                int64_t ldb, bool on_pool) {
  if (!small_kernel_available()) throw Error("pack_columns: this CPU has no AVX-512, which the small kernel needs");
  const int64_t ld = padded_width(n);
  storage.resize(static_cast<size_t>(k * ld));
  float* out = storage.data();
  if (on_pool)
    parallel_for(ld / kWidth, std::max<int64_t>(1, 16384 / (kWidth * k)), [&](int64_t b0, int64_t b1) {
      pack_column_blocks(out, ld, trans_b, k, n, b, ldb, b0 * kWidth, b1 * kWidth);
    });
  else pack_column_blocks(out, ld, trans_b, k, n, b, ldb, 0, ld);
  packings.fetch_add(1, std::memory_order_relaxed);
  return {out, ld, k, n};
}

// `rows` rows of x (cols floats, ldx apart) rounded to bfloat16 by round_to_bf16_rows into pairs of neighbours,
// (cols + 1)/2 pairs a row: an odd row's last pair ends in a zero.
void round_rows_into_pairs(uint32_t* out, const float* x, int64_t rows, int64_t cols, int64_t ldx) {
  auto* halves = reinterpret_cast<uint16_t*>(out);
  if (cols % 2 == 0) return onednn_detail::round_to_bf16_rows(halves, x, rows, cols, ldx);
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t* row = halves + r * (cols + 1);
    onednn_detail::round_to_bf16_rows(row, x + r * ldx, 1, cols, ldx);
    std::memset(row + cols, 0, sizeof(uint16_t));
  }
}
}  // namespace

bool small_kernel_available() {
  static const bool available = cpu_features().avx512();
  return available;
}

uint64_t small_kernel_packings() { return packings.load(std::memory_order_relaxed); }

PackedColumns pack_columns(std::vector<float>& storage, bool trans_b, int64_t k, int64_t n, const float* b,
                           int64_t ldb) {
  return pack_columns_into(storage, trans_b, k, n, b, ldb, false);
}

void small_product(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                   const PackedColumns& p, float beta, float* c, int64_t ldc) {
  if (!small_kernel_available()) throw Error("small_product: this CPU has no AVX-512, which the kernel needs");
  if (n > p.n || k != p.k)
    throw Error(fmt::format("small_product: a product of (m, n, k) = ({}, {}, {}) on packed columns of ({}, {})", m, n,
                            k, p.k, p.n));
#if defined(__x86_64__)
  small_products_detail::product_avx512(m, n, k, alpha, a, trans_a ? 1 : lda, trans_a ? lda : 1, p.rows, p.ld, beta, c,
                                        ldc);
#endif
}

PackedColumns pack_columns_on_pool(std::vector<float>& storage, bool trans_b, int64_t k, int64_t n, const float* b,
                                   int64_t ldb) {
  if (read_in_place(trans_b, n)) return {b, ldb, k, n};
  return pack_columns_into(storage, trans_b, k, n, b, ldb, true);
}

PackedColumns kernel_columns(std::vector<float>& storage, bool trans_b, int64_t k, int64_t n, const float* b,
                             int64_t ldb) {
  if (read_in_place(trans_b, n)) return {b, ldb, k, n};
  return pack_columns(storage, trans_b, k, n, b, ldb);
}

bool small_bf16_kernel_available() {
  static const bool available = cpu_features().avx512() && cpu_features().avx512bf16;
  return available;
}

PackedPairs pack_pairs(std::vector<uint32_t>& storage, bool trans_b, int64_t k, int64_t n, const float* b,
                       int64_t ldb) {
  if (!small_bf16_kernel_available())
    throw Error("pack_pairs: this CPU has no AVX512_BF16, which the kernel's bf16 tiles need");
  const int64_t ld = padded_width(n), k2 = (k + 1) / 2;
  storage.resize(static_cast<size_t>(k2 * ld));
#if defined(__x86_64__)
  if (trans_b) {
    // B stored (n, k): a pair of op(B)'s rows is a pair of neighbours in each of B's rows. B's rows rounded in
    // pairs (n rows of k2), then moved as 32-bit lanes: P's row q is their column q.
    thread_local std::vector<uint32_t> rows;
    rows.resize(static_cast<size_t>(n * k2));
    round_rows_into_pairs(rows.data(), b, n, k, ldb);
    small_products_detail::transpose_avx512(reinterpret_cast<const float*>(rows.data()), k2, n, k2,
                                            reinterpret_cast<float*>(storage.data()), ld);
    for (int64_t q = 0; q < k2; ++q) std::fill(storage.begin() + q * ld + n, storage.begin() + (q + 1) * ld, 0u);
  } else {
    small_products_detail::pairs_across_rows_avx512bf16(storage.data(), ld, b, k, n, ldb);
  }
#endif
  packings.fetch_add(1, std::memory_order_relaxed);
  return {storage.data(), ld, k, n};
}

void small_bf16_product(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                        const PackedPairs& p, float beta, float* c, int64_t ldc) {
  if (!small_bf16_kernel_available())
    throw Error("small_bf16_product: this CPU has no AVX512_BF16, which the kernel's bf16 tiles need");
  if (n > p.n || k != p.k)
    throw Error(fmt::format("small_bf16_product: a product of (m, n, k) = ({}, {}, {}) on packed pairs of ({}, {})", m,
                            n, k, p.k, p.n));
#if defined(__x86_64__)
  // op(A)'s pairs: A's rows rounded into pairs of neighbours, or, A stored (k, m), its rows 2q and 2q + 1
  // interleaved (lane i of pair-row q: op(A)[i, 2q] and op(A)[i, 2q + 1]).
  thread_local std::vector<uint32_t> pairs;
  const int64_t k2 = (k + 1) / 2, ld = trans_a ? padded_width(m) : k2;
  pairs.resize(static_cast<size_t>(trans_a ? k2 * ld : m * k2));
  if (trans_a) small_products_detail::pairs_across_rows_avx512bf16(pairs.data(), ld, a, k, m, lda);
  else round_rows_into_pairs(pairs.data(), a, m, k, lda);
  small_products_detail::product_bf16_avx512(m, n, k2, alpha, pairs.data(), trans_a ? 1 : ld, trans_a ? ld : 1, p.rows,
                                             p.ld, beta, c, ldc);
#endif
}

void small_bf16_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                      int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  thread_local std::vector<uint32_t> storage;
  small_bf16_product(trans_a, m, n, k, alpha, a, lda, pack_pairs(storage, trans_b, k, n, b, ldb), beta, c, ldc);
}

void small_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  thread_local std::vector<float> storage;
  small_product(trans_a, m, n, k, alpha, a, lda, kernel_columns(storage, trans_b, k, n, b, ldb), beta, c, ldc);
}

}  // namespace tapegrad
