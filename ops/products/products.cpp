#include "ops/products/products.hpp"

#include <atomic>
#include <cstdlib>
#include <optional>
#include <string_view>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "ops/products/blas_info.hpp"
#include "ops/products/onednn_gemm.hpp"
#include "ops/products/small_products.hpp"
#include "engine/tensor.hpp"

namespace tapegrad {

namespace {

// The rule (product_backend). Measured with one thread per product, as the engine's pool runs them, median of
// five timings, GFLOP/s of OpenBLAS 0.3.21's sgemm against oneDNN 2.6.3's matmul (brg:avx512_core):
//   AMD EPYC Zen 4 (AVX-512), the default model's products (768, 128, 384|128|512) and (768, 512, 128), as is and
//   transposed as the VJPs read them: oneDNN 1.07-1.14x; (4096, 384, 1536) and (4096, 1536, 384): 1.04-1.11x;
//   (128, 64, 128) and (256, 32, 256): 1.11-1.16x; at 64³ (2^18 multiply-adds) even; below, the attention's
//   per-head products at T = 64 (64, 32, 64) and (64, 64, 32): 0.67-0.92x; the head's 65 outputs (768, 128, 65)
//   and (384, 128, 65): 0.97x.
//   A 16-core Intel Xeon (family 6 model 207, AVX-512, AMX): oneDNN 1.3-1.8x at the five shapes measured there.
//   AMD EPYC Zen 3 (AVX2, no AVX-512): 1.04-1.35x on four shapes, 0.71x on (768, 512, 128): no rule wins there
//   yet, so AVX2 CPUs keep OpenBLAS.
// Below 2^19 multiply-adds the engine's own kernel (ops/products/small_products.hpp) ran an attention head's
// products faster than either library, one thread, median of seven, AMD EPYC Zen 5 (AVX-512), GFLOP/s of the
// kernel against OpenBLAS (Haswell kernels) and oneDNN: (64, 32, 32)ᵀ· 169 vs 102 and 87; (32, 64, 32) 163 vs 99
// and 98; 64³ 216 vs 109 and 169; (32, 32, 64)·ᵀ 105 vs 86 and 71, B transposed and packed at every call (an
// attention node packs Kᵀ and Vᵀ once per head instead). Its AVX2 form reached 44-63, below OpenBLAS' 80-113.
// Above 2^19, one thread of an AMD EPYC Zen 5 (AVX-512), best of seven, GFLOP/s of the engine's kernel against
// oneDNN on a thread's half of each of the default model's products: (384, 128, 512) 247 vs 250, (384, 128, 384)
// 243 vs 247, (384, 512, 128) 256 vs 257, (384, 128, 128) 257 vs 251, with B transposed (384, 512, 128) 252 vs
// 251 (and 218 vs 254 at (384, 128, 512), where the kernel packed Bᵀ at every call); every element the same bits,
// since both sum over k in order, one FMA a term (300 steps of the default model gave the same losses and
// checkpoint on either). With Aᵀ (the weight gradients) 224-251 vs 236-238, and other bits. At nanoGPT's
// shakespeare-char shape, a thread's half, best of seven: k = 384 even ((2048, 384, 1536) 237 vs 239, with Bᵀ packed
// at the call 236 vs 243; (2048, 384, 1152) 246 vs 243), the same bits; k = 1536 slower ((2048, 1536, 384) 203 vs
// 220, with Bᵀ 198 vs 234) and other bits: the kernel keeps a tile's sums in registers over all of k, where oneDNN
// blocks k. A product split over the pool gives oneDNN all of B in every block, which it packs into its own layout
// in each thread, so its packing grows with the thread count; the kernel reads B where it lies (as is, a width a
// multiple of 16) or one copy packed once for every block (ops/products/blas.hpp). With the 48 rows a thread of 16
// takes of the default model's products: (48, 128, 512) 25.3 vs 27.9 µs, (48, 512, 128) 24.1 vs 25.1 µs.
// So: on a CPU with AVX-512 (F, BW, DQ, VL), the engine's kernel for products of fewer than 2^19 multiply-adds and
// for larger ones whose A is read as it is, whose k is at most 1024 and whose width n is a multiple of 16 (one
// AVX-512 register of floats); oneDNN for the other large ones of such a width; OpenBLAS for the rest and on every
// other CPU.
constexpr int64_t kOneDnnMinMacs = int64_t{1} << 19;
constexpr int64_t kEngineMaxDepth = 1024;
constexpr int64_t kOneDnnWidthMultiple = 16;

struct Choice {
  std::optional<ProductBackend> forced;  // TAPEGRAD_GEMM
  std::string forced_text;
  CpuFeatures cpu;
  bool onednn_for_large = false;  // the rule's CPU class
};

Choice read_choice() {
  Choice choice;
  const char* env = std::getenv("TAPEGRAD_GEMM");
  const std::string_view value = env ? env : "";
  if (value == "openblas") choice.forced = ProductBackend::openblas;
  else if (value == "onednn") {
    if (!onednn_built())
      throw Error("TAPEGRAD_GEMM=onednn: tapegrad was built without oneDNN (Debian: libdnnl-dev); use openblas");
    choice.forced = ProductBackend::onednn;
  } else if (!value.empty() && value != "auto")
    throw Error(fmt::format("TAPEGRAD_GEMM={}: expected openblas, onednn or auto", value));
  if (choice.forced) choice.forced_text = std::string(value);
  choice.cpu = cpu_features();
  choice.onednn_for_large = onednn_built() && choice.cpu.avx512();
  return choice;
}

const Choice& choice() {
  static const Choice c = read_choice();
  return c;
}

std::atomic<ProductPrecision> precision{ProductPrecision::f32};
std::atomic<Bf16Reach> reach{Bf16Reach::large_products};
std::atomic<double> emulated_operand_roundoff{0}, emulated_result_roundoff{0};
std::atomic<uint64_t> emulated_seed{0};
std::atomic<ProductLog*> log{nullptr};

}  // namespace

const char* backend_name(ProductBackend backend) {
  return backend == ProductBackend::onednn ? "oneDNN" : backend == ProductBackend::engine ? "engine" : "OpenBLAS";
}
const char* precision_name(ProductPrecision p) { return p == ProductPrecision::bf16 ? "bf16" : "f32"; }

bool onednn_built() {
#ifdef TAPEGRAD_HAVE_ONEDNN
  return true;
#else
  return false;
#endif
}

std::string onednn_version() { return onednn_built() ? "oneDNN " + onednn_detail::version() : ""; }

ProductBackend backend_by_rule(const CpuFeatures& cpu, bool with_onednn, int64_t m, int64_t n, int64_t k,
                               bool a_transposed) {
  if (!cpu.avx512()) return ProductBackend::openblas;
  if (m * n * k < kOneDnnMinMacs) return ProductBackend::engine;
  if (n % kOneDnnWidthMultiple != 0) return ProductBackend::openblas;
  if (!a_transposed && k <= kEngineMaxDepth) return ProductBackend::engine;
  return with_onednn ? ProductBackend::onednn : ProductBackend::openblas;
}

ProductBackend product_backend(int64_t m, int64_t n, int64_t k, bool a_transposed) {
  const Choice& c = choice();
  if (c.forced) return *c.forced;
  return backend_by_rule(c.cpu, onednn_built(), m, n, k, a_transposed);
}

std::string bf16_unavailable_reason() {
  if (!onednn_built()) return "tapegrad was built without oneDNN (Debian: libdnnl-dev), which runs bf16 products";
  const CpuFeatures cpu = cpu_features();
  const char* fake = std::getenv("TAPEGRAD_FAKE_NO_BF16");
  if ((!cpu.avx512bf16 && !cpu.amx_bf16) || (fake && std::string_view(fake) == "1"))
    return fmt::format("this CPU ({}) has neither AVX512_BF16 nor AMX-BF16", blas_info().cpu);
  return "";
}

void set_product_precision(ProductPrecision p) {
  if (p == ProductPrecision::bf16) {
    const std::string why = bf16_unavailable_reason();
    if (!why.empty()) throw Error("bf16 products: " + why);
  }
  precision.store(p, std::memory_order_relaxed);
}

ProductPrecision product_precision() { return precision.load(std::memory_order_relaxed); }

void set_product_log(ProductLog* l) { log.store(l, std::memory_order_release); }
ProductLog* product_log() { return log.load(std::memory_order_acquire); }

void set_bf16_reach(Bf16Reach r) { reach.store(r, std::memory_order_relaxed); }
Bf16Reach bf16_reach() { return reach.load(std::memory_order_relaxed); }

bool runs_in_bf16(int64_t m, int64_t n, int64_t k) {
  return product_precision() == ProductPrecision::bf16 &&
         (bf16_reach() == Bf16Reach::every_product || m * n * k >= kOneDnnMinMacs);
}

double unit_roundoff(ProductPrecision p) {
  return p == ProductPrecision::bf16 ? kBf16UnitRoundoff : kFloat32UnitRoundoff;
}

void set_emulated_rounding(EmulatedRounding r) {
  for (const double u : {r.operand_roundoff, r.result_roundoff})
    if (!(u >= 0 && u < 1)) throw Error(fmt::format("emulated rounding: unit roundoff {} is not in [0, 1)", u));
  emulated_seed.store(r.seed, std::memory_order_relaxed);
  emulated_operand_roundoff.store(r.operand_roundoff, std::memory_order_relaxed);
  emulated_result_roundoff.store(r.result_roundoff, std::memory_order_relaxed);
}
EmulatedRounding emulated_rounding() {
  return {emulated_operand_roundoff.load(std::memory_order_relaxed),
          emulated_result_roundoff.load(std::memory_order_relaxed), emulated_seed.load(std::memory_order_relaxed)};
}

ProductPrecision parse_precision(const std::string& text) {
  if (text == "f32" || text == "float32") return ProductPrecision::f32;
  if (text == "bf16" || text == "bfloat16") return ProductPrecision::bf16;
  throw Error(fmt::format("precision '{}': expected f32 or bf16", text));
}

std::string products_summary() {
  const Choice& c = choice();
  std::string rule;
  if (c.forced) rule = fmt::format("{} (TAPEGRAD_GEMM={})", backend_name(*c.forced), c.forced_text);
  else if (c.onednn_for_large)
    rule = fmt::format(
        "the engine's AVX-512 kernel below 2^19 multiply-adds and above for A as is with k <= 1024, "
        "{} for the other large ones, where the width is a multiple of 16; OpenBLAS for the rest",
        onednn_version());
  else if (c.cpu.avx512())
    rule =
        "the engine's AVX-512 kernel below 2^19 multiply-adds and above for A as is with k <= 1024, where the width "
        "is a multiple of 16; OpenBLAS for the rest (built without oneDNN)";
  else if (onednn_built()) rule = "OpenBLAS (oneDNN is built in; the rule keeps OpenBLAS on CPUs without AVX-512)";
  else rule = "OpenBLAS (built without oneDNN)";
  std::string text = fmt::format("products: {}; precision {}", rule, precision_name(product_precision()));
  if (product_precision() == ProductPrecision::bf16 && bf16_reach() == Bf16Reach::every_product)
    text += fmt::format(" for every product ({}, float32 accumulation)", onednn_version());
  else if (product_precision() == ProductPrecision::bf16 && small_bf16_kernel_available())
    text += fmt::format(
        " for every product ({} from 2^19 multiply-adds, the engine's bf16 tiles below; float32 "
        "accumulation)",
        onednn_version());
  else if (product_precision() == ProductPrecision::bf16)
    text +=
        fmt::format(" for products of >= 2^19 multiply-adds ({}, float32 accumulation), f32 below", onednn_version());
  return text;
}

nlohmann::json products_json() {
  const Choice& c = choice();
  const CpuFeatures cpu = cpu_features();
  nlohmann::json j;
  j["rule"] = c.forced             ? std::string("forced")
              : c.onednn_for_large ? std::string("onednn_for_large")
                                   : std::string("openblas");
  j["forced"] = c.forced ? nlohmann::json(c.forced_text) : nlohmann::json(nullptr);
  j["onednn"] = onednn_built() ? nlohmann::json(onednn_version()) : nlohmann::json(nullptr);
  j["onednn_implementations"] = onednn_detail::implementations_used();
  j["precision"] = precision_name(product_precision());
  j["bf16_units"] = cpu.amx_bf16 ? "AMX-BF16" : cpu.avx512bf16 ? "AVX512_BF16" : "none";
  j["summary"] = products_summary();
  return j;
}

}  // namespace tapegrad
