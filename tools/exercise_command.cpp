// tapegrad exercise: the exercises of docs/reverse-mode.md and docs/learn.md (docs/exercises.txt,
// checker/formulas/exercise.hpp). Without a name, the list by chapter; with one, its task; with --vjp or --jvp, the
// learner's rule checked, its diagnosis the hint. Exit 0 when the rule holds (or nothing was checked), 1 when it is
// wrong, 2 for a usage or formula error.
#include <memory>

#include <fmt/format.h>

#include "checker/formulas/exercise.hpp"
#include "checker/formulas/expression.hpp"
#include "models/files.hpp"
#include "tools/commands.hpp"

namespace tapegrad::cli {

namespace {

constexpr size_t kMaxExerciseFileBytes = size_t{1} << 20;

struct ExerciseArgs {
  std::string name, file;
  std::vector<std::string> vjps;
  std::string jvp;
  bool solution = false;
  GradcheckOptions options;
};

void print_list(const std::vector<Exercise>& all) {
  std::string chapter;
  for (const Exercise& e : all) {
    if (e.chapter != chapter) fmt::print("{}{}\n", chapter.empty() ? "" : "\n", chapter = e.chapter);
    const std::string first =
        e.task.substr(0, e.task.find(". ") == std::string::npos ? e.task.size() : e.task.find(". ") + 1);
    fmt::print("  {:<20} {}\n", e.name, first);
  }
  fmt::print("\ntapegrad exercise NAME shows one; tapegrad exercise NAME --vjp \"x = ...\" checks your answer.\n");
}

void print_task(const Exercise& e) {
  fmt::print("{}: {}\n{}\n\n", e.name, e.chapter, e.task);
  for (const InputSpec& in : e.given.inputs) fmt::print("  input    {} {}\n", in.name, in.shape.str());
  for (const ClaimText::Line& l : e.given.lets) fmt::print("  let      {} = {}\n", l.name, l.formula);
  fmt::print("  forward  y = {}\n\nWrite", e.given.forward.formula);
  for (const std::string& rule : e.answer) {
    const std::string input = rule.substr(4, rule.find_first_of(" =", 4) - 4);  // "vjp x = F": x
    fmt::print(" --{}",
               rule.rfind("jvp", 0) == 0 ? std::string("jvp \"...\"") : fmt::format("vjp \"{} = ...\"", input));
  }
  fmt::print(" (g is ȳ, y the forward's value; docs/claims/README.md lists the functions)\n");
}

int run_exercise(const ExerciseArgs& a) {
  const std::string path = a.file.empty() ? shared_file("docs/exercises.txt") : a.file;
  const std::vector<Exercise> all = parse_exercises(read_file(path, kMaxExerciseFileBytes), path);
  if (a.name.empty()) {
    print_list(all);
    return 0;
  }
  const auto e = std::find_if(all.begin(), all.end(), [&](const Exercise& x) { return x.name == a.name; });
  if (e == all.end()) fail("exercise: no exercise is named '{}' (tapegrad exercise lists them)", a.name);
  if (a.solution) {
    for (const std::string& rule : e->answer) fmt::print("{}\n", rule);
    return 0;
  }
  std::vector<std::string> rules;
  for (const std::string& v : a.vjps) rules.push_back("vjp " + v);
  if (!a.jvp.empty()) rules.push_back("jvp " + a.jvp);
  if (rules.empty()) {
    print_task(*e);
    return 0;
  }
  require_claim_memory(exercise_claim(*e, rules));  // check_exercise parses and shape-checks before any value
  const GradcheckReport r = check_exercise(*e, rules, a.options);
  if (r.passed) {
    fmt::print("{}: right. Your rule agrees with finite differences of the forward.\n{}", e->name, r.str());
    return 0;
  }
  fmt::print("{}: not yet.\n{}", e->name, r.str(GradcheckReport::Order::diagnosis_first));
  return 1;
}

}  // namespace

void add_exercise_command(CLI::App& app) {
  auto args = std::make_shared<ExerciseArgs>();
  CLI::App* cmd = app.add_subcommand(
      "exercise",
      "The exercises of docs/reverse-mode.md and docs/learn.md: derive a rule (a VJP or JVP, as formulas) for a "
      "forward that is given, and have it checked against finite differences, the diagnosis as the hint (exit 1 "
      "when it is wrong)");
  cmd->add_option("name", args->name, "The exercise (none: the list, by chapter)");
  cmd->add_option("--vjp", args->vjps, "NAME=FORMULA: your x̄ of input NAME, from the inputs, y and g (repeatable)");
  cmd->add_option("--jvp", args->jvp, "FORMULA: your ẏ, from the inputs, y and the tangents t_NAME");
  cmd->add_flag("--solution", args->solution, "Print the exercise's answer");
  cmd->add_option("--file", args->file, "A file of exercises in place of docs/exercises.txt")->check(existing_file());
  cmd->add_option("--seed", args->options.seed, "Seed of the random inputs and projections")->capture_default_str();
  cmd->callback([args] {
    try {
      set_exit_code(run_exercise(*args));
    } catch (const ExpressionError& e) {
      std::fflush(stdout);
      fmt::print(stderr, "tapegrad: error: {}\n", e.what());
      set_exit_code(2);
    }
  });
}

}  // namespace tapegrad::cli
