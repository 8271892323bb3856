// Every matrix product in tapegrad goes through gemm() below: C = α·op(A)·op(B) + β·C, row-major. float64
// products run on OpenBLAS (cblas_dgemm); a float32 product runs on OpenBLAS or oneDNN, in f32 or bf16, as
// engine/products.hpp decides from the CPU, the whole product's shape and the precision setting.
//
// OpenBLAS and oneDNN run single-threaded and the engine's pool splits large products (engine/parallel.hpp gives the
// policy): C (m, n) is cut into row blocks [r0, r1) and each thread runs one gemm on its block,
//   C[r0:r1, :] = α·op(A)[r0:r1, :]·op(B) + β·C[r0:r1, :]      (op(A) row r is A's row r, or A's column r if Aᵀ)
// Every element of C is still one dot product over all of k inside one gemm. It is not always bit-identical to
// the whole product (OpenBLAS picks its kernels and blocking by the block's size), but the blocks depend on
// (m, n, k) and the thread count only, so a product gives the same bits in every run.
// Inside a parallel loop (or for small products) the product runs whole on the calling thread.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "blas_info.hpp"
#include "onednn_gemm.hpp"
#include "parallel.hpp"
#include "products.hpp"

namespace tapegrad {

namespace blas_detail {

// Where a float32 product runs: chosen once per product from its whole shape, so that the blocks of a split
// product all run on the same kernels.
enum class Route { openblas, onednn_f32, onednn_bf16 };

template <class T>
Route route(int64_t m, int64_t n, int64_t k) {
  if constexpr (std::is_same_v<T, double>) return Route::openblas;
  if (m * n * k == 0) return Route::openblas;
  if (product_precision() == ProductPrecision::bf16) return Route::onednn_bf16;
  return product_backend(m, n, k) == ProductBackend::onednn ? Route::onednn_f32 : Route::openblas;
}

inline void gemm_call(Route via, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (via == Route::onednn_bf16)
    return onednn_detail::bf16_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (via == Route::onednn_f32 && onednn_detail::sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
    return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

inline void gemm_call(Route, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                      int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// Below this many multiply-adds (2M: ~40 µs on one core) a product is not split: the hand-off to another thread
// costs ~1 µs when the worker is polling, tens of µs when it sleeps, and a scheduler time slice when other
// processes hold the cores; smaller products are better parallelized by the loops around them.
constexpr int64_t kSplitMacs = int64_t{1} << 21;
// Blocks are whole multiples of this many rows (columns): the sgemm micro-kernels' tile height.
constexpr int64_t kSplitUnit = 16;

template <class T>
void gemm_split(Route via, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const int64_t units = (m + kSplitUnit - 1) / kSplitUnit;
  const int64_t macs_per_unit = kSplitUnit * n * k;
  const int64_t grain = std::max<int64_t>(1, (kSplitMacs / 2 + macs_per_unit - 1) / macs_per_unit);
  parallel_for(units, grain, [&](int64_t u0, int64_t u1) {
    const int64_t r0 = u0 * kSplitUnit, r1 = std::min(u1 * kSplitUnit, m);
    gemm_call(via, trans_a, trans_b, r1 - r0, n, k, alpha, trans_a ? a + r0 : a + r0 * lda, lda, b, ldb, beta,
              c + r0 * ldc, ldc);
  });
}

// The first product checks which OpenBLAS kernels run (engine/blas_info.hpp); later ones pay one relaxed load.
inline void check_core() {
  if (!core_checked.load(std::memory_order_relaxed)) warn_if_weak_blas_core();
}

}  // namespace blas_detail

// An operand of a product: a row-major matrix at `data` with leading dimension `ld`, used as it is or transposed.
template <class T>
struct MatrixOperand {
  const T* data;
  int64_t ld;
  bool transposed;
};
template <class T>
MatrixOperand<T> as_is(const T* data, int64_t ld) { return {data, ld, false}; }
template <class T>
MatrixOperand<T> transposed(const T* data, int64_t ld) { return {data, ld, true}; }

// C (m, n) = α·op(A)·op(B) + β·C, op(A) of shape (m, k) and op(B) of shape (k, n); C row-major with leading
// dimension ldc. For example x·wᵀ into y:  gemm(n, out, in, 1.0f, as_is(x, in), transposed(w, in), 0.0f, y, out).
template <class T>
void gemm(int64_t m, int64_t n, int64_t k, std::type_identity_t<T> alpha, MatrixOperand<T> a, MatrixOperand<T> b,
          std::type_identity_t<T> beta, T* c, int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "gemm: float or double");
  blas_detail::check_core();
  const blas_detail::Route via = blas_detail::route<T>(m, n, k);
  if (m * n * k < blas_detail::kSplitMacs || in_parallel_region())
    return blas_detail::gemm_call(via, a.transposed, b.transposed, m, n, k, alpha, a.data, a.ld, b.data, b.ld, beta, c,
                                  ldc);
  blas_detail::gemm_split(via, a.transposed, b.transposed, m, n, k, alpha, a.data, a.ld, b.data, b.ld, beta, c, ldc);
}

}  // namespace tapegrad
