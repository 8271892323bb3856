// Every matrix product in tapegrad goes through gemm() below: C = α·op(A)·op(B) + β·C, row-major. float64
// products run on OpenBLAS (cblas_dgemm), with their operands read through an emulated rounding while one is set;
// a float32 product runs on OpenBLAS, oneDNN or the engine's small-product kernel, in f32 or bf16, as
// ops/products/products.hpp decides from the CPU, the whole product's shape and the precision setting.
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
#include <array>
#include <chrono>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "blas_info.hpp"
#include "onednn_gemm.hpp"
#include "../../engine/parallel.hpp"
#include "../../engine/tape.hpp"
#include "products.hpp"
#include "small_products.hpp"

namespace tapegrad {

// An operand of a product: a row-major matrix at `data` with leading dimension `ld`, used as it is or transposed.
// `rounded`, where its owner made one (with_rounding, below), is the stored matrix already rounded to bf16,
// packed (its leading dimension the stored row's length): a bf16 product reads it instead of rounding the operand
// again, so a matrix that several products read (a weight in the forward and the backward, a gradient ȳ in both of
// a linear layer's backward products) is rounded once. Float32 and float64 products never read it.
template <class T>
struct MatrixOperand {
  const T* data;
  int64_t ld;
  bool transposed;
  const uint16_t* rounded = nullptr;
};
template <class T>
MatrixOperand<T> as_is(const T* data, int64_t ld) {
  return {data, ld, false};
}
template <class T>
MatrixOperand<T> transposed(const T* data, int64_t ld) {
  return {data, ld, true};
}
// x with the bf16 rounding of its stored matrix (round_for_products), or as it is where `rounded` is null (and for
// float64, whose products are never rounded).
template <class T>
MatrixOperand<T> with_rounding(MatrixOperand<T> x, const uint16_t* rounded) {
  if constexpr (std::is_same_v<T, float>) x.rounded = rounded;
  return x;
}

// Room in the tape's memory (valid until the tape is cleared) for bf16 roundings of a node's operands
// (round_for_products): one array of each of the counts given, each starting on a 64-byte boundary.
template <size_t N>
std::array<uint16_t*, N> bf16_copies(Tape& tape, const std::array<int64_t, N>& counts) {
  std::array<int64_t, N> offsets{};  // in float32 elements of the tape's memory, two halves each, padded to 16
  int64_t floats = 0;
  for (size_t i = 0; i < N; ++i) {
    offsets[i] = floats;
    floats += ((counts[i] + 1) / 2 + 15) / 16 * 16;
  }
  float* base = tape.empty(DType::f32, {floats}, "bf16 copies of the products' operands").data<float>();
  std::array<uint16_t*, N> arrays{};
  for (size_t i = 0; i < N; ++i) arrays[i] = reinterpret_cast<uint16_t*>(base + offsets[i]);
  return arrays;
}

// The stored matrix x (rows × cols, leading dimension ld) rounded to bf16 into out (rows × cols, packed), as a bf16
// product would round it, on the pool's threads by ranges of rows: for an operand that several bf16 products read.
inline void round_for_products(uint16_t* out, const float* x, int64_t rows, int64_t cols, int64_t ld) {
  parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)), [=](int64_t r0, int64_t r1) {
    onednn_detail::round_to_bf16_rows(out + r0 * cols, x + r0 * ld, r1 - r0, cols, ld);
  });
}

