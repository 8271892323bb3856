// The subcommands of the tapegrad program. Each adds itself to the app and runs from its callback.
#pragma once

#include <CLI/CLI.hpp>

namespace tapegrad::cli {

void add_gradcheck_command(CLI::App& app);

// The exit code the subcommand that ran asks for (0 when all went well).
int exit_code();
void set_exit_code(int code);

}  // namespace tapegrad::cli
