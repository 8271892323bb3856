// The subcommands of the tapegrad program. Each adds itself to the app and runs from its callback.
#pragma once

#include <CLI/CLI.hpp>

namespace tapegrad::cli {

void add_gradcheck_command(CLI::App& app);
void add_training_commands(CLI::App& app);  // train, sample
void add_compare_command(CLI::App& app);
void add_evaluate_command(CLI::App& app);
}  // namespace tapegrad::cli
namespace tapegrad { struct TrainConfig; }
namespace tapegrad::cli {
// The options train and compare share (every field of TrainConfig has a flag).
void add_train_options(CLI::App* cmd, TrainConfig& c, bool attention_option);

// The exit code the subcommand that ran asks for (0 when all went well).
int exit_code();
void set_exit_code(int code);

}  // namespace tapegrad::cli