namespace blas_detail {

// Where a float32 product runs: chosen once per product from its whole shape, so that the blocks of a split
// product all run on the same kernels.
// small_bf16: a product bf16 mode leaves below oneDNN's size (runs_in_bf16 false) on the engine's bf16 tiles, where
// the CPU has them (small_bf16_kernel_available): an attention head's products in bf16 mode.
enum class Route { openblas, onednn_f32, onednn_bf16, small, small_bf16 };

template <class T>
Route route(int64_t m, int64_t n, int64_t k, bool a_transposed) {
  if constexpr (std::is_same_v<T, double>) return Route::openblas;
  if (m * n * k == 0) return Route::openblas;
  if (runs_in_bf16(m, n, k)) return Route::onednn_bf16;
  switch (product_backend(m, n, k, a_transposed)) {
    case ProductBackend::onednn: return Route::onednn_f32;
    case ProductBackend::engine:
      return product_precision() == ProductPrecision::bf16 && small_bf16_kernel_available() ? Route::small_bf16
                                                                                            : Route::small;
    default: return Route::openblas;
  }
}

inline void gemm_call(Route via, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (via == Route::small) return small_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (via == Route::small_bf16) return small_bf16_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
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

// Runs rows_product(r0, r1), the product's rows [r0, r1) of C, whole on this thread when the product is small or
// inside a parallel loop, else on blocks of rows across the pool.
inline bool splits(int64_t m, int64_t n, int64_t k) { return m * n * k >= kSplitMacs && !in_parallel_region(); }
template <class F>
void by_row_blocks(int64_t m, int64_t n, int64_t k, F&& rows_product) {
  if (!splits(m, n, k)) return rows_product(int64_t{0}, m);
  const int64_t units = (m + kSplitUnit - 1) / kSplitUnit;
  const int64_t macs_per_unit = kSplitUnit * n * k;
  const int64_t grain = std::max<int64_t>(1, (kSplitMacs / 2 + macs_per_unit - 1) / macs_per_unit);
  parallel_for(units, grain,
               [&](int64_t u0, int64_t u1) { rows_product(u0 * kSplitUnit, std::min(u1 * kSplitUnit, m)); });
}

// The row block [r0, r1) of op(A): A's rows r0.. as is, its columns r0.. transposed.
template <class T>
const T* rows_of(const T* a, bool trans_a, int64_t lda, int64_t r0) {
  return trans_a ? a + r0 : a + r0 * lda;
}

// C = α·op(A)·op(B) + β·C on the library `via` names, by row blocks where the product is large enough.
template <class T>
void product_by_row_blocks(Route via, int64_t m, int64_t n, int64_t k, T alpha, MatrixOperand<T> a, MatrixOperand<T> b,
                           T beta, T* c, int64_t ldc) {
  by_row_blocks(m, n, k, [&](int64_t r0, int64_t r1) {
    gemm_call(via, a.transposed, b.transposed, r1 - r0, n, k, alpha, rows_of(a.data, a.transposed, a.ld, r0), a.ld,
              b.data, b.ld, beta, c + r0 * ldc, ldc);
  });
}

// A float32 product on the engine's kernel, split by row blocks across the pool: op(B) as the kernel reads it — where
// it lies when B is used as is with a width a multiple of 16, else packed once, the pool taking a share of its
// columns each (pack_columns_on_pool) — and every block of every thread reads that one copy. oneDNN, handed the
// same blocks, packs all of B into its own layout in every one of them: the packing of a split product grew with
// the thread count. The packed copy is thread_local to the calling thread (a product has no tape to take scratch
// from), kept from product to product, and read by the pool only while this product runs.
inline void engine_product_by_row_blocks(int64_t m, int64_t n, int64_t k, float alpha, MatrixOperand<float> a,
                                         MatrixOperand<float> b, float beta, float* c, int64_t ldc) {
  thread_local std::vector<float> storage;
  const PackedColumns p = pack_columns_on_pool(storage, b.transposed, k, n, b.data, b.ld);
  by_row_blocks(m, n, k, [&](int64_t r0, int64_t r1) {
    small_product(a.transposed, r1 - r0, n, k, alpha, rows_of(a.data, a.transposed, a.ld, r0), a.ld, p, beta,
                  c + r0 * ldc, ldc);
  });
}

// A bf16 product: B rounded once, then by row blocks, each block's rows of op(A) rounded by the thread that
// multiplies them. An operand whose owner already rounded it (MatrixOperand::rounded) is not rounded again: B is
// read as it is, a block of A's rows too, and a block of a transposed A's columns is copied out of it. Rounded
// operands are packed (the leading dimension is the stored row's length): with A rounded whole before the split,
// a block of a transposed A is read with A's wider leading dimension, which sends oneDNN to its generic gemm:jit
// instead of its brgemm kernels, and the default model's bf16 step took 31-32 ms instead of 17.7-18.0 (AMD EPYC
// Zen 4, 2 threads, alternating runs).
// The rounded copies are thread_local because a product has no tape to take scratch from (engine/scratch.hpp is a
// tape's, for nodes): gemm() is called by ops, tools and tests alike, inside a node's parallel loop or outside any.
// B's copy belongs to the calling thread and is only read by the pool while this product runs; where the product
// is split, the pool rounds it, each thread a range of B's stored rows, so that no thread waits while one rounds
// all of B (on 16 threads, one thread rounding it would keep fifteen idle). Each thread rounds its own block of A
// into its own a16, since the blocks run at once. Both are kept from product to product (resized to the largest a
// thread has rounded) so that a training step's products allocate nothing after the first.
inline void bf16_product(int64_t m, int64_t n, int64_t k, float alpha, MatrixOperand<float> a, MatrixOperand<float> b,
                         float beta, float* c, int64_t ldc) {
  const bool trans_a = a.transposed, trans_b = b.transposed;
  const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;  // B stored (k, n) or (n, k)
  const uint16_t* b_bf16 = b.rounded;
  if (!b_bf16) {
    thread_local std::vector<uint16_t> b16;
    b16.resize(static_cast<size_t>(k * n));
    uint16_t* b_out = b16.data();
    if (splits(m, n, k))
      parallel_for(b_rows, std::max<int64_t>(1, 16384 / b_cols), [&](int64_t r0, int64_t r1) {
        onednn_detail::round_to_bf16_rows(b_out + r0 * b_cols, b.data + r0 * b.ld, r1 - r0, b_cols, b.ld);
      });
    else onednn_detail::round_to_bf16_rows(b_out, b.data, b_rows, b_cols, b.ld);
    b_bf16 = b_out;
  }
  const int64_t a_stored_cols = trans_a ? m : k;  // A stored (m, k) or (k, m): the rounded copy's row length
  by_row_blocks(m, n, k, [&](int64_t r0, int64_t r1) {
    thread_local std::vector<uint16_t> a16;
    const int64_t rows = r1 - r0, a_cols = trans_a ? rows : k;  // op(A)'s rows stored (rows, k) or (k, rows)
    const uint16_t* a_block;
    if (a.rounded && (!trans_a || rows == m)) {
      a_block = trans_a ? a.rounded : a.rounded + r0 * k;  // already packed: A's rows, or all of its columns
    } else {
      a16.resize(static_cast<size_t>(rows * k));
      if (a.rounded)  // the block's columns of the rounded A, packed (a copy: no rounding again)
        for (int64_t p = 0; p < k; ++p) std::copy_n(a.rounded + p * a_stored_cols + r0, rows, a16.data() + p * rows);
      else
        onednn_detail::round_to_bf16_rows(a16.data(), rows_of(a.data, trans_a, a.ld, r0), trans_a ? k : rows, a_cols,
                                          a.ld);
      a_block = a16.data();
    }
    onednn_detail::bf16_gemm(trans_a, trans_b, rows, n, k, alpha, a_block, a_cols, b_bf16, b_cols, beta, c + r0 * ldc,
                             ldc);
  });
}

// A float64 product under an emulated rounding (ops/products/products.hpp): its operands' stored elements moved into
// packed copies (thread_local, kept from product to product), the product as usual, then its result moved.
inline void emulated_rounding_product(int64_t m, int64_t n, int64_t k, double alpha, MatrixOperand<double> a,
                                      MatrixOperand<double> b, double beta, double* c, int64_t ldc,
                                      const EmulatedRounding& r) {
  thread_local std::vector<double> a_copy, b_copy;
  auto copy = [&r](std::vector<double>& out, const MatrixOperand<double>& x, int64_t rows, int64_t cols) {
    if (x.transposed) std::swap(rows, cols);  // stored (cols, rows) when read transposed
    out.resize(static_cast<size_t>(rows * cols));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        out[static_cast<size_t>(i * cols + j)] = emulate_rounding(x.data[i * x.ld + j], r.operand_roundoff, r.seed);
    return MatrixOperand<double>{out.data(), cols, x.transposed};
  };
  product_by_row_blocks(Route::openblas, m, n, k, alpha, copy(a_copy, a, m, k), copy(b_copy, b, k, n), beta, c, ldc);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = emulate_rounding(c[i * ldc + j], r.result_roundoff, ~r.seed);
}

// The first product checks which OpenBLAS kernels run (ops/products/blas_info.hpp); later ones pay one relaxed load.
inline void check_core() {
  if (!core_checked.load(std::memory_order_relaxed)) warn_if_weak_blas_core();
}

// Runs product() and, where a product log is set (float32 products: the bench, the profile), records its time.
template <class T, class F>
void logged(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, Route via, F&& product) {
  ProductLog* log = std::is_same_v<T, float> ? product_log() : nullptr;
  if (!log) return product();
  const auto t0 = std::chrono::steady_clock::now();
  const bool split = splits(m, n, k);
  product();
  log->record({m, n, k, trans_a, trans_b, split, via == Route::onednn_bf16 || via == Route::small_bf16,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()});
}

}  // namespace blas_detail

// C (m, n) = α·op(A)·op(B) + β·C, op(A) of shape (m, k) and op(B) of shape (k, n); C row-major with leading
// dimension ldc. For example x·wᵀ into y:  gemm(n, out, in, 1.0f, as_is(x, in), transposed(w, in), 0.0f, y, out).
template <class T>
void gemm(int64_t m, int64_t n, int64_t k, std::type_identity_t<T> alpha, MatrixOperand<T> a, MatrixOperand<T> b,
          std::type_identity_t<T> beta, T* c, int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "gemm: float or double");
  blas_detail::check_core();
  if constexpr (std::is_same_v<T, double>)
    if (const EmulatedRounding r = emulated_rounding(); r.any())
      return blas_detail::emulated_rounding_product(m, n, k, alpha, a, b, beta, c, ldc, r);
  const blas_detail::Route via = blas_detail::route<T>(m, n, k, a.transposed);
  blas_detail::logged<T>(m, n, k, a.transposed, b.transposed, via, [&] {
    if constexpr (std::is_same_v<T, float>) {
      if (via == blas_detail::Route::onednn_bf16) return blas_detail::bf16_product(m, n, k, alpha, a, b, beta, c, ldc);
      if (via == blas_detail::Route::small && blas_detail::splits(m, n, k))
        return blas_detail::engine_product_by_row_blocks(m, n, k, alpha, a, b, beta, c, ldc);
    }
    blas_detail::product_by_row_blocks(via, m, n, k, alpha, a, b, beta, c, ldc);
  });
}

