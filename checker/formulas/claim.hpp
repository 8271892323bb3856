// A claimed derivative written as formulas (checker/formulas/expression.hpp), checked against finite differences
// of its forward before anyone codes it into a node. `tapegrad claim` reads them from the command line or from a
// file of claims (format: docs/claims/README.md):
//
//   claim softmax_vjp                      one block per claim
//   input x: 4, 6                          the forward's inputs (NAME: D, D, ...[: positive | away_from_zero])
//   let s = sum(y * g, -1)                 names for parts of the formulas, usable below
//   forward softmax(x)                     y, evaluated on the tape with the engine's (checked) ops
//   vjp x = y * (g - s)                    x̄ for the cotangent g (one line per input; an input without one keeps
//                                          the forward's own VJP)
//   jvp y * (t_x - sum(y * t_x, -1))       ẏ for the tangents t_x, t_k, ... (absent: the forward's own JVP)
//   hvp x = FORMULA                        (H·t)_x of s = ⟨g, y⟩, from g and the tangents (one line per input;
//                                          an input without one keeps the forward's own second order)
//
// The claimed VJP and JVP are gradchecked as claimed() derivatives of the forward (ops/registry.hpp):
// vjp and jvp against central differences in float64, adjoint against the other rule (the forward's own where the
// claim gives one of the two), with the diagnosis of a failure. A claimed H·t is the second-order rule of that
// node, checked by gradcheck_second_order (checker/second_order.hpp): against central differences of the
// gradient, for symmetry and accumulation, with its diagnosis.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../claimed.hpp"
#include "../edges.hpp"
#include "../gradcheck.hpp"

namespace tapegrad {

// A claim as text: what a block of a claims file or the options of `tapegrad claim` say.
struct ClaimText {
  std::string name = "claim";
  std::string where;  // "docs/claims/softmax.txt:3", "the command line": where it was written
  std::vector<InputSpec> inputs;
  struct Line {
    std::string name;  // let: the name defined; vjp: the input; forward, jvp: empty
    std::string formula;
    std::string label;  // for errors: "docs/claims/softmax.txt:5 (vjp x)"
  };
  std::vector<Line> lets;
  Line forward;
  std::vector<Line> vjp;
  std::optional<Line> jvp;
  std::vector<Line> hvp;  // name: the input whose block of H·t the formula gives
};

// "x:4,6", "x: 4, 6: positive". Throws Error naming `option`.
InputSpec parse_claim_input(std::string_view option, std::string_view text);

// "NAME = FORMULA" (a let or a vjp, in a file or on the command line), spaces around either trimmed: the name and
// the formula, or nothing when the text before the first '=' is not a name (letters, digits, _).
std::optional<std::pair<std::string, std::string>> split_named_formula(std::string_view text);

// The claims of a file's text; `path` names it in errors and in each claim's `where`. Throws Error naming the
// line for a malformed block (ExpressionError for a formula that does not parse).
std::vector<ClaimText> parse_claims(std::string_view text, std::string_view path);

// A file of claims (or of exercises, checker/formulas/exercise.hpp) as its lines: blank lines and comments (#)
// dropped, an indented line joined to the one above (a long formula over several lines), each with its number.
struct FileLine {
  int number;
  std::string text;
};
std::vector<FileLine> joined_lines(std::string_view text);
// s without the white space around it.
std::string_view trim(std::string_view s);

// Parses every formula and checks its names and shapes; throws Error, or ExpressionError with its caret.
void validate_claim(const ClaimText& claim);

// Parses every formula, checks names and shapes (x̄ and (H·t)_x must have x's shape, ẏ y's), then gradchecks the
// claim with inputs drawn from opt.seed: to first order, and to second order when it claims an hvp (one report,
// the second-order checks after the first). Throws ExpressionError (with its caret) before evaluating anything.
// With edges, the forward and the claimed VJP also run at the edges of the inputs' domain (checker/edges.hpp), but
// for the edges it names as undefined.
GradcheckReport check_claim(const ClaimText& claim, const GradcheckOptions& opt = {},
                            const UndefinedEdges* edges = nullptr);

// What a claim's check holds, in float64 elements, from a walk of its formulas over shapes (before any value is
// computed; checker/formulas/claim_memory.cpp): the inputs, what the forward records (its lets, each intermediate at
// the shape broadcasting gives it), its output, and the largest of the claimed rules' evaluations (their lets and
// intermediates). Where the shapes do not fit, the walk stops and counts what came before; validate_claim refuses
// the claim.
struct ClaimMemory {
  double input_elements = 0, forward_elements = 0, output_elements = 0, rule_elements = 0;
  // The tapes and copies the check keeps at once, measured (docs/claims/README.md, "Memory").
  static constexpr double kForwardTapes = 2, kOutputCopies = 30, kInputCopies = 8;
  double bytes() const;
};
ClaimMemory estimate_claim_memory(const ClaimText& claim);

// Refuses a claim whose check would need more memory than memory_available() (inspect/process_memory.hpp), from
// estimate_claim_memory, before anything of that size is allocated (the shape check of validate_claim included):
// `tapegrad claim` and tapegrad.claim in Python.
void require_claim_memory(const ClaimText& claim);

}  // namespace tapegrad
