// tapegrad: one program, one subcommand per job. Errors in the input exit with code 2 and a one-line message.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/products/blas_info.hpp"
#include "ops/products/products.hpp"
#include "engine/tensor.hpp"
#include "tools/commands.hpp"

namespace {

// Errors are reported on one line: line breaks inside a message (a parser's, the system's) become spaces.
void report(const char* what, const char* hint = "") {
  std::string line = what;
  for (char& c : line)
    if (c == '\n' || c == '\r') c = ' ';
  // fputs, not fmt::print, which throws where stderr cannot be written: the exit code still says what happened.
  std::fputs(fmt::format("tapegrad: error: {}{}\n", line, hint).c_str(), stderr);
}

// OpenBLAS chose its kernels when it loaded; where it chose weaker ones than this CPU runs (an Intel model it does
// not know gets Prescott's: sgemm 3-5x slower), run again with OPENBLAS_CORETYPE set. A value the user set is
// kept, and TAPEGRAD_BLAS_REEXEC marks the second run: in both cases a weak core is only warned about.
void use_best_blas_core(const tapegrad::BlasInfo& blas, char** argv) {
  if (blas.better_core && !blas.coretype_env && !std::getenv("TAPEGRAD_BLAS_REEXEC")) {
    fmt::print(stderr,
               "tapegrad: OpenBLAS picked {} kernels for this CPU ({}); running again with "
               "OPENBLAS_CORETYPE={}\n",
               blas.core, blas.cpu, *blas.better_core);
    std::fflush(stdout);
    if (setenv("OPENBLAS_CORETYPE", blas.better_core->c_str(), 1) == 0 && setenv("TAPEGRAD_BLAS_REEXEC", "1", 1) == 0)
      execv("/proc/self/exe", argv);
    const int error = errno;
    unsetenv("OPENBLAS_CORETYPE");  // not in effect: OpenBLAS has loaded
    unsetenv("TAPEGRAD_BLAS_REEXEC");
    fmt::print(stderr, "tapegrad: warning: could not run again: {}\n", std::strerror(error));
  }
  if (blas.better_core) tapegrad::warn_if_weak_blas_core();
  tapegrad::blas_core_warning_given();
}

// An integer option's value is read as people write it: decimal digits with an optional sign, leading zeros
// included (010 is ten), and anything else refused with the option's value (0x10, 1e3, 0b1), as is a value beyond
// its type's range. CLI11 alone reads 010 as octal and 0x10 as hex, and 99999999999999999999 into an int64 as
// INT64_MAX, without a word. The validator rewrites the value without its leading zeros, which CLI11 then reads.
CLI::Validator integer_in_range(bool is_unsigned) {
  return CLI::Validator(
      [is_unsigned](std::string& s) -> std::string {
        const bool negative = !s.empty() && s[0] == '-';
        const bool sign = negative || (!s.empty() && s[0] == '+');
        std::string_view digits = std::string_view(s).substr(sign ? 1 : 0);
        if (digits.empty() || digits.find_first_not_of("0123456789") != std::string_view::npos)
          return fmt::format("{} is not a decimal integer", s);
        if (is_unsigned && negative) return fmt::format("must be non-negative, got {}", s);
        while (digits.size() > 1 && digits[0] == '0') digits.remove_prefix(1);
        const std::string value = (negative ? "-" : "") + std::string(digits);
        bool fits;
        if (is_unsigned) {
          uint64_t v = 0;
          fits = std::from_chars(value.data(), value.data() + value.size(), v).ec == std::errc();
        } else {
          int64_t v = 0;
          fits = std::from_chars(value.data(), value.data() + value.size(), v).ec == std::errc();
        }
        if (!fits) return fmt::format("{} is out of range for a 64-bit {}integer", s, is_unsigned ? "unsigned " : "");
        s = value;
        return {};
      },
      "", "");
}

void refuse_out_of_range_integers(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    // transform: it runs before the option's other checks, and may rewrite the value
    if (type.rfind("UINT", 0) == 0) option->transform(integer_in_range(true));
    else if (type.rfind("INT", 0) == 0) option->transform(integer_in_range(false));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) refuse_out_of_range_integers(*sub);
}

}  // namespace

int main(int argc, char** argv) {
  const tapegrad::BlasInfo blas = tapegrad::blas_info();
  use_best_blas_core(blas, argv);
  CLI::App app{"tapegrad: a small reverse-mode autodiff engine for attention, with hand-derived VJPs and JVPs"};
  app.require_subcommand(1);
  std::string products;
  try {
    products = tapegrad::products_summary();  // reads TAPEGRAD_GEMM: a bad value is refused before anything runs
  } catch (const tapegrad::Error& e) {
    report(e.what());
    return 2;
  }
  app.set_version_flag("--version",
                       fmt::format("tapegrad {}\n{}\n{}", TAPEGRAD_VERSION, tapegrad::blas_summary(blas), products));
  app.set_help_all_flag("--help-all", "Print help for every subcommand");
  // TakeLast: the command line overrides --config. An option given twice on the command line itself is refused
  // (refuse_repeated_options, below), not taken last.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  tapegrad::cli::add_gradcheck_command(app);
  tapegrad::cli::add_explain_command(app);
  tapegrad::cli::add_claim_command(app);
  tapegrad::cli::add_exercise_command(app);
  tapegrad::cli::add_training_commands(app);
  tapegrad::cli::add_compare_command(app);
  tapegrad::cli::add_evaluate_command(app);
  tapegrad::cli::add_bench_command(app);
  tapegrad::cli::add_graph_command(app);
  tapegrad::cli::refuse_non_finite_numbers(app);
  refuse_out_of_range_integers(app);
  // After every option is read and before any subcommand runs (CLI11 calls it before the subcommands' callbacks).
  app.parse_complete_callback([&app] { tapegrad::cli::refuse_repeated_options(app); });
  try {
    std::vector<std::string> args = tapegrad::cli::arguments_with_config_file(argc, argv);
    std::reverse(args.begin(), args.end());  // CLI11 takes a vector of arguments last first
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    report(e.what(), " (tapegrad --help for usage)");
    return 2;
  } catch (const tapegrad::Error& e) {
    report(e.what());
    return 2;
  } catch (const std::out_of_range& e) {  // CLI11 2.1 lets std::stoll's escape: --no-bias=99999999999999999999
    report(fmt::format("a number in the arguments or the config file is out of range ({})", e.what()).c_str(),
           " (tapegrad --help for usage)");
    return 2;
  } catch (const std::bad_alloc&) {  // past every estimate: said in words, not as "std::bad_alloc"
    report("out of memory: an allocation failed",
           "; give the command smaller inputs or a smaller model, or run it "
           "where more memory is free");
    return 2;
  } catch (const std::exception& e) {
    report(e.what());
    return 2;
  }
  // Output that could not be written (a full disk, a closed pipe, /dev/full) is a failure, not exit 0.
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    report(fmt::format("could not write the output: {}", std::strerror(errno)).c_str());
    return 2;
  }
  return tapegrad::cli::exit_code();
}
