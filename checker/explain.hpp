// One op on one screen, from what the code already knows: its forward map and derivatives to second order (the registry), where
// they are written (the node's record call, the registration), the sections of docs/derivations.md that derive
// them, what its node keeps for backward and what it costs at a shape (the tape, the op's cost function), and its
// gradcheck there and then, to first and second order. `tapegrad explain OP` prints it; gradcheck_main gives a program of one's own ops the
// same `explain OP` (checker/cli.hpp).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "../inspect/allocation_log.hpp"
#include "gradcheck.hpp"

namespace tapegrad {

struct ExplainOptions {
  std::string case_name;                              // the gradcheck case to run; empty: the op's first
  std::vector<std::pair<std::string, Shape>> shapes;  // input name → shape, in place of the case's
  std::string derivations_path;  // docs/derivations.md, to name its sections; empty or unreadable: numbers only
  // A source tree in which to find the lines of the files a sheet names (its formulas, its registration); empty:
  // the tree that holds derivations_path, then the one the library was built from. Not found: file and function.
  std::string source_dir;
  GradcheckOptions gradcheck;
};

// One of OpSheet::formulas_at, found: "ops/row_maps.hpp:70" when the file was read, else "ops/row_maps.hpp".
struct FormulaLocation {
  std::string what, at, function;
};

struct Explanation {
  std::string op, family, forward, vjp, jvp;
  std::string second_order;           // OpSheet::second_order; empty: not given at registration
  std::string second_order_section;   // the heading of docs/derivations.md that derives the rules ("6" if not found)
  std::vector<std::string> sections;  // of docs/derivations.md: "1.2 β(x) = ..." (the number alone if not found)
  std::string derived_in;             // OpSheet::derived_in: a file whose opening comment derives the rules
  std::string derivations_file = "docs/derivations.md";  // where they are: ExplainOptions::derivations_path if read
  // The heading of the learner's page beside it (learn.md, else reverse-mode.md) whose walk-through runs this op
  // ("tapegrad explain OP" in that section); "" if none.
  std::string learn_section;
  std::string learn_file;     // that page, where a section was found
  std::string recorded_at;    // file:line of the node's tape.record call: its forward, VJP and JVP
  std::string registered_at;  // file:line of its sheet (or its registration)
  std::string case_name;
  bool shapes_given = false;                          // the case's map at shapes of ExplainOptions::shapes
  std::vector<std::pair<std::string, Shape>> inputs;  // the case's inputs at the shapes explained
  Shape output;
  int64_t nodes = 0;                         // the op's nodes in the case (a case may record a few ops around it)
  std::vector<FormulaLocation> formulas_at;  // where its formulas are written, when not in the node's file
  int64_t bytes_kept = 0;        // arena bytes those nodes keep in float32: their outputs and what backward needs
  std::vector<Allocation> kept;  // what those bytes are: the tensors the op allocated, named where it names them
  // bytes_kept less the tensors' own bytes: the arena hands out 64-byte aligned blocks, so an 80-byte tensor takes 128
  int64_t alignment_padding() const;
  // Bytes of the tape's scratch (engine/scratch.hpp) the largest of those nodes reserves for its forward, VJP and JVP,
  // and for its second-order rule: working memory while a rule runs, shared by every node of a tape, not kept.
  int64_t scratch_first_order = 0, scratch_second_order = 0;
  std::optional<OpCost> cost;  // FLOPs of forward, VJP and JVP; nothing when the op has no cost function
  GradcheckReport check;
  GradcheckReport check_second_order;  // checker/second_order.hpp, at the same point
};

// Throws Error for an op or case the registry does not have (naming the ones it has), an input name the case
// does not have, or shapes the op rejects.
Explanation explain(const Registry& registry, std::string_view op, const ExplainOptions& options = {});
std::string format_explanation(const Explanation& e);
nlohmann::json explanation_json(const Explanation& e);

// The first line of `path` (1-based) that holds `function(` outside a comment: where that function is defined in a
// header of kernels; 0 when the file cannot be read or does not have it.
int line_of_function(const std::string& path, const std::string& function);

// The registry as a markdown table, one row per op: its file, forward, VJP, JVP, second-order rule and the
// sections of docs/derivations.md that derive them, from its sheet. `tapegrad explain --index-markdown` prints it:
// the index by op is made from the sheets when asked for, and no doc keeps a copy that an added op would make stale.
std::string index_markdown(const Registry& registry);

// The inputs of case `c` of `op` with the shapes named in `shapes` in place of the case's. Throws an Error, its
// message begun with `command`, for a name the case does not have or a shape of more than `max_elements`.
std::vector<InputSpec> inputs_at_shapes(const GradcheckCase& c, std::string_view op,
                                        std::span<const std::pair<std::string, Shape>> shapes, int64_t max_elements,
                                        std::string_view command);

// "x=4,6" → {"x", (4, 6)}; "x=" is a scalar. Throws an Error naming `option` for anything else.
std::pair<std::string, Shape> parse_named_shape(std::string_view option, std::string_view text);

}  // namespace tapegrad
