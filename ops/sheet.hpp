// An op's sheet: plain data that describes one op to whatever reads it — its name on the tape, its forward map, the
// derivatives its node implements (VJP, JVP and second order) in one line each, the sections of docs/derivations.md
// that derive them, where the formulas are written when not in the node's own file, its cost in FLOPs, and the
// gradcheck cases that exercise it, and how to call it by name with keyword arguments (Tape.op from Python). Strings,
// shapes and std::function: no checker code, so the op files that fill their sheets (one block at the end of each
// file in ops/) include nothing of the tooling, and the tooling (checker/: the gradchecker, explain;
// inspect/profile.hpp; inspect/tape_dot.hpp; the Python module) reads the sheets, through the registry of sheets
// (ops/registry.hpp), without knowing the ops.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "../engine/source_place.hpp"
#include "../engine/tape.hpp"

namespace tapegrad {

// How a gradcheck input is filled: values that keep an op away from its kinks and its domain's edges.
enum class Fill {
  normal,          // N(0, 1)
  positive,        // U(0.5, 2): log, division, square roots
  away_from_zero,  // ±U(0.2, 2): relu, elu and other kinks at 0
  zeros,           // exactly 0: a point where a formula has a special case (β at x = 0)
  indices,         // int32 in [0, index_bound): token ids, class targets (not differentiable)
};

struct InputSpec {
  std::string name;
  Shape shape;
  Fill fill = Fill::normal;
  int64_t index_bound = 0;
  bool differentiable() const { return fill != Fill::indices; }
};

struct GradcheckCase {
  std::string name;
  std::vector<InputSpec> inputs;
  Function build;                        // the op (or a small map around it) applied to the inputs
  std::optional<double> atol{}, rtol{};  // only where an op needs other tolerances than the checker's
  bool at_kink = false;  // the point is a kink (abs at 0): first order is checked there, second order is not
  // This case's map written with the primitive ops the fused op replaces, at the case's own options (a causal
  // mask, a scale), for `tapegrad graph --unfused`; empty: the op's OpSheet::unfused, where that is this map.
  Function unfused{};
};

// Floating-point operations of one node: 2 per multiply-add of its matrix products.
struct OpCost {
  double forward = 0, backward = 0, jvp = 0;
};
// A node's cost from its inputs' and output's shapes (inspect/profile.hpp charges it to the op's row).
using CostFunction = std::function<OpCost(std::span<const Shape> inputs, const Shape& output)>;

// The kernel that computes one of an op's formulas, in the node's own file or elsewhere: what it is, the file from
// the project's top folder, and the function ({"VJP and JVP", "ops/row_maps.hpp", "softmax_row_derivative"}).
// tapegrad explain prints the function's line, so that a formula is one step from the code that computes it; a test
// checks that the function is there.
struct FormulaPlace {
  std::string what;
  std::string file;
  std::string function;
};

// An op's keyword arguments when it is called by name (Tape.op from Python, python/engine_bindings.cpp): named values
// of a few plain kinds, read by typed getters. A getter with a fallback returns it when the key is absent; one
// without needs the key. A key that is absent where needed, or of another kind, throws tapegrad::Error naming the op
// and the key ("slice: needs the keyword stop=").
class OpArgs {
 public:
  using Value = std::variant<bool, int64_t, double, std::vector<int64_t>, std::string>;

  explicit OpArgs(std::string op = "op") : op_(std::move(op)) {}
  void set_op(std::string op) { op_ = std::move(op); }
  OpArgs& set(std::string key, Value value);
  bool has(std::string_view key) const { return values_.find(key) != values_.end(); }

  double number(std::string_view key) const;  // a number: a float or an integer
  double number(std::string_view key, double fallback) const;
  int64_t integer(std::string_view key) const;  // an integer, not a float or a bool
  int64_t integer(std::string_view key, int64_t fallback) const;
  int axis(std::string_view key) const;  // an integer that fits an int: an axis
  int axis(std::string_view key, int fallback) const;
  bool flag(std::string_view key) const;  // a bool
  bool flag(std::string_view key, bool fallback) const;
  std::vector<int64_t> integers(std::string_view key) const;  // a list of integers
  std::string text(std::string_view key) const;               // a string
  std::string text(std::string_view key, std::string fallback) const;

 private:
  const Value* find(std::string_view key) const;
  const Value& need(std::string_view key) const;
  [[noreturn]] void wrong(std::string_view key, const Value& v, std::string_view expected) const;
  // The value `key` needs to be, a V (`expected` says what that is in the error otherwise).
  template <class V>
  const V& need_a(std::string_view key, std::string_view expected) const {
    const Value& v = need(key);
    if (const V* x = std::get_if<V>(&v)) return *x;
    wrong(key, v, expected);
  }

  std::string op_;
  std::map<std::string, Value, std::less<>> values_;
};

// How many inputs an op called by name takes: `.inputs = 3`, or a range, `.inputs = {3, 4}`, `{1, InputCount::any}`.
struct InputCount {
  static constexpr size_t any = std::numeric_limits<size_t>::max();
  size_t min = 0, max = 0;

