// A claimed derivative: a Function whose value is an existing forward's and whose derivatives are the ones a paper
// (or a derivation on paper) claims. Register it like an op (ops/registry.hpp) and gradcheck the formula before
// anyone codes it into a node; a claim without a VJP (or JVP, or second order) borrows the forward's own. Without
// any C++: the same claim as formulas, check_claim (checker/formulas/claim.hpp), `tapegrad claim`.
#pragma once

#include <functional>
#include <span>
#include <string>

#include "../engine/functions.hpp"
#include "../engine/tape.hpp"

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

}  // namespace tapegrad
