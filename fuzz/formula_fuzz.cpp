// libFuzzer entry point: the formula target of fuzz/fuzz_targets.hpp.
#include "fuzz/fuzz_targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return tapegrad::fuzz::formula_input(data, size);
}
