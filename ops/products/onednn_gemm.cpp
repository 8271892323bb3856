#include "ops/products/onednn_gemm.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <mutex>
#include <set>
#include <unordered_map>

#include <fmt/core.h>

#include "ops/products/blas_info.hpp"
#include "engine/tensor.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#ifdef TAPEGRAD_HAVE_ONEDNN
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace tapegrad::onednn_detail {

// bfloat16 is float32's upper half: round the lower 16 bits away to nearest, ties to even; a NaN stays a NaN
// (quiet), where adding the rounding bias could carry it into the exponent; a subnormal becomes a zero of its sign,
// as vcvtneps2bf16 makes it, so that both ways of rounding give the same bits.
static inline uint16_t to_bf16_bits(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u, zero = (u >> 16) & 0x8000u;
  const uint32_t magnitude = u & 0x7fffffffu;
  return static_cast<uint16_t>(magnitude > 0x7f800000u ? nan : (u & 0x7f800000u) == 0 ? zero : rounded);
}

float round_to_bf16(float x) { return std::bit_cast<float>(uint32_t{to_bf16_bits(x)} << 16); }

#if defined(__x86_64__)
// 16 floats a step through the CPU's own conversion (AVX512_BF16), each row's tail under a mask; all the rows in
// one call, which short rows (an attention block's 32 floats) would otherwise pay for row by row.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void round_rows_avx512bf16(
    uint16_t* out, const float* x, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r, out += cols, x += ld) {
    int64_t j = 0;
    for (; j + 16 <= cols; j += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + j)));
    if (j < cols) {
      const auto mask = static_cast<__mmask16>((1u << (cols - j)) - 1);
      _mm256_mask_storeu_epi16(out + j, mask, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x + j)));
    }
  }
}
#endif

void round_to_bf16_rows(uint16_t* out, const float* x, int64_t rows, int64_t cols, int64_t ld) {
#if defined(__x86_64__)
  static const bool has_instruction = cpu_features().avx512bf16;
  if (has_instruction) return round_rows_avx512bf16(out, x, rows, cols, ld);
#endif
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) out[r * cols + j] = to_bf16_bits(x[r * ld + j]);
}

#ifdef TAPEGRAD_HAVE_ONEDNN

namespace {

using dnnl::memory;
using Dims = memory::dims;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// Every thread that calls oneDNN holds its OpenMP team to one thread: the engine's pool is the only one.
void single_threaded_here() {
  thread_local const bool once = (omp_set_num_threads(1), true);
  (void)once;
}

struct Key {
  bool bf16, trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc;
  uint32_t alpha, beta;  // bit patterns
  int threads = 1;       // the OpenMP team the primitive is made for (oneDNN sizes its work by it)
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& key) const {
    size_t h = (size_t{key.bf16} << 2) | (size_t{key.trans_a} << 1) | size_t{key.trans_b};
    for (int64_t v :
         {key.m, key.n, key.k, key.lda, key.ldb, key.ldc, int64_t{key.alpha}, int64_t{key.beta}, int64_t{key.threads}})
      h = h * 0x9e3779b97f4a7c15ull + static_cast<size_t>(v);
    return h;
  }
};
struct Product {
  bool usable = false;  // false: oneDNN offers only its reference implementation here
  memory::desc a, b, c;
  dnnl::matmul matmul;
};

std::mutex implementations_mutex;
std::set<std::string> implementations;

// A row-major matrix of `rows` × `cols` (as op() reads it) stored with leading dimension ld, as is or transposed.
memory::desc matrix_desc(int64_t rows, int64_t cols, int64_t ld, bool transposed, memory::data_type type) {
  return memory::desc(Dims{rows, cols}, type, transposed ? Dims{1, ld} : Dims{ld, 1});
}

