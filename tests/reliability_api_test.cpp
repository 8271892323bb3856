// Misuse of the library, one table row per wrong call: each must throw tapegrad::Error whose message names the
// op and the shapes involved, and none may crash, abort or return a value.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "models/gpt.hpp"
#include "ops/attention/attention.hpp"
#include "ops/ops.hpp"

using namespace tapegrad;

namespace {

// A wrong call: `call` builds its inputs on a fresh tape and makes the call; `expect` lists what the message
// must contain (the op's name first, then the shapes and numbers it must name).
struct Misuse {
  const char* what;
  std::function<void(Tape&)> call;
  std::vector<std::string> expect;
};

Var f32(Tape& t, Shape s) { return t.leaf(Tensor::zeros(DType::f32, s)); }
Var f64(Tape& t, Shape s) { return t.leaf(Tensor::zeros(DType::f64, s)); }
Var i32(Tape& t, Shape s) { return t.constant(Tensor::zeros(DType::i32, s)); }

// A one-layer GPT over 5 tokens.
GPTConfig tiny_gpt(int64_t block_size, int64_t n_head, int64_t n_embd, std::string attention = "softmax") {
  GPTConfig c;
  c.vocab_size = 5;
  c.block_size = block_size;
  c.n_layer = 1;
  c.n_head = n_head;
  c.n_embd = n_embd;
  c.attention = std::move(attention);
  return c;
}
Var ids(Tape& t, Shape s, std::initializer_list<int32_t> v) { return t.constant(Tensor::from<int32_t>(s, v)); }
Var ones(Tape& t, Shape s) {
  Tensor x = Tensor::zeros(DType::f64, s);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] = 1;
  return t.leaf(x);
}

AttentionOptions causal() {
  AttentionOptions o;
  o.causal = true;
  return o;
}

// A value recorded on `t`, then cleared away.
Var stale(Tape& t, Shape s) {
  Var x = exp(f64(t, s));
  t.clear();
  return x;
}

