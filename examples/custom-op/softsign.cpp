// softsign y = x/(1 + |x|) element-wise, built from its function and derivative by tapegrad's pointwise():
//   f′(x) = 1/(1 + |x|)²          VJP  x̄ += ȳ/(1 + |x|)²,   JVP  ẏ = ẋ/(1 + |x|)²          x, y: any shape
// pointwise() records the node (named "softsign", placed at this file), runs f in float or double as the tensor
// is, and derives the VJP and the JVP from f′.
#include <cmath>

#include "ops/ops.hpp"

using namespace tapegrad;

Var softsign(Var x) {
  return pointwise(
      "softsign", x, [](auto v) { return v / (1 + std::abs(v)); },
      [](auto v) { return 1 / ((1 + std::abs(v)) * (1 + std::abs(v))); });
}

void register_softsign(Registry& r) {
  r.add({"softsign", "my_ops", "x̄ += ȳ/(1 + |x|)²; ẏ = ẋ/(1 + |x|)²", {}});
  r.add_case("softsign", {"matrix", {{"x", {3, 4}}}, [](Tape&, std::span<const Var> x) { return softsign(x[0]); }});
}
