// Curvature of a loss over a module's parameters θ, from exact Hessian-vector products (Tape::hvp: each op's
// second-order rule, docs/derivations.md §6).
//
//   parameter_hvp  H·v, with H = ∇²L(θ), for one direction v (one tensor per parameter, their shapes): one
//                  forward pass with tangents and one backward pass with their cotangents (about three gradients'
//                  work where matrix products dominate: engine/tape.hpp).
//   sharpness      the largest eigenvalue λ_max of H (the "sharpness", which gradient descent at learning rate η
//                  keeps near 2/η: the edge of stability), by power iteration on H·v:
//                    v ← H v / ‖H v‖,   λ = ⟨v, H v⟩ (‖v‖ = 1),
//                  until λ moves by less than `tolerance` relatively, or `iterations` products. Power iteration
//                  finds the eigenvalue of largest magnitude; when that one is negative (early in training, a loss
//                  is far from convex), a second run on H − λI, whose spectrum is shifted to ≥ 0, finds λ_max. The
//                  residual ‖H v − λ v‖/|λ| says how converged it is.
// The loss is recorded anew for each product (the function must give the same loss each time: no dropout, fixed
// data). A parameter the loss reads twice (a tied embedding) gets the sum of both uses' products.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "module.hpp"

namespace tapegrad {

using LossFunction = std::function<Var(Tape& tape)>;

struct ParameterHvp {
  double loss = 0;
  std::vector<Tensor> gradient, hvp;  // one per parameter of the module, in its order
};
ParameterHvp parameter_hvp(const Module& module, const LossFunction& loss, std::span<const Tensor> direction);
// The same on `tape`, cleared first: a caller taking many products reuses its memory (no fresh pages each time).
ParameterHvp parameter_hvp(const Module& module, const LossFunction& loss, std::span<const Tensor> direction,
                           Tape& tape);

struct SharpnessOptions {
  int iterations = 20;
  double tolerance = 1e-3;
  uint64_t seed = 0;  // of the random start
};

struct Sharpness {
  double largest = 0;    // λ_max, the largest eigenvalue
  double magnitude = 0;  // the eigenvalue of largest magnitude (λ_max, or a negative one)
  double residual = 0;   // ‖H v − λ_max v‖ at the last v, relative to |λ_max|
  int iterations = 0;    // Hessian-vector products taken, both runs
  double loss = 0;       // at θ
};
Sharpness sharpness(const Module& module, const LossFunction& loss, const SharpnessOptions& options = {});

}  // namespace tapegrad
