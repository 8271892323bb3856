// tapegrad: one program, one subcommand per job. Errors in the input exit with code 2 and a one-line message.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "engine/tensor.hpp"
#include "tools/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"tapegrad: a small reverse-mode autodiff engine for attention, with hand-derived VJPs and JVPs"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Print help for every subcommand");
  tapegrad::cli::add_gradcheck_command(app);
  tapegrad::cli::add_training_commands(app);
  tapegrad::cli::add_compare_command(app);
  tapegrad::cli::add_evaluate_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "tapegrad: error: {}\n", e.what());
    fmt::print(stderr, "Run 'tapegrad --help' for usage.\n");
    return 2;
  } catch (const tapegrad::Error& e) {
    fmt::print(stderr, "tapegrad: error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "tapegrad: error: {}\n", e.what());
    return 2;
  }
  return tapegrad::cli::exit_code();
}
