// Which OpenBLAS kernels run, and whether this CPU runs better ones.
//
// A DYNAMIC_ARCH OpenBLAS (Debian's) picks its kernels, its "core", when the library loads: from
// OPENBLAS_CORETYPE if set, else from the CPU's vendor and model number. On a model it does not know (0.3.21 on
// Intel family 6 model 207, Emerald Rapids) it falls back to Prescott, SSE3 kernels: sgemm 3-5x slower than the
// SkylakeX kernels the CPU runs. The core cannot change once the library is loaded, so the remedy is
// OPENBLAS_CORETYPE before the program starts: the tapegrad program runs itself again with it set
// (tools/main.cpp); any other program that links the library gets a warning at its first matrix product.
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace tapegrad {

// What cpuid says this CPU runs. The AVX and AVX-512 flags count only where the OS saves the registers (XCR0).
// Everything is false on a build for another architecture.
struct CpuFeatures {
  bool x86_64 = false;
  std::string vendor;         // "GenuineIntel", "AuthenticAMD", ...
  int family = 0, model = 0;  // with the extended fields: Emerald Rapids is family 6, model 207
  bool avx = false, avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false, avx512bf16 = false;
  bool amx_bf16 = false;  // AMX tiles with bf16 products (and the OS saves the tile state)
  // The AVX-512 the engine's own kernels and its rule for products count on: F, BW, DQ and VL.
  bool avx512() const { return avx512f && avx512bw && avx512dq && avx512vl; }
};
CpuFeatures cpu_features();

// The OpenBLAS core to set (OPENBLAS_CORETYPE) when `core_in_use` is weaker than what `cpu` runs; nothing when it
// is not, on a build for another architecture, or when `coretype_env` (the user's OPENBLAS_CORETYPE) is set.
std::optional<std::string> better_blas_core(const CpuFeatures& cpu, std::string_view core_in_use,
                                            std::optional<std::string_view> coretype_env);

struct BlasInfo {
  std::string library;                      // "OpenBLAS 0.3.21"
  std::string config;                       // openblas_get_config()
  std::string core;                         // openblas_get_corename(): the kernels in use
  int threads = 0;                          // openblas_get_num_threads() (1 once the engine's pool has started)
  std::optional<std::string> coretype_env;  // OPENBLAS_CORETYPE, if set (an empty value is unset)
  // A core this CPU runs faster than `core`, whoever chose `core`: better_blas_core without the user's choice.
  std::optional<std::string> better_core;
  std::string cpu;  // the model name and the widest vector tier: "AMD EPYC (AVX-512)"
};
// For tests: where TAPEGRAD_FAKE_BLAS_CORE is set and OPENBLAS_CORETYPE is not, its value is reported as the
// core in use, so that a test sees a weak pick on any machine. TAPEGRAD_BLAS_CHECK=off leaves better_core empty:
// no advice, no warning and no second run of the tapegrad program.
BlasInfo blas_info();
// One line: "OpenBLAS 0.3.21, Cooperlake kernels", then ", OPENBLAS_CORETYPE=X set" when set, then
// "; this CPU runs SkylakeX kernels: set OPENBLAS_CORETYPE=SkylakeX" when a better core exists.
std::string blas_summary(const BlasInfo& info);
// {library, config, core, threads, coretype_env (null if unset), better_core (null if none), cpu}
nlohmann::json blas_json(const BlasInfo& info);

// Prints one line on stderr, the first time it is called, when blas_info().better_core is set. The engine's
// gemm calls it; a program that reports on the core itself calls blas_core_warning_given() first.
void warn_if_weak_blas_core();
// From now on warn_if_weak_blas_core() prints nothing.
void blas_core_warning_given();

namespace blas_detail {
// Set once the core was checked (or the check waived): gemm's fast path is one relaxed load of it.
inline std::atomic<bool> core_checked{false};
}  // namespace blas_detail

}  // namespace tapegrad
