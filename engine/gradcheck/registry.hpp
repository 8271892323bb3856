// The op registry: every op registers its name, the equation its derivatives implement, and one or more
// gradcheck cases. `tapegrad gradcheck` and the test suite iterate it; a test fails for an op without a case.
//
// The same API serves ops defined outside tapegrad, in a user's own file (examples/custom-op/ is one):
//   node       y = tape.empty(...) + forward; tape.record(name, inputs, y, vjp, jvp)      (engine/tape.hpp)
//              vjp: (const Tensor& ȳ, std::span<const Tensor> x̄) adds J_iᵀȳ into each defined x̄_i;
//              jvp: (std::span<const Tensor> ẋ, const Tensor& ẏ) adds Σ_i J_i ẋ_i into ẏ (skip undefined ẋ_i).
//              An op without a forward-mode rule passes no_jvp(name) as its jvp: forward mode then throws NoJvp,
//              and the gradchecker reports "no JVP" for it instead of failing its checks.
//   register   registry.add({name, family, equation, {}}); registry.add_case(name, {case, inputs, build}).
//   claim      claimed({name, forward, vjp, jvp, hvp}) is a Function whose value is an existing forward's and whose
//              derivatives are the ones a paper claims: register it like an op and gradcheck the formula before
//              anyone codes it into a node. A claim without a VJP (or JVP) borrows the forward's own. Without any
//              C++: the same claim as formulas, check_claim (ops/formulas/claim.hpp), `tapegrad claim`.
//   check      gradcheck(f, inputs) (engine/gradcheck/gradcheck.hpp); gradcheck_main(registry, argc, argv) makes a program
//              of one's own ops answer `gradcheck --op NAME` as tapegrad does (engine/gradcheck/cli.hpp).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../source_place.hpp"
#include "../tape.hpp"

namespace tapegrad {

// Thrown by forward mode on a node recorded with no_jvp(op).
struct NoJvp : Error {
  explicit NoJvp(std::string op_name);
  std::string op;
};

// The jvp argument of Tape::record for an op that has no forward-mode rule.
inline auto no_jvp(const char* op) {
  return [op](std::span<const Tensor>, const Tensor&) { throw NoJvp(op); };
}

// Where a claimed derivative is evaluated: the forward's inputs and its output (float64 in a gradcheck).
struct ClaimPoint {
  std::span<const Tensor> inputs;
  const Tensor& output;
};
// x̄_i += (claimed J_iᵀ) ȳ for each defined x̄_i.
using ClaimedVjp = std::function<void(const ClaimPoint& at, const Tensor& gout, std::span<Tensor> gin)>;
// ẏ += Σ_i (claimed J_i) ẋ_i over the defined ẋ_i.
using ClaimedJvp = std::function<void(const ClaimPoint& at, std::span<const Tensor> tin, Tensor& tout)>;
// ẋ̄_i += (claimed H_ȳ·ẋ)_i for each defined ẋ̄_i: the Hessian of ⟨ȳ, f⟩ along the tangents (undefined: zero),
// which is the node's second-order rule (Tape::hvp).
using ClaimedHvp = std::function<void(const ClaimPoint& at, const Tensor& gout, std::span<const Tensor> tin,
                                      std::span<Tensor> gin_dot)>;

struct Claim {
  std::string name;  // the node's name on the tape, and the op name to register it under
  Function forward;  // an existing forward, e.g. [](Tape&, std::span<const Var> x) { return softmax(x[0]); }
  ClaimedVjp vjp;    // empty: the forward's own VJP
  ClaimedJvp jvp;    // empty: the forward's own JVP
  ClaimedHvp hvp{};  // empty: the forward's own second order
};

// A Function computing claim.forward's value as one node named claim.name, with the claimed derivatives.
Function claimed(Claim claim);

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
  Function build;                      // the op (or a small map around it) applied to the inputs
  std::optional<double> atol{}, rtol{};  // only where an op needs other tolerances than the checker's
  bool at_kink = false;  // the point is a kink (abs at 0): first order is checked there, second order is not
};

// "ops/softmax.cpp:96": a source location from the repository's top folder on (engine/, ops/, models/, tools/,
// tests/, examples/, fuzz/) where its path has one; "?" for an unknown location.
std::string source_text(const SourcePlace& where);

// Floating-point operations of one node: 2 per multiply-add of its matrix products.
struct OpCost {
  double forward = 0, backward = 0, jvp = 0;
};
// A node's cost from its inputs' and output's shapes (engine/profile.hpp charges it to the op's row).
using CostFunction = std::function<OpCost(std::span<const Shape> inputs, const Shape& output)>;

// An op's entry. Aggregate-initialized, positionally ({name, family, equation, {}}) or with designators
// ({.name = ..., .family = ..., .equation = ..., .forward = ...}) in this order.
// Where one of an op's formulas is written, when that is not its node's own file: ("forward", the place of the
// row map's forward), ("VJP and JVP", ...). tapegrad explain lists them.
struct FormulaPlace {
  std::string what;
  SourcePlace at;
};

struct OpInfo {
  std::string name;      // as recorded on the tape
  std::string family;    // the file in ops/ that holds it, without .cpp: "matmul", "attention/tiled"
  std::string equation;  // the derivatives it implements, in one line: the VJP, then "; " and the JVP (ẏ = ...)
  std::vector<GradcheckCase> cases{};
  CostFunction cost{};     // ops with matrix products (and a few row maps); empty: not counted
  std::string forward{};     // the forward map, in one line
  std::string derivation{};  // the heading of docs/derivations.md that derives it; empty: a textbook rule
  SourcePlace registered_at{};  // where Registry::add was called: the op's file
  std::vector<FormulaPlace> formulas_at{};  // where its formulas are written, if elsewhere than the node's file
  // Its second-order rule in one line: the tangent of its VJP at a fixed cotangent, ẋ̄ᵢ += Σⱼ ∂ⱼ(Jᵢᵀȳ)[ẋⱼ]
  // (what Tape::hvp adds beside the VJP of ȳ̇); "0" for an op whose VJP does not depend on its inputs.
  std::string second_order{};
  std::string second_order_derivation{};  // its section of docs/derivations.md ("6.4"); empty: 6.1 for a
                                          // kNoSecondOrderTerm op, else the section 6 as a whole
};
// OpInfo::second_order of an op recorded with Tape::linear_in_inputs.
inline constexpr const char* kNoSecondOrderTerm = "0: the VJP does not depend on the inputs";

class Registry {
 public:
  void add(OpInfo op, SourcePlace where = SourcePlace::current());
  void add_case(std::string_view op, GradcheckCase c);
  const std::vector<OpInfo>& ops() const { return ops_; }
  const OpInfo* find(std::string_view name) const;

 private:
  std::vector<OpInfo> ops_;
};

// Inputs for a case, drawn from a seeded generator in the given float dtype.
std::vector<Tensor> make_inputs(std::span<const InputSpec> specs, DType dtype, uint64_t seed);

}  // namespace tapegrad
