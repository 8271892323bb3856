// The attention family: each kind is ONE node on the tape with its own hand-derived VJP and JVP.
// Shapes: Q (B, h, T, d), K (B, h, Tk, d), V (B, h, Tk, dv) → O (B, h, T, dv). Causal needs T = Tk and lets
// query i see keys j ≤ i. The derivations (docs/derivations.md, which cites the source posts) sit above each
// kernel in its .cpp file in this folder; what the nodes share is in kernels.hpp.
#pragma once

#include "../../engine/tape.hpp"

namespace tapegrad {

struct AttentionOptions {
  double scale = 0;  // s in s·QKᵀ; 0 means 1/√d; NaN and ±∞ are refused
  bool causal = false;
};

// softmax.cpp — O = softmax(s·QKᵀ + bias + M)·V (the attention-gradient and attention-bias posts). `bias` is optional
// (an undefined Var) and broadcasts to (B, h, T, Tk) from (B,h,T,Tk), (h,T,Tk), (T,Tk), (B,1,T,Tk) or (B,1,1,Tk); its
// gradient is summed over exactly the broadcast axes.
Var attention(Var q, Var k, Var v, const AttentionOptions& opt = {}, Var bias = {});

// softmax.cpp — attention() on a transformer block's packed projection: qkv (B, T, 3C) holds Q | K | V side by side,
// C = h·d columns each, head i's columns at i·d within each; O (B, T, C) holds head i's output at columns i·d. The
// head split and merge happen inside the node (merge_heads ∘ attention ∘ split_heads, the same numbers).
Var attention_qkv(Var qkv, int64_t heads, const AttentionOptions& opt = {});

// beta.cpp — O = β(s·QKᵀ ⊙ M)·V with β(x) = x/(1+‖x‖) row-wise (the β-attention post); masked scores
// are 0.
Var beta_attention(Var q, Var k, Var v, const AttentionOptions& opt = {});

// linear.cpp — O_i = φ(q_i)ᵀS_i / φ(q_i)ᵀz_i with φ = elu + 1 (the linear-attention post); no scale.
Var linear_attention(Var q, Var k, Var v, bool causal = false);

// tiled.cpp — the same map as attention(), computed in key blocks with an online softmax; keeps only
// O and the row log-sum-exp for backward, which recomputes the scores block by block (dQ, dK, dV and dB).
Var tiled_attention(Var q, Var k, Var v, const AttentionOptions& opt = {}, Var bias = {}, int64_t block = 64);

}  // namespace tapegrad
