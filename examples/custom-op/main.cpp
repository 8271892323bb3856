// custom_op gradcheck [--op NAME] [-v] [--json] ...   checks the ops of this project (exit 0 when all pass)
// custom_op claims [--op NAME] ...                     checks the claimed derivatives (exit 1: they are wrong)
#include <string_view>

#include "engine/gradcheck/cli.hpp"
#include "my_ops.hpp"

int main(int argc, char** argv) {
  tapegrad::Registry ops, claims;
  register_rms_norm(ops);
  register_softsign(ops);
  register_rms_norm_claims(claims);
  if (argc > 1 && std::string_view(argv[1]) == "claims") return tapegrad::gradcheck_main(claims, argc - 1, argv + 1);
  return tapegrad::gradcheck_main(ops, argc, argv);
}
