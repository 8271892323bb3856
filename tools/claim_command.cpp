// tapegrad claim: a derivative as written in a paper or a post, as formulas (checker/formulas/expression.hpp),
// checked against finite differences of its forward before any C++ is written (checker/formulas/claim.hpp).
// Exit 0 when every claim holds, 1 when one is wrong, 2 for a usage or formula error (with a caret under it).
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checker/formulas/claim.hpp"
#include "checker/formulas/expression.hpp"
#include "models/files.hpp"
#include "tools/commands.hpp"

namespace tapegrad::cli {

namespace {

constexpr size_t kMaxClaimFileBytes = size_t{16} << 20;  // a file of claims is text of a few kilobytes

struct ClaimArgs {
  std::vector<std::string> inputs, lets, vjps, hvps, files;
  std::string name = "claim", forward, jvp;
  bool json = false, edges = false;
  std::vector<std::string> undefined_edges;
  GradcheckOptions options;
};

// "NAME = FORMULA" of --let, --vjp and --hvp; a --vjp or --hvp without NAME = is the only input's.
std::pair<std::string, std::string> split_named(std::string_view option, const std::string& text,
                                                const std::vector<InputSpec>& inputs) {
  if (auto split = split_named_formula(text)) return *split;
  const bool per_input = option == "--vjp" || option == "--hvp";
  if (per_input && inputs.size() == 1) return {inputs[0].name, text};
  fail("{}: expected NAME=FORMULA{}, got '{}'", option, per_input ? " (one per input)" : "", text);
}

ClaimText claim_from_options(const ClaimArgs& a) {
  ClaimText c;
  c.name = a.name;
  c.where = "the command line";
  for (const auto& in : a.inputs) c.inputs.push_back(parse_claim_input("--input", in));
  for (const auto& l : a.lets) {
    auto [name, f] = split_named("--let", l, c.inputs);
    c.lets.push_back({name, f, fmt::format("--let {}", name)});
  }
  c.forward = {"", a.forward, "--forward"};
  for (const auto& v : a.vjps) {
    auto [name, f] = split_named("--vjp", v, c.inputs);
    c.vjp.push_back({name, f, fmt::format("--vjp {}", name)});
  }
  if (!a.jvp.empty()) c.jvp = ClaimText::Line{"", a.jvp, "--jvp"};
  for (const auto& h : a.hvps) {
    auto [name, f] = split_named("--hvp", h, c.inputs);
    c.hvp.push_back({name, f, fmt::format("--hvp {}", name)});
  }
  return c;
}

nlohmann::json report_json(const ClaimText& c, const GradcheckReport& r) {
  nlohmann::json checks = nlohmann::json::array(), diagnoses = nlohmann::json::array();
  for (const auto& ch : r.checks)
    checks.push_back({{"input", ch.input},
                      {"check", ch.check},
                      {"mode", ch.mode},
                      {"max_abs_err", ch.max_abs_err},
                      {"max_rel_err", ch.max_rel_err},
                      {"worst", ch.worst},
                      {"passed", ch.passed},
                      {"skipped", ch.skipped}});
  for (const auto& d : r.diagnoses)
    diagnoses.push_back(
        {{"kind", finding_name(d.kind)}, {"input", d.input}, {"check", d.check}, {"message", d.message}});
  return {{"claim", c.name},  {"where", c.where},       {"passed", r.passed.ok},
          {"checks", checks}, {"diagnoses", diagnoses}, {"notes", r.notes}};
}

int run_claims(const ClaimArgs& a) {
  std::vector<ClaimText> claims;
  for (const auto& path : a.files) {
    auto more = parse_claims(read_file(path, kMaxClaimFileBytes), path);
    claims.insert(claims.end(), more.begin(), more.end());
  }
  if (!a.forward.empty() || !a.inputs.empty()) claims.push_back(claim_from_options(a));
  if (claims.empty()) fail("claim: nothing to check: give --input, --forward and --vjp, --jvp or --hvp, or --file");
  // Every claim's memory estimate (its inputs' sizes) held against what is available before anything is allocated.
  for (const auto& c : claims) require_claim_memory(c);
  // Every formula parsed and shape-checked before the first check runs.
  for (const auto& c : claims) validate_claim(c);
  std::vector<GradcheckReport> reports;
  const UndefinedEdges undefined = parse_undefined_edges(a.undefined_edges);
  for (const auto& c : claims) reports.push_back(check_claim(c, a.options, a.edges ? &undefined : nullptr));
  int wrong = 0;
  nlohmann::json all = nlohmann::json::array();
  for (size_t i = 0; i < claims.size(); ++i) {
    wrong += !reports[i].passed;
    if (a.json) all.push_back(report_json(claims[i], reports[i]));
    else fmt::print("# {}\n{}\n", claims[i].where, reports[i].str());
  }
  if (a.json) fmt::print("{}\n", all.dump(2));
  else {
    const size_t hold = claims.size() - static_cast<size_t>(wrong);
    fmt::print("{} claim{}: {} hold{}, {} wrong\n", claims.size(), claims.size() == 1 ? "" : "s", hold,
               hold == 1 ? "s" : "", wrong);
  }
  return wrong > 0 ? 1 : 0;
}

}  // namespace

void add_claim_command(CLI::App& app) {
  auto args = std::make_shared<ClaimArgs>();
  CLI::App* cmd = app.add_subcommand(
      "claim",
      "Check a claimed derivative written as formulas (a paper's VJP, JVP or Hessian-vector product) against finite "
      "differences of its "
      "forward, in float64, with the gradchecker's diagnosis (exit 1 when the claim is wrong). Formulas: names, "
      "numbers, + - * / with broadcasting, the ops exp log tanh sigmoid relu gelu gelu_erf elu softmax log_softmax "
      "row_normalize "
      "matmul linear layer_norm, sum(e, axis) mean(e, axis) norm(e, axis) transpose(e, a, b) where(c, a, b) tril(e, "
      "k); "
      "y is the forward's output, g the cotangent (VJP), t_x the tangent of input x (JVP); an hvp reads both. "
      "docs/claims/README.md");
  cmd->add_option("--input", args->inputs, "An input NAME:D,D,...[:positive|away_from_zero] (repeatable)");
  cmd->add_option("--let", args->lets, "NAME=FORMULA: a name for part of the formulas (repeatable, in order)");
  // A claim has one forward and one JVP: a second one given is refused (main's refuse_repeated_options).
  cmd->add_option("--forward", args->forward, "The forward map y = FORMULA of the inputs");
  cmd->add_option("--vjp", args->vjps,
                  "NAME=FORMULA: the claimed x̄ of input NAME, in terms of the inputs, y and g (repeatable; "
                  "FORMULA alone with one input)");
  cmd->add_option("--jvp", args->jvp, "FORMULA: the claimed ẏ, in terms of the inputs, y and t_NAME");
  cmd->add_option("--hvp", args->hvps,
                  "NAME=FORMULA: the claimed (H·t) of input NAME for s = ⟨g, y⟩, in terms of the inputs, y, g and "
                  "t_NAME; checked to second order (repeatable; FORMULA alone with one input)");
  cmd->add_option("--name", args->name, "The claim's name in the report")->capture_default_str();
  cmd->add_option("--file", args->files, "A file of claims, one block each (repeatable; docs/claims/README.md)");
  cmd->add_flag("--json", args->json, "Print a JSON list of {claim, where, passed, checks, diagnoses, notes}");
  cmd->add_flag("--edges", args->edges,
                "Also run the forward and the claimed VJP in float64 at the edges of the inputs' domain (a masked, "
                "constant, tied, zero, overflowing or tiny row), each finding with a line that reproduces it");
  cmd->add_option("--undefined-edge", args->undefined_edges,
                  "EDGE=nan|inf|undefined: an edge the forward defines as undefined, not probed (repeatable)");
  cmd->add_option("--atol", args->options.atol, "Absolute tolerance")->capture_default_str()->check(positive());
  cmd->add_option("--rtol", args->options.rtol, "Relative tolerance")->capture_default_str()->check(non_negative());
  cmd->add_option("--eps", args->options.eps, "Finite-difference step")->capture_default_str()->check(positive());
  cmd->add_option("--seed", args->options.seed, "Seed of the random inputs and projections")->capture_default_str();
  cmd->callback([args] {
    try {
      if (run_claims(*args)) set_exit_code(1);
    } catch (const ExpressionError& e) {
      // The caret needs its lines: printed here, not by main's one-line report.
      std::fflush(stdout);
      fmt::print(stderr, "tapegrad: error: {}\n", e.what());
      set_exit_code(2);
    }
  });
}

}  // namespace tapegrad::cli