const std::vector<Misuse>& misuses() {
  static const std::vector<Misuse> table = {
      // ---- element-wise arithmetic: broadcasting and dtypes
      {"add: shapes that do not broadcast",
       [](Tape& t) {
         (void)add(f64(t, {2, 3}), f64(t, {4, 3}));
       },
       {"add", "(2, 3)", "(4, 3)", "broadcast"}},
      {"sub: trailing axes differ",
       [](Tape& t) {
         (void)sub(f64(t, {2, 3, 4}), f64(t, {3, 5}));
       },
       {"sub", "(2, 3, 4)", "(3, 5)"}},
      {"mul: vectors of different lengths",
       [](Tape& t) { (void)mul(f64(t, {5}), f64(t, {4})); },
       {"mul", "(5)", "(4)"}},
      {"div: float32 by float64",
       [](Tape& t) {
         (void)div(f32(t, {2, 3}), f64(t, {2, 3}));
       },
       {"div", "float32", "float64", "(2, 3)"}},
      {"add: int32 and float32",
       [](Tape& t) {
         (void)add(i32(t, {2, 3}), f32(t, {2, 3}));
       },
       {"add", "int32", "(2, 3)"}},
      {"scale: an int32 input", [](Tape& t) { (void)scale(i32(t, {4}), 2.0); }, {"scale", "int32", "(4)"}},
      {"neg: an int32 input",
       [](Tape& t) {
         (void)neg(i32(t, {2, 2}));
       },
       {"neg", "int32", "(2, 2)"}},
      // ---- pointwise
      {"exp: an int32 input", [](Tape& t) { (void)exp(i32(t, {3})); }, {"exp", "int32", "(3)"}},
      {"log: an int32 input",
       [](Tape& t) {
         (void)log(i32(t, {1, 3}));
       },
       {"log", "int32", "(1, 3)"}},
      {"gelu: an int32 input",
       [](Tape& t) {
         (void)gelu(i32(t, {2, 5}));
       },
       {"gelu", "int32", "(2, 5)"}},
      // ---- reductions: axes
      {"sum: axis 2 of a matrix",
       [](Tape& t) {
         (void)sum(f64(t, {2, 3}), 2);
       },
       {"sum", "axis 2", "(2, 3)"}},
      {"mean: axis -3 of a matrix",
       [](Tape& t) {
         (void)mean(f64(t, {2, 3}), -3);
       },
       {"mean", "-3", "(2, 3)"}},
      {"sum: an axis of a scalar", [](Tape& t) { (void)sum(f64(t, {}), 0); }, {"sum", "axis 0", "()"}},
      {"mean: over zero elements",
       [](Tape& t) {
         (void)mean(f64(t, {0, 3}), 0);
       },
       {"mean", "(0, 3)"}},
      {"sum: an int32 input",
       [](Tape& t) {
         (void)sum(i32(t, {2, 3}));
       },
       {"sum", "int32", "(2, 3)"}},
      // ---- shape ops
      {"reshape: another number of elements",
       [](Tape& t) {
         (void)reshape(f64(t, {2, 3}), {4, 2});
       },
       {"reshape", "(2, 3)", "(4, 2)"}},
      {"permute: too few axes",
       [](Tape& t) {
         (void)permute(f64(t, {2, 3, 4}), std::vector<int>{1, 0});
       },
       {"permute", "(1, 0)", "(2, 3, 4)"}},
      {"permute: an axis twice",
       [](Tape& t) {
         (void)permute(f64(t, {2, 3, 4}), std::vector<int>{0, 0, 1});
       },
       {"permute", "(0, 0, 1)", "(2, 3, 4)"}},
      {"permute: an axis out of range",
       [](Tape& t) {
         (void)permute(f64(t, {2, 3, 4}), std::vector<int>{0, 1, 5});
       },
       {"permute", "(0, 1, 5)", "(2, 3, 4)"}},
      {"transpose: axis 3 of a matrix",
       [](Tape& t) {
         (void)transpose(f64(t, {2, 3}), 0, 3);
       },
       {"transpose", "axis 3", "(2, 3)"}},
      {"slice: stop beyond the axis",
       [](Tape& t) {
         (void)slice(f64(t, {2, 3}), 1, 2, 5);
       },
       {"slice", "[2, 5)", "(2, 3)"}},
      {"slice: start after stop", [](Tape& t) { (void)slice(f64(t, {4}), 0, 3, 1); }, {"slice", "[3, 1)", "(4)"}},
      {"slice: axis out of range",
       [](Tape& t) {
         (void)slice(f64(t, {2, 3}), 2, 0, 1);
       },
       {"slice", "axis 2", "(2, 3)"}},
      {"concat: other sizes outside the axis",
       [](Tape& t) {
         (void)concat(std::vector<Var>{f64(t, {2, 3}), f64(t, {3, 4})}, 0);
       },
       {"concat", "(3, 4)", "(2, 3)"}},
      {"concat: mixed dtypes",
       [](Tape& t) {
         (void)concat(std::vector<Var>{f64(t, {2, 3}), f32(t, {2, 3})}, 1);
       },
       {"concat", "float64", "float32", "(2, 3)"}},
      {"concat: axis out of range",
       [](Tape& t) {
         (void)concat(std::vector<Var>{f64(t, {2, 3}), f64(t, {2, 3})}, -3);
       },
       {"concat", "-3", "(2, 3)"}},
      // ---- matmul
      {"matmul: inner dimensions differ",
       [](Tape& t) {
         (void)matmul(f64(t, {2, 3}), f64(t, {4, 5}));
       },
       {"matmul", "(2, 3)", "(4, 5)", "k = 3"}},
      {"matmul: a vector (rank 1)",
       [](Tape& t) {
         (void)matmul(f64(t, {3}), f64(t, {3, 4}));
       },
       {"matmul", "rank", "(3)", "(3, 4)"}},
      {"matmul: batch axes that do not broadcast",
       [](Tape& t) {
         (void)matmul(f64(t, {2, 3, 4}), f64(t, {3, 4, 5}));
       },
       {"matmul", "(2, 3, 4)", "(3, 4, 5)"}},
      {"matmul: float32 @ float64",
       [](Tape& t) {
         (void)matmul(f32(t, {2, 3}), f64(t, {3, 2}));
       },
       {"matmul", "float32", "float64", "(2, 3)", "(3, 2)"}},
      // ---- linear: weight and bias shapes
      {"linear: weight of the wrong width",
       [](Tape& t) {
         (void)linear(f64(t, {2, 3}), f64(t, {4, 5}));
       },
       {"linear", "(2, 3)", "(4, 5)"}},
      {"linear: bias of a wrong shape",
       [](Tape& t) {
         (void)linear(f64(t, {2, 3}), f64(t, {4, 3}), f64(t, {5}));
       },
       {"linear", "bias", "(4, 3)", "(5)"}},
      {"linear: bias of a wrong rank",
       [](Tape& t) {
         (void)linear(f64(t, {2, 3}), f64(t, {4, 3}), f64(t, {1, 4}));
       },
       {"linear", "bias", "(1, 4)"}},
      {"linear: a 1-D weight",
       [](Tape& t) {
         (void)linear(f64(t, {2, 3}), f64(t, {3}));
       },
       {"linear", "(2, 3)", "(3)"}},
      {"linear: mixed dtypes",
       [](Tape& t) {
         (void)linear(f32(t, {2, 3}), f64(t, {4, 3}));
       },
       {"linear", "float32", "float64", "(4, 3)"}},
      // ---- softmax family, row_normalize, layer_norm
      {"softmax: a scalar has no last axis", [](Tape& t) { (void)softmax(f64(t, {})); }, {"softmax", "rank", "()"}},
      {"log_softmax: an int32 input",
       [](Tape& t) {
         (void)log_softmax(i32(t, {2, 4}));
       },
       {"log_softmax", "int32", "(2, 4)"}},
      {"row_normalize: a scalar", [](Tape& t) { (void)row_normalize(f64(t, {})); }, {"row_normalize", "rank", "()"}},
      {"layer_norm: weight of a wrong shape",
       [](Tape& t) {
         (void)layer_norm(f64(t, {2, 3}), f64(t, {4}), f64(t, {3}));
       },
       {"layer_norm", "weight", "(2, 3)", "(4)"}},
      {"layer_norm: bias of a wrong shape",
       [](Tape& t) {
         (void)layer_norm(f64(t, {2, 3}), f64(t, {3}), f64(t, {3, 1}));
       },
       {"layer_norm", "bias", "(2, 3)", "(3, 1)"}},
      {"layer_norm: float32 weight for float64 x",
       [](Tape& t) {
         (void)layer_norm(f64(t, {2, 3}), f32(t, {3}), f64(t, {3}));
       },
       {"layer_norm", "float64", "float32", "(2, 3)", "(3)"}},
      {"layer_norm: eps = 0",
       [](Tape& t) {
         (void)layer_norm(f64(t, {2, 3}), f64(t, {3}), f64(t, {3}), 0.0);
       },
       {"layer_norm", "eps", "(2, 3)"}},
      // ---- embedding and cross_entropy: ids, targets, ranges
      {"embedding: float ids",
       [](Tape& t) {
         (void)embedding(f64(t, {2}), f64(t, {5, 3}));
       },
       {"embedding", "float64", "(2)"}},
      {"embedding: an id past the table",
       [](Tape& t) {
         (void)embedding(ids(t, {2}, {1, 5}), f64(t, {5, 3}));
       },
       {"embedding", "id 5", "(2)", "(5, 3)"}},
      {"embedding: a negative id",
       [](Tape& t) {
         (void)embedding(ids(t, {3}, {0, -1, 2}), f64(t, {5, 3}));
       },
       {"embedding", "id -1", "(3)", "(5, 3)"}},
      {"embedding: a 3-D table",
       [](Tape& t) {
         (void)embedding(ids(t, {1}, {0}), f64(t, {5, 3, 2}));
       },
       {"embedding", "(5, 3, 2)"}},
      {"cross_entropy: targets of another shape",
       [](Tape& t) {
         (void)cross_entropy(f64(t, {2, 3, 5}), i32(t, {2, 2}));
       },
       {"cross_entropy", "(2, 2)", "(2, 3, 5)", "(2, 3)"}},
      {"cross_entropy: float targets",
       [](Tape& t) {
         (void)cross_entropy(f64(t, {2, 5}), f64(t, {2}));
       },
       {"cross_entropy", "float64", "(2)"}},
      {"cross_entropy: a target equal to V",
       [](Tape& t) {
         (void)cross_entropy(f64(t, {2, 5}), ids(t, {2}, {0, 5}));
       },
       {"cross_entropy", "target 5", "(2, 5)", "(2)"}},
      {"cross_entropy: int32 logits",
       [](Tape& t) {
         (void)cross_entropy(i32(t, {2, 5}), ids(t, {2}, {0, 1}));
       },
       {"cross_entropy", "int32", "(2, 5)"}},
      // ---- the attention family
      {"attention: Q of rank 3",
       [](Tape& t) {
         (void)attention(f64(t, {2, 4, 3}), f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 3}));
       },
       {"attention", "Q", "rank 4", "(2, 4, 3)"}},
      {"attention: Q and K differ in d",
       [](Tape& t) {
         (void)attention(f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 5}), f64(t, {1, 2, 4, 3}));
       },
       {"attention", "(1, 2, 4, 3)", "(1, 2, 4, 5)"}},
      {"attention: K and V differ in Tk",
       [](Tape& t) {
         (void)attention(f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 6, 3}), f64(t, {1, 2, 5, 3}));
       },
       {"attention", "(1, 2, 6, 3)", "(1, 2, 5, 3)"}},
      {"attention: batch and heads differ",
       [](Tape& t) {
         (void)attention(f64(t, {2, 2, 4, 3}), f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 3}));
       },
       {"attention", "(2, 2, 4, 3)", "(1, 2, 4, 3)"}},
      {"attention: causal with T ≠ Tk",
       [](Tape& t) {
         (void)attention(f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 6, 3}), f64(t, {1, 2, 6, 3}), causal());
       },
       {"attention", "causal", "(1, 2, 4, 3)", "(1, 2, 6, 3)"}},
      {"attention: Q float32, K and V float64",
       [](Tape& t) {
         (void)attention(f32(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 3}));
       },
       {"attention", "float32", "float64", "(1, 2, 4, 3)"}},
      {"attention: bias longer than T (a context the scores do not have)",
       [](Tape& t) {
         (void)attention(f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 3}), {}, f64(t, {8, 8}));
       },
       {"attention", "bias", "(8, 8)", "(1, 2, 4, 4)"}},
      {"attention: bias of rank 5",
       [](Tape& t) {
         (void)attention(f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 3}), {}, f64(t, {1, 1, 2, 4, 4}));
       },
       {"attention", "bias", "(1, 1, 2, 4, 4)", "(1, 2, 4, 4)"}},
      {"attention: float32 bias for float64 scores",
       [](Tape& t) {
         (void)attention(f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 3}), {}, f32(t, {4, 4}));
       },
       {"attention", "float32", "(4, 4)"}},
      {"attention: a NaN scale",
       [](Tape& t) {
         (void)attention(f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 3}), {NAN, false});
       },
       {"attention", "scale", "finite", "nan"}},
      {"tiled_attention: an infinite scale",
       [](Tape& t) {
         (void)tiled_attention(f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 3}), {INFINITY, false});
       },
       {"tiled_attention", "scale", "finite", "inf"}},
      {"beta_attention: a scale of -inf",
       [](Tape& t) {
         (void)beta_attention(f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 3}), {-INFINITY, true});
       },
       {"beta_attention", "scale", "finite", "-inf"}},
      {"beta_attention: V of rank 2",
       [](Tape& t) {
         (void)beta_attention(f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 3}), f64(t, {4, 3}));
       },
       {"beta_attention", "V", "(4, 3)"}},
      {"beta_attention: causal with T ≠ Tk",
       [](Tape& t) {
         (void)beta_attention(f64(t, {1, 1, 3, 2}), f64(t, {1, 1, 5, 2}), f64(t, {1, 1, 5, 2}), causal());
       },
       {"beta_attention", "(1, 1, 3, 2)", "(1, 1, 5, 2)"}},
      {"linear_attention: Q and K differ in d",
       [](Tape& t) {
         (void)linear_attention(f64(t, {1, 2, 4, 3}), f64(t, {1, 2, 4, 2}), f64(t, {1, 2, 4, 3}));
       },
       {"linear_attention", "(1, 2, 4, 3)", "(1, 2, 4, 2)"}},
      {"linear_attention: int32 queries",
       [](Tape& t) {
         (void)linear_attention(i32(t, {1, 1, 2, 2}), f64(t, {1, 1, 2, 2}), f64(t, {1, 1, 2, 2}));
       },
       {"linear_attention", "int32", "(1, 1, 2, 2)"}},
      {"tiled_attention: block of 0 keys",
       [](Tape& t) {
         (void)tiled_attention(f64(t, {1, 1, 4, 2}), f64(t, {1, 1, 4, 2}), f64(t, {1, 1, 4, 2}), {}, {}, 0);
       },
       {"tiled_attention", "block", "(1, 1, 4, 2)"}},
      {"tiled_attention: bias of the wrong key count",
       [](Tape& t) {
         (void)tiled_attention(f64(t, {1, 1, 4, 2}), f64(t, {1, 1, 4, 2}), f64(t, {1, 1, 4, 2}), {},
                               f64(t, {1, 1, 1, 5}));
       },
       {"tiled_attention", "bias", "(1, 1, 1, 5)", "(1, 1, 4, 4)"}},
      {"tiled_attention: no keys",
       [](Tape& t) {
         (void)tiled_attention(f64(t, {1, 1, 4, 2}), f64(t, {1, 1, 0, 2}), f64(t, {1, 1, 0, 2}));
       },
       {"tiled_attention", "(1, 1, 0, 2)"}},
      // ---- the tape: backward, seeds, clearing
      {"backward twice over one recording",
       [](Tape& t) {
         Var y = sum(ones(t, {2, 3}) * ones(t, {2, 3}));
         t.backward(y);
         t.backward(y);
       },
       {"backward", "twice", "float64 ()"}},
      {"backward of a non-scalar without a seed",
       [](Tape& t) {
         t.backward(exp(ones(t, {2, 3})));
       },
       {"backward", "(2, 3)", "seed"}},
      {"backward with a seed of another shape",
       [](Tape& t) {
         t.backward(exp(ones(t, {2, 3})), Tensor::zeros(DType::f64, {3, 2}));
       },
       {"backward", "(3, 2)", "(2, 3)"}},
      {"backward with a seed of another dtype",
       [](Tape& t) { t.backward(exp(ones(t, {2})), Tensor::zeros(DType::f32, {2})); },
       {"backward", "float32", "float64", "(2)"}},
      {"backward of a value with nothing to differentiate",
       [](Tape& t) {
         t.backward(sum(t.constant(Tensor::zeros(DType::f64, {2, 2}))));
       },
       {"backward", "()"}},
      {"backward of a value from a cleared tape",
       [](Tape& t) {
         Var y = sum(ones(t, {2, 3}));
         t.clear();
         t.backward(y);
       },
       {"backward", "cleared"}},
      {"use after clear: add",
       [](Tape& t) {
         Var x = stale(t, {2, 3});
         (void)add(x, f64(t, {2, 3}));
       },
       {"add", "cleared", "(2, 3)"}},
      {"use after clear: softmax",
       [](Tape& t) {
         (void)softmax(stale(t, {4, 5}));
       },
       {"softmax", "cleared"}},
      {"use after clear: reshape",
       [](Tape& t) {
         (void)reshape(stale(t, {4, 5}), {20});
       },
       {"reshape", "cleared"}},
      {"use after clear: matmul",
       [](Tape& t) {
         Var a = stale(t, {2, 3});
         (void)matmul(f64(t, {3, 2}), a);
       },
       {"matmul", "cleared", "(3, 2)"}},
      {"use after clear: attention",
       [](Tape& t) {
         Var q = stale(t, {1, 1, 2, 2});
         (void)attention(q, f64(t, {1, 1, 2, 2}), f64(t, {1, 1, 2, 2}));
       },
       {"attention", "cleared", "(1, 1, 2, 2)"}},
      {"values of two tapes in one op",
       [](Tape& t) {
         Tape other;
         (void)mul(f64(t, {2}), f64(other, {2}));
       },
       {"mul", "different tapes", "(2)"}},
      {"an undefined weight",
       [](Tape& t) {
         (void)linear(f64(t, {2, 3}), Var{});
       },
       {"linear", "undefined", "(2, 3)"}},
      {"param: gradient of another shape",
       [](Tape& t) {
         (void)t.param(Tensor::zeros(DType::f64, {2, 3}), Tensor::zeros(DType::f64, {3, 2}));
       },
       {"param", "(2, 3)", "(3, 2)"}},
      {"leaf: an int32 tensor that requires a gradient",
       [](Tape& t) { (void)t.leaf(Tensor::zeros(DType::i32, {4})); },
       {"leaf", "int32", "(4)"}},
      {"set_tangent: a tangent of another shape",
       [](Tape& t) {
         t.set_tangent(f64(t, {2, 3}), Tensor::zeros(DType::f64, {6}));
       },
       {"set_tangent", "(6)", "(2, 3)"}},
      // ---- the model: a context longer than it was built for
      {"gpt: T larger than the model's context",
       [](Tape& t) {
         GPT model(tiny_gpt(8, 2, 8), 1);
         (void)model.logits(t, Tensor::zeros(DType::i32, {1, 9}));
       },
       {"gpt", "(1, 9)", "9 tokens", "block_size 8"}},
      {"gpt (super attention): T larger than the model's context",
       [](Tape& t) {
         GPT model(tiny_gpt(4, 1, 4, "super"), 1);
         (void)model.loss(t, Tensor::zeros(DType::i32, {2, 6}), Tensor::zeros(DType::i32, {2, 6}));
       },
       {"gpt", "(2, 6)", "6 tokens", "block_size 4"}},
      {"gpt: targets of another shape",
       [](Tape& t) {
         GPT model(tiny_gpt(4, 1, 4), 1);
         (void)model.loss(t, Tensor::zeros(DType::i32, {2, 4}), Tensor::zeros(DType::i32, {2, 3}));
       },
       {"gpt", "(2, 4)", "(2, 3)"}},
  };
  return table;
}

}  // namespace

