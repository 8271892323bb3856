// The GELU kernels of ops/gelu.hpp, float32 and float64, compiled here once with the library's flags (-O3, and
// x86-64-v3 without FMA contraction where it is built for it) and their AVX-512 copies beside them: the gelu and
// gelu_erf nodes, the fused MLP, tests and any program linking tapegrad all run this code.
#include "ops/gelu.hpp"

namespace tapegrad {

TAPEGRAD_GELU_KERNELS(template, float)
TAPEGRAD_GELU_KERNELS(template, double)

}  // namespace tapegrad
