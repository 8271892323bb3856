#include "checker/claimed.hpp"

#include <memory>

namespace tapegrad {

// The claim's node: y = forward(x) evaluated off the tape; the claimed VJP and JVP (or the forward's own, taken
// from a private tape) at the point (x, y).
Function claimed(Claim claim) {
  if (claim.name.empty()) fail("claimed: a claim needs a name");
  if (!claim.forward) fail("claimed: claim '{}' has no forward", claim.name);
  auto c = std::make_shared<const Claim>(std::move(claim));
  return [c](Tape& tape, std::span<const Var> x) -> Var {
    std::vector<Tensor> xs;
    for (const Var& v : x) xs.push_back(v.value());
    Tensor y = evaluate(c->forward, xs);
    return tape.record(
        c->name.c_str(), x, y,
        [c, xs, y](const Tensor& g, std::span<Tensor> gin) {
          if (c->vjp) return c->vjp(ClaimPoint{xs, y}, g, gin);
          std::vector<Tensor> own = vjp(c->forward, xs, g);
          for (size_t i = 0; i < gin.size(); ++i)
            if (gin[i].defined()) gin[i].accumulate(own[i]);
        },
        [c, xs, y](std::span<const Tensor> tin, Tensor& tout) {
          if (c->jvp) return c->jvp(ClaimPoint{xs, y}, tin, tout);
          tout.accumulate(jvp(c->forward, xs, tin).second);
        },
        [c, xs, y](const Tensor& g, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
          if (c->hvp) return c->hvp(ClaimPoint{xs, y}, g, tin, gin_dot);
          std::vector<Tensor> own = hvp(c->forward, xs, g, tin);
          for (size_t i = 0; i < gin_dot.size(); ++i)
            if (gin_dot[i].defined()) gin_dot[i].accumulate(own[i]);
        });
  };
}

}  // namespace tapegrad
