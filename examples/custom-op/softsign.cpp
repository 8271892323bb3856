// softsign y = x/(1 + |x|) element-wise, built from its function and derivative by tapegrad's pointwise():
//   f′(x) = 1/(1 + |x|)²          VJP  x̄ += ȳ/(1 + |x|)²,   JVP  ẏ = ẋ/(1 + |x|)²          x, y: any shape
//   f″(x) = −2·sign(x)/(1 + |x|)³  second order (Tape::hvp): ẋ̄ += f″(x)·ẋ·ȳ
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

void register_softsign(Registry& r) {
  r.add({.name = "softsign",
         .family = "my_ops",
         .equation = "x̄ += ȳ/(1 + |x|)²; ẏ = ẋ/(1 + |x|)²",
         .forward = "y = x/(1 + |x|)",
         .second_order = "ẋ̄ −= 2·sign(x)·ẋ·ȳ/(1 + |x|)³"});
  r.add_case("softsign", {"matrix", {{"x", {3, 4}}}, [](Tape&, std::span<const Var> x) { return softsign(x[0]); }});
}
