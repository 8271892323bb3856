// The matrix products of the WebAssembly build: C = α·op(A)·op(B) + β·C for row- or column-major operands, in plain
// loops on the calling thread, behind the CBLAS names the engine's products call (web/blas_free/cblas.h). The
// gradchecker's products are float64 and small (a claim's inputs are a few rows), so a loop over k inside a loop
// over C's elements is fast enough, and each element is one dot product in index order.
#include "cblas.h"

#include <cstdint>

namespace {

// Element (i, j) of op(X) for a matrix stored row-major with leading dimension ld.
template <class T>
inline T element(const T* x, int64_t ld, bool transposed, int64_t i, int64_t j) {
  return transposed ? x[j * ld + i] : x[i * ld + j];
}

template <class T>
void gemm_loops(CBLAS_ORDER order, CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int m, int n, int k, T alpha,
                const T* a, int lda, const T* b, int ldb, T beta, T* c, int ldc) {
  if (order == CblasColMajor) {
    // A column-major C = op(A)·op(B) is the row-major Cᵀ = op(B)ᵀ·op(A)ᵀ: the same loops with the operands swapped.
    gemm_loops(CblasRowMajor, trans_b, trans_a, n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
    return;
  }
  const bool ta = trans_a != CblasNoTrans, tb = trans_b != CblasNoTrans;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      T sum = 0;
      for (int64_t p = 0; p < k; ++p) sum += element(a, lda, ta, i, p) * element(b, ldb, tb, p, j);
      T& out = c[i * ldc + j];
      // β = 0 overwrites C without reading it (it may hold NaN), as BLAS does.
      out = beta == T(0) ? alpha * sum : alpha * sum + beta * out;
    }
  }
}

char kConfig[] = "no BLAS library: the WebAssembly build's reference loops (web/blas_free)";
char kCoreName[] = "wasm32";

}  // namespace

extern "C" {

void cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int m, int n, int k, float alpha,
                 const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  gemm_loops(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void cblas_dgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int m, int n, int k, double alpha,
                 const double* a, int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  gemm_loops(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void openblas_set_num_threads(int) {}
int openblas_get_num_threads(void) { return 1; }
char* openblas_get_config(void) { return kConfig; }
char* openblas_get_corename(void) { return kCoreName; }

}  // extern "C"
