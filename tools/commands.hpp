// The subcommands of the tapegrad program. Each adds itself to the app and runs from its callback.
#pragma once

#include <CLI/CLI.hpp>

namespace tapegrad::cli {

void add_gradcheck_command(CLI::App& app);
void add_explain_command(CLI::App& app);
void add_claim_command(CLI::App& app);
void add_exercise_command(CLI::App& app);
void add_training_commands(CLI::App& app);  // train, sample
void add_compare_command(CLI::App& app);
void add_evaluate_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_graph_command(CLI::App& app);
}  // namespace tapegrad::cli
namespace tapegrad {
struct TrainConfig;
struct GPTConfig;
enum class ProductPrecision;
}  // namespace tapegrad
namespace tapegrad::cli {
// Checks with one-line messages: "--lr: must be positive, got -1".
const CLI::Validator& positive();
// Adds a check that the value is finite (not inf, nan or out of double's range) to every floating option of `app`
// and its subcommands, options and config-file keys alike: main calls it once, after every command is added.
void refuse_non_finite_numbers(CLI::App& app);
const CLI::Validator& non_negative();
// An input file that exists, can be reached and is a regular file: "no such file", "is a directory", "is not a
// regular file (a fifo)", or the system's reason
// ("Permission denied" for a file in a directory the user cannot enter), in place of CLI11's ExistingFile, which
// says "does not exist" for all of them.
const CLI::Validator& existing_file();

// The GPT's options (--attention when asked, --n-layer, --n-head, --n-embd, --block-size, --dropout, --bias),
// each help text after `lead`.
void add_model_options(CLI::App* cmd, GPTConfig& m, bool attention_option, const std::string& lead);
// The options train and compare share (every field of TrainConfig has a flag).
// --precision f32|bf16 (ops/products/products.hpp): train and compare through add_train_options, and bench.
void add_precision_option(CLI::App* cmd, ProductPrecision& precision);
void add_train_options(CLI::App* cmd, TrainConfig& c, bool attention_option);
// The train subcommand and its options, parsing into `cfg`; no action attached (the config-file fuzz target
// parses with it too).
CLI::App* add_train_subcommand(CLI::App& app, TrainConfig& cfg);

// The command line with the options of a `--config FILE` spliced in after the subcommand's name.
std::vector<std::string> arguments_with_config_file(int argc, char** argv);
// The --config files arguments_with_config_file read, in order (train refuses to write over them).
const std::vector<std::string>& config_files_read();
// The `--key=value` arguments of a config file's `key = value` lines (CLI11's INI reader). Throws an Error naming
// `path` for text that is not UTF-8 (a NUL byte, an ill-formed sequence) or that the reader refuses.
std::vector<std::string> config_file_arguments(const std::string& path, std::string_view text);

// Refuses an option that takes one value (or a flag) given more than once on the command line, naming it: CLI11
// would keep the last one given without a word. A config file's key that the command line gives again is not a
// repeat: the command line overrides the file (a key given twice in one file is refused as the file is read). main
// runs it once the command line is parsed, before the subcommand's callback.
void refuse_repeated_options(const CLI::App& app);

// The exit code the subcommand that ran asks for (0 when all went well).
int exit_code();
void set_exit_code(int code);

}  // namespace tapegrad::cli
