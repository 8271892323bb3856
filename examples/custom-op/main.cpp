// custom_op gradcheck [--op NAME] [-v] [--json] ...   checks the ops of this project (exit 0 when all pass)
// custom_op claims [--op NAME] ...                     checks the claimed derivatives (exit 1: they are wrong)
#include <string_view>

#include <tapegrad/tapegrad.hpp>

#include "ops/ops.hpp"

int main(int argc, char** argv) {
  const tapegrad::Registry ops{rms_norm_ops(), softsign_ops()}, claims{rms_norm_claims()};
  if (argc > 1 && std::string_view(argv[1]) == "claims") return tapegrad::gradcheck_main(claims, argc - 1, argv + 1);
  return tapegrad::gradcheck_main(ops, argc, argv);
}
