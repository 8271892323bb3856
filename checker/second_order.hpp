// The second-order check: for s = ⟨u, f(x)⟩ with a random cotangent u, in float64,
//   hvp       H·t by Tape::hvp (the ops' second-order rules) against central differences of the gradient,
//             (∇s(x + εt) − ∇s(x − εt))/2ε, element by element, per input (t random, all inputs moved at once)
//   symmetry  ⟨w, H v⟩ = ⟨v, H w⟩ for two random directions v, w over all inputs (H of a scalar is symmetric)
// A function through an op without a second-order rule is not checked: its rows are skipped, naming the op.
#pragma once

#include <span>
#include <string>

#include "gradcheck.hpp"

namespace tapegrad {

// With blocks (gradcheck.hpp): the first-order check that a failing second order runs first takes them.
GradcheckReport gradcheck_second_order(const Function& f, std::span<const Tensor> inputs,
                                       std::span<const std::string> names, const GradcheckOptions& opt = {},
                                       RuleBlocks* blocks = nullptr);
GradcheckReport gradcheck_second_order(const GradcheckCase& c, const GradcheckOptions& opt = {},
                                       std::string_view op = "");

}  // namespace tapegrad
