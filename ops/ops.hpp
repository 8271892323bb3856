// The ops: each records one node on its inputs' tape, with its VJP and JVP.
// One file per family in ops/; the derivation of each op sits in a comment above its kernels.
#pragma once

#include <span>

#include "../engine/tape.hpp"
#include "gelu.hpp"

namespace tapegrad {

class Registry;  // ops/registry.hpp: the tooling, above the ops; the ops never include it

// arithmetic.cpp — element-wise, NumPy broadcasting; the VJP sums over the broadcast axes.
Var add(Var a, Var b);
Var sub(Var a, Var b);
Var mul(Var a, Var b);
Var div(Var a, Var b);
Var neg(Var x);
Var scale(Var x, double s);

// pointwise.cpp — y = f(x) element by element.
Var exp(Var x);
Var log(Var x);
Var tanh(Var x);
Var relu(Var x);
Var gelu(Var x);      // GPT-2's tanh form: ½x(1 + tanh(√(2/π)(x + 0.044715x³)))
Var gelu_erf(Var x);  // the exact form x·Φ(x), as PyTorch's nn.GELU() (ops/gelu.hpp has both)
Var elu(Var x, double alpha = 1.0);
Var sigmoid(Var x);        // 1/(1 + e⁻ˣ)
Var square(Var x);         // x²
Var sqrt(Var x);           // √x; x < 0 is an error
Var abs(Var x);            // |x|, derivative sign x and 0 at x = 0
Var pow(Var x, double p);  // xᵖ; x < 0 with p not an integer, or x = 0 with p < 0, is an error
// An element-wise op of one's own from f and f′: pointwise(name, x, f, df) in ops/pointwise.hpp.

// reduce.cpp
Var sum(Var x);  // over all elements: shape ()
Var sum(Var x, int axis, bool keepdim = false);
Var mean(Var x);
Var mean(Var x, int axis, bool keepdim = false);

// shape.cpp
Var reshape(Var x, Shape shape);  // same number of elements, same order
Var permute(Var x, std::span<const int> perm);
Var transpose(Var x, int axis0 = -2, int axis1 = -1);
Var slice(Var x, int axis, int64_t start, int64_t stop);  // [start, stop) along axis
Var concat(std::span<const Var> xs, int axis);

// matmul.cpp — (..., m, k) @ (..., k, n) → (..., m, n), batch dimensions broadcast; every product through gemm() of
// ops/products/blas.hpp: float64 on OpenBLAS, float32 on OpenBLAS or oneDNN, in f32 or bf16, by ops/products/products.hpp's rule.
Var matmul(Var a, Var b);

// linear.cpp — y = x·Wᵀ + b with W (out, in) as PyTorch stores it; bias optional (an undefined Var). With a residual
// r of y's shape, the layer's output joins a residual stream in the same node: y = (x·Wᵀ + b) + r, the numbers of
// add(r, linear(x, weight, bias)) without the node and tensor between them.
Var linear(Var x, Var weight, Var bias = {}, Var residual = {});

// mlp.cpp — linear, gelu, linear as one node (the GPT block's MLP): y = gelu(x·W₁ᵀ + b₁)·W₂ᵀ + b₂, biases optional,
// the gelu of either form (exact: nanoGPT's; tanh: GPT-2's).
// With a residual r of y's shape: y = (gelu(x·W₁ᵀ + b₁)·W₂ᵀ + b₂) + r, as for linear.
Var mlp(Var x, Var w1, Var b1, Var w2, Var b2, GeluForm form, Var residual = {});

// softmax.cpp — over the last axis.
Var softmax(Var x);
Var log_softmax(Var x);

// row_normalize.cpp — β(x) = x / (1 + ‖x‖) over the last axis.
Var row_normalize(Var x);

// layer_norm.cpp — over the last axis, with weight and bias of that axis' size.
Var layer_norm(Var x, Var weight, Var bias, double eps = 1e-5);

// embedding.cpp — ids int32 (...), table (V, C) → (..., C).
Var embedding(Var ids, Var table);

// mse_loss.cpp — mean over all elements of (prediction − target)²: a scalar. The two shapes must be equal (no
// broadcasting: a (N, 1) prediction against a (N) target is an error, not a (N, N) difference).
Var mse_loss(Var prediction, Var target);

// cross_entropy.cpp — mean over rows of −log softmax(logits)[target]; logits (..., V), targets int32 (...).
Var cross_entropy(Var logits, Var targets);

// heads.cpp — the attention block's head split and merge, one copy each.
// split_heads: x (B, T, W), columns [offset, offset + width) as `heads` heads → (B, heads, T, width/heads).
Var split_heads(Var x, int64_t heads, int64_t offset, int64_t width);
// merge_heads: y (B, h, T, d) → (B, T, h·d).
Var merge_heads(Var y);

inline Var operator+(Var a, Var b) { return add(a, b); }
inline Var operator-(Var a, Var b) { return sub(a, b); }
inline Var operator*(Var a, Var b) { return mul(a, b); }
inline Var operator/(Var a, Var b) { return div(a, b); }
inline Var operator-(Var x) { return neg(x); }
inline Var operator*(Var x, double s) { return scale(x, s); }
inline Var operator*(double s, Var x) { return scale(x, s); }

// The registry of every built-in op with its gradcheck cases, filled on first use from their sheets
// (ops/all_ops.hpp); defined in ops/registry.cpp.
Registry& builtin_registry();

}  // namespace tapegrad
