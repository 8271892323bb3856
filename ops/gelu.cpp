// The GELU kernels of ops/gelu.hpp, float32 and float64, compiled here once with the library's flags (-O3, and
// x86-64-v3 without FMA contraction where it is built for it) and their AVX-512 copies beside them: the gelu and
// gelu_erf nodes, the fused MLP, tests and any program linking tapegrad all run this code, and the check for the
// AVX-512 copy is made here, once, with the flags the kernels were compiled with.
#include "ops/gelu.hpp"

namespace tapegrad {

bool gelu_runs_avx512() {
#if TAPEGRAD_GELU_HAS_AVX512
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  }();
  return yes;
#else
  return false;
#endif
}

TAPEGRAD_GELU_KERNELS(template, float)
TAPEGRAD_GELU_KERNELS(template, double)

}  // namespace tapegrad