TEST_CASE("every wrong call throws a tapegrad::Error naming the op and the shapes") {
  const auto& table = misuses();
  CHECK(table.size() >= 40);
  int passed = 0;
  for (const Misuse& m : table) {
    const std::string what = m.what;
    CAPTURE(what);
    Tape tape;
    std::string message;
    bool threw = false;
    try {
      m.call(tape);
    } catch (const Error& e) {
      threw = true;
      message = e.what();
    } catch (const std::exception& e) {
      FAIL_CHECK("threw a ", typeid(e).name(), " instead of tapegrad::Error: ", e.what());
      continue;
    }
    CAPTURE(message);
    CHECK_MESSAGE(threw, "no error was thrown");
    if (!threw) continue;
    bool all = true;
    for (const std::string& part : m.expect) {
      const bool found = message.find(part) != std::string::npos;
      CHECK_MESSAGE(found, "the message does not name ", part);
      all = all && found;
    }
    CHECK_MESSAGE(message.rfind(m.expect.front() + ":", 0) == 0, "the message does not begin with the op's name");
    CHECK_MESSAGE(message.find('\n') == std::string::npos, "the message is not one line");
    passed += all;
  }
  MESSAGE(passed, " of ", table.size(), " wrong calls were refused with a message naming the op and the shapes");
}

TEST_CASE("after a refused call the tape still works") {
  Tape tape;
  Var x = tape.leaf(Tensor::from<double>({2, 2}, {1, 2, 3, 4}));
  CHECK_THROWS_AS((void)add(x, f64(tape, {3})), Error);
  CHECK_THROWS_AS((void)matmul(x, f64(tape, {3, 3})), Error);
  Var y = sum(x * x);
  tape.backward(y);
  CHECK(x.grad().to_vector() == std::vector<double>{2, 4, 6, 8});
}