// op(B) of several products — an op's blocks of rows multiplied by one matrix, as attention's query blocks are by
// Kᵀ and Vᵀ — packed at most once for all of them: a product that runs on the small-product kernel
// (ops/products/small_products.hpp) reads the one packed copy, made by the first such product; one that runs
// elsewhere reads the operand as given, exactly as gemm() would. A product may use the first n ≤ columns of it
// (a causal query block, the keys it sees). The storage is the caller's, kept from operand to operand (a thread's
// loop over heads repacks into the same buffer).
template <class T>
class SharedOperand {
 public:
  // op(B) of shape (k, columns); `pair_storage`, where given, holds its bf16 pairs for bf16 mode's small products.
  SharedOperand(MatrixOperand<T> b, int64_t k, int64_t columns, std::vector<T>& storage,
                std::vector<uint32_t>* pair_storage = nullptr)
      : source_(b), k_(k), columns_(columns), storage_(&storage), pair_storage_(pair_storage) {}
  const MatrixOperand<T>& source() const { return source_; }
  int64_t k() const { return k_; }
  int64_t columns() const { return columns_; }
  // The operand as the kernel reads it, made on the first call (float32 only).
  const PackedColumns& packed() {
    static_assert(std::is_same_v<T, float>, "only float32 products run on the small kernel");
    if (!packed_.rows) packed_ = kernel_columns(*storage_, source_.transposed, k_, columns_, source_.data, source_.ld);
    return packed_;
  }
  // The operand rounded to bf16 in pairs (pack_pairs), made on the first call; null without pair storage.
  const PackedPairs* packed_pairs() {
    static_assert(std::is_same_v<T, float>, "only float32 products run in bf16");
    if (!pair_storage_) return nullptr;
    if (!pairs_.rows) pairs_ = pack_pairs(*pair_storage_, source_.transposed, k_, columns_, source_.data, source_.ld);
    return &pairs_;
  }

