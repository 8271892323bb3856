// softsign y = x/(1 + |x|) element-wise (x, y: any shape), built from f, f′ and f″ by tapegrad's pointwise(); its
// sheet below states the VJP, the JVP and the second-order rule they give.
// pointwise() records the node (named "softsign", placed at this file), runs f in float or double as the tensor
// is, and derives the VJP and the JVP from f′, and the second-order rule from f″.
#include <cmath>

#include "ops/ops.hpp"

using namespace tapegrad;

Var softsign(Var x) {
  return pointwise(
      "softsign", x, [](auto v) { return v / (1 + std::abs(v)); },
      [](auto v) { return 1 / ((1 + std::abs(v)) * (1 + std::abs(v))); },
      [](auto v) {
        const auto a = 1 + std::abs(v);
        return (v > 0 ? -2 : v < 0 ? 2 : 0) / (a * a * a);
      });
}

std::vector<OpSheet> softsign_ops() {
  return {{.name = "softsign",
           .family = "my_ops",
           .forward = "y = x/(1 + |x|)",
           .vjp = "x̄ += ȳ/(1 + |x|)²",
           .jvp = "ẏ = ẋ/(1 + |x|)²",
           .second_order = "ẋ̄ −= 2·sign(x)·ẋ·ȳ/(1 + |x|)³",
           .cases = {{"matrix", {{"x", {3, 4}}}, [](Tape&, std::span<const Var> x) { return softsign(x[0]); }}}}};
}
