// Derivatives of a whole function of tensors, each computed on a private tape: the value, the total derivative
// along tangents (forward mode), the gradients for a cotangent (reverse mode) and Hessian-vector products.
#pragma once

#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "tape.hpp"

namespace tapegrad {

// A differentiable function of tensors, built from ops on a tape.
using Function = std::function<Var(Tape&, std::span<const Var>)>;

// y = f(x) and its derivatives at x, on a private tape. Integer inputs are constants. An observer given to jvp or
// vjp is attached to that tape for the computation (engine/tape_observer.hpp).
Tensor evaluate(const Function& f, std::span<const Tensor> inputs);
// Total derivative dF(x)·ẋ: one tangent per input (undefined = zero). Returns {y, ẏ}.
std::pair<Tensor, Tensor> jvp(const Function& f, std::span<const Tensor> inputs, std::span<const Tensor> tangents,
                              TapeObserver* observer = nullptr);
// Gradients x̄_i = J_iᵀ ȳ for every input (undefined for integer inputs).
std::vector<Tensor> vjp(const Function& f, std::span<const Tensor> inputs, const Tensor& cotangent,
                        TapeObserver* observer = nullptr);
// Hessian-vector products of s = ⟨ȳ, f(x)⟩: (H·ẋ)_i for every input (undefined for integer inputs), one direction
// per input (undefined = zero). Throws naming an op without a second-order rule (Tape::hvp).
std::vector<Tensor> hvp(const Function& f, std::span<const Tensor> inputs, const Tensor& cotangent,
                        std::span<const Tensor> directions);

}  // namespace tapegrad
