// The oneDNN side of gemm() (ops/products/blas.hpp): one float32 product through oneDNN's matmul primitive, in float32
// or with bf16 operands, single-threaded on the calling thread. Row-major, C (m, n) = α·op(A)·op(B) + β·C, as
// cblas_sgemm. Where tapegrad was built without oneDNN these throw tapegrad::Error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tapegrad::onednn_detail {

// False where oneDNN has no implementation for this product but its reference one (or none): the caller runs
// it on OpenBLAS instead. The answer is cached per shape, so it is the same for every call of that shape.
bool sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The product of operands already rounded to bfloat16 (bit patterns, as round_to_bf16_rows gives them), with
// float32 accumulation into C.
void bf16_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
               const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The same products (α = 1, β = 0) on a team of `threads` OpenMP threads of oneDNN's own, for the bench's ceilings:
// how fast oneDNN runs a shape on all the cores when nothing else runs. The engine never calls these (its pool is
// the only one: docs/products.md), and the team is held to one thread again on return.
bool team_sgemm(int threads, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                const float* b, int64_t ldb, float* c, int64_t ldc);
void team_bf16_gemm(int threads, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t* a,
                    int64_t lda, const uint16_t* b, int64_t ldb, float* c, int64_t ldc);

// `rows` rows of `cols` floats at leading dimension ld, rounded to bfloat16 into out (leading dimension cols):
// round to nearest, ties to even; NaN stays a (quiet) NaN; float32 subnormals become zeros of their sign, as the
// CPU's conversion instruction (vcvtneps2bf16), which does the work where the CPU has AVX512_BF16.
void round_to_bf16_rows(uint16_t* out, const float* x, int64_t rows, int64_t cols, int64_t ld);

// x rounded to bfloat16 and back: what a bf16 product reads of x (for tests and docs/products.md's bound).
float round_to_bf16(float x);

// The implementations oneDNN chose for the products run so far, sorted ("brg:avx512_core", ...).
std::vector<std::string> implementations_used();

std::string version();  // "2.6.3", or "" where built without oneDNN

}  // namespace tapegrad::onednn_detail
