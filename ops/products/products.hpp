// Which library runs each float32 matrix product, and in which precision.
//
// Three product backends sit behind ops/products/blas.hpp's one gemm():
//   - OpenBLAS (cblas_sgemm): the project's BLAS, on every machine, and every float64 product (the gradchecker's);
//   - oneDNN (Debian's libdnnl, its matmul primitive), where tapegrad was built with it and it measured faster;
//   - the engine's own kernel (ops/products/small_products.hpp), on AVX-512 CPUs: small float32 products, and large
//     ones whose A is read as it is (x·Wᵀ, ȳ·W), with op(B) read where it lies or packed once for every thread.
// Which one runs a float32 product is a fixed rule of the CPU class and the product's shape (product_backend
// below, with the measurements it comes from), never a timing taken at run time: the same product runs on the
// same kernels in every run, so a seed gives the same losses bit for bit on one machine and thread count.
// TAPEGRAD_GEMM=openblas|onednn in the environment overrides the rule for every float32 product ("auto", or
// unset, keeps it).
//
// Precision. In f32 mode (the default) a product reads and accumulates float32. In bf16 mode every float32
// product rounds copies of its two operands to bfloat16 (8 bits of mantissa, round to nearest even) and
// accumulates in float32 on the CPU's bf16 units: through oneDNN (AVX512_BF16 or AMX-BF16) from 2^19
// multiply-adds (runs_in_bf16; Bf16Reach::every_product sends all of them there), on the engine's own bf16 tiles
// below (an attention head's products; ops/products/small_products.hpp, where the CPU has AVX512_BF16, else they
// stay float32); C stays float32, and
// so do the tensors, the parameters, the optimizer state and the gradients. float64 products are never rounded
// (but under an emulated rounding, below, which moves them as another precision's rounding would).
// bf16 is a mode of the products, not a tensor dtype: the products are where the units pay off, everything else
// (the element-wise ops, the reductions, the optimizer) keeps float32's accuracy, and no op needs a second
// kernel. The cost is one rounding pass over each operand per product, O(mk + kn) against the product's O(mnk).
//
// Threads: oneDNN runs single-threaded on the thread that calls it (its OpenMP team is held to one thread on
// every thread that calls it), under the engine's one pool exactly as OpenBLAS does (engine/parallel.hpp): large
// products are split by rows across the pool, small ones run whole inside the ops' parallel loops. No library
// starts threads of its own, so nothing oversubscribes the cores.
#pragma once

#include <bit>
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "../../engine/rng.hpp"

