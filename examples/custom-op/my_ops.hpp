// Ops defined outside tapegrad: each is one node on the tape with its own VJP (and JVP when it has one).
#pragma once

#include "engine/gradcheck/registry.hpp"
#include "engine/tape.hpp"

// rms_norm.cpp — y = w ⊙ x/ρ per row, ρ = √(mean(x²) + ε): x (..., C), w (C).
tapegrad::Var rms_norm(tapegrad::Var x, tapegrad::Var w, double eps = 1e-6);

// softsign.cpp — y = x/(1 + |x|) element-wise; a VJP and no JVP.
tapegrad::Var softsign(tapegrad::Var x);

// Each op with its gradcheck cases.
void register_rms_norm(tapegrad::Registry& registry);
void register_softsign(tapegrad::Registry& registry);
// A derivative as claimed elsewhere, recorded against rms_norm's own forward (and rejected by the gradchecker).
void register_rms_norm_claims(tapegrad::Registry& registry);