 private:
  MatrixOperand<T> source_;
  int64_t k_, columns_;
  std::vector<T>* storage_;
  std::vector<uint32_t>* pair_storage_;
  PackedColumns packed_;
  PackedPairs pairs_;
};

// gemm() with op(B) the first n columns of a shared operand (k = b.k()).
template <class T>
void gemm(int64_t m, int64_t n, std::type_identity_t<T> alpha, MatrixOperand<T> a, SharedOperand<T>& b,
          std::type_identity_t<T> beta, T* c, int64_t ldc) {
  const int64_t k = b.k();
  if constexpr (std::is_same_v<T, float>) {
    const blas_detail::Route via = blas_detail::route<T>(m, n, k, a.transposed);
    const bool fits = n <= b.columns();
    const bool bf16 = fits && via == blas_detail::Route::small_bf16 && b.packed_pairs();
    if ((fits && via == blas_detail::Route::small) || bf16) {
      blas_detail::check_core();
      return blas_detail::logged<T>(m, n, k, a.transposed, b.source().transposed, via, [&] {
        if (bf16) small_bf16_product(a.transposed, m, n, k, alpha, a.data, a.ld, *b.packed_pairs(), beta, c, ldc);
        else small_product(a.transposed, m, n, k, alpha, a.data, a.ld, b.packed(), beta, c, ldc);
      });
    }
  }
  gemm<T>(m, n, k, alpha, a, b.source(), beta, c, ldc);
}

}  // namespace tapegrad
