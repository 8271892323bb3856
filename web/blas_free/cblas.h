/* The part of the CBLAS interface tapegrad's products and thread policy call (ops/products/blas.hpp,
   ops/products/blas_info.cpp, engine/parallel.cpp), for the WebAssembly build, which has no OpenBLAS: its
   definitions (web/blas_free/reference_gemm.cpp) multiply with plain loops on the calling thread. It stands in
   for <cblas.h> only in that build (web/CMakeLists.txt puts this folder first on the include path). */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE trans_a, enum CBLAS_TRANSPOSE trans_b, int m, int n,
                 int k, float alpha, const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);
void cblas_dgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE trans_a, enum CBLAS_TRANSPOSE trans_b, int m, int n,
                 int k, double alpha, const double* a, int lda, const double* b, int ldb, double beta, double* c,
                 int ldc);

/* What the program asks OpenBLAS about itself: here one thread, and a name that says no BLAS library is linked. */
void openblas_set_num_threads(int threads);
int openblas_get_num_threads(void);
char* openblas_get_config(void);
char* openblas_get_corename(void);

#ifdef __cplusplus
}
#endif