Product make_product(const Key& key) {
  const auto in_type = key.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  Product p;
  p.a = matrix_desc(key.m, key.k, key.lda, key.trans_a, in_type);
  p.b = matrix_desc(key.k, key.n, key.ldb, key.trans_b, in_type);
  p.c = matrix_desc(key.m, key.n, key.ldc, false, memory::data_type::f32);
  dnnl::primitive_attr attr;
  const float alpha = std::bit_cast<float>(key.alpha), beta = std::bit_cast<float>(key.beta);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops sum;
    sum.append_sum(beta);
    attr.set_post_ops(sum);
  }
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p.a, p.b, p.c), attr, cpu_engine());
    const std::string impl = pd.impl_info_str();
    p.usable = impl.rfind("ref", 0) != 0;
    if (!p.usable && key.bf16)
      throw Error(fmt::format("bf16 product ({}, {}) x ({}, {}): oneDNN has only its reference implementation here",
                              key.m, key.k, key.k, key.n));
    if (p.usable) {
      p.matmul = dnnl::matmul(pd);
      std::lock_guard lock(implementations_mutex);
      implementations.insert(impl);
    }
  } catch (const dnnl::error& e) {
    if (key.bf16)
      throw Error(
          fmt::format("bf16 product ({}, {}) x ({}, {}): oneDNN refused it: {}", key.m, key.k, key.k, key.n, e.what()));
    p.usable = false;
  }
  return p;
}

// Primitives per thread, by shape: made once (tens of µs), then each call only wraps the pointers.
Product& product_for(const Key& key) {
  thread_local std::unordered_map<Key, Product, KeyHash> cache;
  if (cache.size() > 512) cache.clear();  // shapes that keep changing (sampling at growing lengths)
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_product(key)).first;
  return it->second;
}

void run(Product& p, const void* a, const void* b, float* c) {
  thread_local dnnl::stream stream(cpu_engine());
  dnnl::engine& engine = cpu_engine();
  memory am(p.a, engine, const_cast<void*>(a)), bm(p.b, engine, const_cast<void*>(b)), cm(p.c, engine, c);
  p.matmul.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
}

}  // namespace

bool sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  single_threaded_here();
  Product& p = product_for(
      {false, trans_a, trans_b, m, n, k, lda, ldb, ldc, std::bit_cast<uint32_t>(alpha), std::bit_cast<uint32_t>(beta)});
  if (!p.usable) return false;
  run(p, a, b, c);
  return true;
}

void bf16_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
               const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  single_threaded_here();
  Product& p = product_for(
      {true, trans_a, trans_b, m, n, k, lda, ldb, ldc, std::bit_cast<uint32_t>(alpha), std::bit_cast<uint32_t>(beta)});
  run(p, a, b, c);
}

// A team of `threads` for oneDNN on this thread while it lives; one thread again after.
struct Team {
  explicit Team(int threads) { omp_set_num_threads(std::max(threads, 1)); }
  ~Team() { omp_set_num_threads(1); }
  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;
};

bool team_sgemm(int threads, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                const float* b, int64_t ldb, float* c, int64_t ldc) {
  Team team(threads);
  Product& p =
      product_for({false, trans_a, trans_b, m, n, k, lda, ldb, ldc, std::bit_cast<uint32_t>(1.0f), 0u, threads});
  if (!p.usable) return false;
  run(p, a, b, c);
  return true;
}

void team_bf16_gemm(int threads, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t* a,
                    int64_t lda, const uint16_t* b, int64_t ldb, float* c, int64_t ldc) {
  Team team(threads);
  Product& p =
      product_for({true, trans_a, trans_b, m, n, k, lda, ldb, ldc, std::bit_cast<uint32_t>(1.0f), 0u, threads});
  run(p, a, b, c);
}

std::vector<std::string> implementations_used() {
  std::lock_guard lock(implementations_mutex);
  return {implementations.begin(), implementations.end()};
}

std::string version() {
  const dnnl_version_t* v = dnnl_version();
  return fmt::format("{}.{}.{}", v->major, v->minor, v->patch);
}

#else  // built without oneDNN

static Error not_built() { return Error("tapegrad was built without oneDNN (Debian: libdnnl-dev)"); }
bool sgemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t, float, float*,
           int64_t) {
  throw not_built();
}
void bf16_gemm(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t*, int64_t, const uint16_t*, int64_t, float,
               float*, int64_t) {
  throw not_built();
}
bool team_sgemm(int, bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*,
                int64_t) {
  throw not_built();
}
void team_bf16_gemm(int, bool, bool, int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t,
                    float*, int64_t) {
  throw not_built();
}
std::vector<std::string> implementations_used() { return {}; }
std::string version() { return ""; }

#endif

}  // namespace tapegrad::onednn_detail
