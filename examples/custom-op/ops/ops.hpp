// Ops defined outside tapegrad: each is one node on the tape with its own VJP and JVP. This project's own ops/
// folder, next to tapegrad's installed include/tapegrad/ops/: "ops/ops.hpp" is this file, <tapegrad/ops/ops.hpp>
// tapegrad's, and neither shadows the other.
#pragma once

#include <vector>

#include <tapegrad/tapegrad.hpp>

// rms_norm.cpp — y = w ⊙ x/ρ per row, ρ = √(mean(x²) + ε): x (..., C), w (C).
tapegrad::Var rms_norm(tapegrad::Var x, tapegrad::Var w, double eps = 1e-6);

// softsign.cpp — y = x/(1 + |x|) element-wise, from f and f′ by tapegrad::pointwise().
tapegrad::Var softsign(tapegrad::Var x);

// Each op's sheet (<tapegrad/ops/sheet.hpp>): its formulas and its gradcheck cases.
std::vector<tapegrad::OpSheet> rms_norm_ops();
std::vector<tapegrad::OpSheet> softsign_ops();
// A derivative as claimed elsewhere, recorded against rms_norm's own forward (and rejected by the gradchecker).
std::vector<tapegrad::OpSheet> rms_norm_claims();