  InputCount() = default;
  InputCount(size_t n) : min(n), max(n) {}  // implicit: `.inputs = 3`
  InputCount(size_t lo, size_t hi) : min(lo), max(hi) {}
  bool accepts(size_t n) const { return n >= min && n <= max; }
  std::string str() const;  // "3", "3 or 4", "one or more", "2 to 5"
};

// An op called by name: its inputs (as many as OpSheet::inputs accepts) and its keyword arguments.
using OpCall = std::function<Var(std::span<const Var> inputs, const OpArgs& args)>;

// A worked example of an op's rules, for `tapegrad explain OP --trace`: the forward and the VJP written again, line
// by line, with the engine's primitive ops on a tiny seeded input, each line shown with the value it computes. The
// explanation compares the x̄ the lines end with against the node's own VJP, and gradchecks the node at the same
// numbers.
class TraceLines {
 public:
  virtual ~TraceLines() = default;
  // Starts a part of the example ("forward", "VJP").
  virtual void part(std::string_view title) = 0;
  // Shows v's value under `formula` ("D = rowsum(y ⊙ ȳ)") and returns v.
  virtual Var show(std::string_view formula, Var v) = 0;
};
struct OpTrace {
  // The node on a tiny input (a few rows of 2 or 3): its inputs are drawn from the seed as a gradcheck case's are.
  GradcheckCase example;
  // Given the inputs x and a cotangent ȳ of the node's output, shows the forward's and the VJP's lines and returns
  // x̄ for each input (an undefined Var for an input without a gradient, such as indices).
  std::function<std::vector<Var>(TraceLines& t, std::span<const Var> x, const Var& ybar)> lines;
};

// OpSheet::second_order of an op recorded with Tape::linear_in_inputs.
inline constexpr const char* kNoSecondOrderTerm = "0: the VJP does not depend on the inputs";

// An op's sheet. Aggregate-initialized with designators in this order ({.name = ..., .family = ..., .forward =
// ..., .vjp = ..., .jvp = ...}).
struct OpSheet {
  std::string name;       // as recorded on the tape
  std::string family;     // the file in ops/ that holds it, without .cpp: "matmul", "attention/tiled"
  std::string forward{};  // the forward map, in one line
  std::string vjp{};      // its VJP in one line (x̄ += ...), with what it needs of the forward ("d = p − t: ...")
  std::string jvp{};      // its JVP in one line (ẏ = ...); "no forward-mode rule" for an op without one
  // Its second-order rule in one line: the tangent of its VJP at a fixed cotangent, ẋ̄ᵢ += Σⱼ ∂ⱼ(Jᵢᵀȳ)[ẋⱼ]
  // (what Tape::hvp adds beside the VJP of ȳ̇); kNoSecondOrderTerm for an op whose VJP does not depend on its inputs.
  std::string second_order{};
  std::string derivation{};                 // the headings of docs/derivations.md that derive it ("2.1, 1.1");
                                            // empty: a textbook rule
  std::string second_order_derivation{};    // its section of docs/derivations.md ("6.4"); empty: 6.1 for a
                                            // kNoSecondOrderTerm op, else the section 6 as a whole
  std::vector<FormulaPlace> formulas_at{};  // the kernels that compute its formulas
  CostFunction cost{};                      // ops with matrix products (and a few row maps); empty: not counted
  std::vector<GradcheckCase> cases{};       // at least one: the suite fails for an op without a case
  // Edges of the domain where the op's value is defined as undefined, "EDGE=nan" (a fully masked row of a softmax:
  // masked_rows=nan); `gradcheck --edges` does not probe them and says so (checker/edges.hpp names the edges).
  std::vector<std::string> undefined_edges{};
  SourcePlace registered_at{};  // where OpSheets::add or Registry::add was called; unknown (line 0): tapegrad
                                // explain finds the op's name in its family's file
  // How to call it by name (Registry::call; Tape.op from Python): the inputs it takes and a function of them and of
  // its keyword arguments. An op without a call is not callable by name.
  InputCount inputs{};
  OpCall call{};
  // A fused op's map written with the primitive ops it replaces (attention: matmul, scale, add, softmax, matmul),
  // on the inputs of its first gradcheck case and at that case's options, for `tapegrad graph --unfused` to draw
  // its steps (a case at other options gives its own, GradcheckCase::unfused); a test checks that its value and
  // gradient are the op's on every case it is the map of. Empty: a primitive, or an op with no such form.
  Function unfused{};
  // A worked example of its forward and VJP, line by line with their values (`tapegrad explain OP --trace`).
  std::optional<OpTrace> trace{};
  // Where its first-order rules are derived when no section of docs/derivations.md does: a source file whose opening
  // comment derives them ("ops/layer_norm.cpp"). Empty with no section either: a textbook rule.
  std::string derived_in{};
};

// A file's sheets added one op at a time, each recording the line of its entry for tapegrad explain:
//   OpSheets ops;  ops.add({.name = "matmul", ..., .cases = {...}});  return ops.ops;
struct OpSheets {
  std::vector<OpSheet> ops;

  void add(OpSheet op, SourcePlace where = SourcePlace::current()) {
    op.registered_at = where;
    ops.push_back(std::move(op));
  }
};

// The names these had before 0.9 (one concept had three: sheet, OpInfo, OpList), kept for code written against
// them until 1.0.
using OpInfo [[deprecated("OpInfo is now OpSheet")]] = OpSheet;
using OpList [[deprecated("OpList is now OpSheets")]] = OpSheets;

}  // namespace tapegrad