namespace tapegrad {

struct CpuFeatures;

enum class ProductBackend { openblas, onednn, engine };
enum class ProductPrecision { f32, bf16 };

const char* backend_name(ProductBackend backend);        // "OpenBLAS", "oneDNN", "engine"
const char* precision_name(ProductPrecision precision);  // "f32", "bf16"

// True where tapegrad was built with oneDNN.
bool onednn_built();
// "oneDNN 2.6.3" (the library loaded), or "" where tapegrad was built without it.
std::string onednn_version();

// The rule alone, as a function of the CPU, of whether oneDNN is built in, of the product's shape (m, n, k) and of
// whether A is read transposed (op(A) = Aᵀ).
ProductBackend backend_by_rule(const CpuFeatures& cpu, bool with_onednn, int64_t m, int64_t n, int64_t k,
                               bool a_transposed = false);

// The backend a float32 product C (m, n) = op(A) (m, k) · op(B) (k, n) runs on in f32 mode (in bf16 mode, oneDNN
// from 2^19 multiply-adds, below it the engine's bf16 tiles where the CPU has AVX512_BF16: runs_in_bf16). Throws
// tapegrad::Error once for a TAPEGRAD_GEMM value that is not openblas, onednn or auto, or onednn where tapegrad was
// built without it. Without TAPEGRAD_GEMM: backend_by_rule for this CPU and build.
ProductBackend product_backend(int64_t m, int64_t n, int64_t k, bool a_transposed = false);

// The precision of float32 products, for the whole program (every thread). set_product_precision(bf16) throws
// tapegrad::Error, and changes nothing, on a CPU without bf16 units or a build without oneDNN: the message names
// what is missing. Call it between steps, not while products run.
void set_product_precision(ProductPrecision precision);
ProductPrecision product_precision();
// Which float32 products bf16 mode rounds: by default those large enough to gain from it (runs_in_bf16 below);
// every_product rounds each one whatever its size, to see at a small size what bf16 does to a computation whose
// products are large when it trains (a node's check at bf16 on a gradcheck case). Set it as the precision is.
enum class Bf16Reach { large_products, every_product };
void set_bf16_reach(Bf16Reach reach);
Bf16Reach bf16_reach();
// Sets the precision (and bf16's reach) for a scope and puts the previous ones back at its end (throws as
// set_product_precision).
class PrecisionScope {
 public:
  explicit PrecisionScope(ProductPrecision p, Bf16Reach reach = Bf16Reach::large_products)
      : previous_(product_precision()), previous_reach_(bf16_reach()) {
    set_product_precision(p);
    set_bf16_reach(reach);
  }
  ~PrecisionScope() {
    set_bf16_reach(previous_reach_);
    set_product_precision(previous_);
  }
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  ProductPrecision previous_;
  Bf16Reach previous_reach_;
};
// Whether this float32 product runs in bf16 on oneDNN: in bf16 mode, those of at least 2^19 multiply-adds (every
// one with Bf16Reach::every_product). For smaller ones (an attention head's at T = 64) oneDNN's call and a separate
// rounding pass cost more than the faster product saves (the default model's attention took 4.3 ms a step with every
// product in bf16 on oneDNN, 2.3 in float32): they run on the engine's bf16 tiles, which round as they pack, where
// the CPU has AVX512_BF16 (small_bf16_kernel_available), else in float32 on the backend of the rule.
bool runs_in_bf16(int64_t m, int64_t n, int64_t k);
// The unit roundoff of a bf16 operand (8 significant bits: 2⁻⁸) and of a float32 one (24 bits: 2⁻²⁴): a rounded
// operand a' = a·(1 + δ) with |δ| ≤ u.
inline constexpr double kBf16UnitRoundoff = 0x1p-8;
inline constexpr double kFloat32UnitRoundoff = 0x1p-24;
double unit_roundoff(ProductPrecision precision);  // of a product's operands in that precision

// Emulated rounding of the float64 products: how far a float64 computation moves when its products are rounded as
// they would be at another precision, measured without running at that precision. While one is set, every float64
// product reads each element a of its two operands as a·(1 + σ(a)·u_operand), and leaves each element c of its
// result as c·(1 + σ(c)·u_result) (the operands of a bf16 product are rounded to bfloat16, its float32 result to
// float32). σ(a) = ±1 is drawn from a hash of a's bits and the seed: like a rounding, a function of the value alone
// (the same a moves the same way in every product), as far as a rounding at that unit roundoff can move it, in a
// direction no rounding rule favours; several seeds give several such roundings. The products still multiply and
// add in float64, and float32 products are never touched. Set it between computations, not while products run (it
// holds for every thread). Both unit roundoffs 0: none (the default).
struct EmulatedRounding {
  double operand_roundoff = 0;
  double result_roundoff = 0;
  uint64_t seed = 0;
  bool any() const { return operand_roundoff > 0 || result_roundoff > 0; }
};
void set_emulated_rounding(EmulatedRounding rounding);
EmulatedRounding emulated_rounding();
// a·(1 + σ(a)·u), σ(a) = ±1 from a's bits and the seed: a moved as a rounding at unit roundoff u could move it.
inline double emulate_rounding(double a, double u, uint64_t seed) {
  const uint64_t h = Rng(seed ^ std::bit_cast<uint64_t>(a)).next_u64();
  return a * (1 + ((h >> 63) ? -u : u));
}
// Sets an emulated rounding for a scope and puts the previous one back at its end.
class EmulatedRoundingScope {
 public:
  explicit EmulatedRoundingScope(EmulatedRounding r) : previous_(emulated_rounding()) { set_emulated_rounding(r); }
  ~EmulatedRoundingScope() { set_emulated_rounding(previous_); }
  EmulatedRoundingScope(const EmulatedRoundingScope&) = delete;
  EmulatedRoundingScope& operator=(const EmulatedRoundingScope&) = delete;

 private:
  EmulatedRounding previous_;
};
// Empty where bf16 products can run here, else why not ("this CPU (AMD EPYC (AVX2)) has neither AVX512_BF16 nor
// AMX-BF16"). For tests, TAPEGRAD_FAKE_NO_BF16=1 in the environment makes any CPU answer as one without bf16 units.
std::string bf16_unavailable_reason();
// Parses "f32" or "bf16"; throws tapegrad::Error naming the value otherwise.
ProductPrecision parse_precision(const std::string& text);

// A float32 product as gemm() (ops/products/blas.hpp) ran it, for a ProductLog.
struct ProductRun {
  int64_t m, n, k;        // C (m, n) = op(A) (m, k) · op(B) (k, n)
  bool trans_a, trans_b;  // op(A) = Aᵀ, op(B) = Bᵀ
  bool split;             // cut by rows of C across the pool; else run whole on the calling thread (small, or
                          // inside an op's parallel loop, where the other threads run products of their own)
  bool bf16;              // rounded to bfloat16, on oneDNN
  double seconds;         // its wall time on the calling thread, rounding included
};
// Something that sees every float32 product while it is installed: `tapegrad bench` reads a training step's
// products through one (tools/bench_products.cpp). record() is called from whichever thread ran the product,
// several at once. Installed, a product costs two clock reads more; not installed, one relaxed load.
class ProductLog {
 public:
  virtual ~ProductLog() = default;
  virtual void record(const ProductRun& run) = 0;
};
void set_product_log(ProductLog* log);  // nullptr removes it; install and remove between steps, not during one
ProductLog* product_log();

// One line for headers and --version: "float32 products: oneDNN 2.6.3 where ≥ 2^19 multiply-adds and the width is
// a multiple of 16, else OpenBLAS (rule for AVX-512 CPUs); precision f32".
std::string products_summary();
// {backend_rule, forced (null or the TAPEGRAD_GEMM value), onednn (null or version), precision, bf16_units}
nlohmann::json products_json();

}  // namespace tapegrad
