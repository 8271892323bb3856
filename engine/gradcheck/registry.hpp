// The op registry: the sheets of the ops a program knows (engine/op_sheet.hpp: name, forward, derivatives,
// derivation sections, cost, gradcheck cases), which `tapegrad gradcheck`, explain, the profile and the test suite
// read; a test fails for an op without a case. The built-in ops' sheets are listed in ops/all_ops.cpp.
//
// The same API serves ops defined outside tapegrad, in a user's own file (examples/custom-op/ is one):
//   node       y = tape.empty(...) + forward; tape.record(name, inputs, y, vjp, jvp, second)  (engine/tape.hpp)
//              vjp: (const Tensor& ȳ, span of x̄) adds J_iᵀȳ into each defined x̄_i;
//              jvp: (span of ẋ, const Tensor& ẏ) adds Σ_i J_i ẋ_i into ẏ (skip undefined ẋ_i).
//              An op without a forward-mode rule passes no_jvp(name) as its jvp (engine/no_jvp.hpp).
//   sheet      std::vector<OpInfo> my_ops() { return {{.name = ..., .family = ..., .forward = ..., .equation = ...,
//              .second_order = ..., .cases = {{case, inputs, build}}}}; }  (engine/op_sheet.hpp)
//   register   Registry registry{my_ops()};  or  registry.add(my_ops());
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

#include "../no_jvp.hpp"
#include "../op_sheet.hpp"
#include "../source_place.hpp"
#include "../tape.hpp"

namespace tapegrad {

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

// "ops/softmax.cpp:96": a source location from the repository's top folder on (engine/, ops/, models/, tools/,
// tests/, examples/, fuzz/) where its path has one; "?" for an unknown location.
std::string source_text(const SourcePlace& where);

class Registry {
 public:
  Registry() = default;
  // The sheets of a few families at once: Registry{arithmetic_ops(), my_ops()}.
  Registry(std::initializer_list<std::vector<OpInfo>> sheets);
  void add(std::vector<OpInfo> sheets);  // throws naming an op registered twice or left without a name
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
