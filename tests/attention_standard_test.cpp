// attention: the fused node against the same map built from primitive ops (forward, gradients, tangents), the
// attention-bias post's prose derivative as a claimed VJP that the gradchecker must reject, numerics, and the errors.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "checker/gradcheck.hpp"
#include "engine/parallel.hpp"
#include "ops/attention/attention.hpp"
#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The (T, Tk) causal mask M: 0 where j ≤ i, −∞ where j > i.
Tensor causal_mask(int64_t T, int64_t Tk) {
  Tensor m = Tensor::zeros(DType::f64, {T, Tk});
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = i + 1; j < Tk; ++j) m.data<double>()[i * Tk + j] = -kInf;
  return m;
}

// softmax(s·Q·Kᵀ + bias + M)·V from primitive ops: matmul, transpose, scale, add, softmax.
Var attention_from_primitives(Tape& tape, Var q, Var k, Var v, const AttentionOptions& opt, Var bias) {
  const double s = opt.scale != 0 ? opt.scale : 1.0 / std::sqrt(static_cast<double>(q.shape()[3]));
  Var scores = scale(matmul(q, transpose(k)), s);
  if (bias.defined()) scores = add(scores, bias);
  if (opt.causal) scores = add(scores, tape.constant(causal_mask(q.shape()[2], k.shape()[2])));
  return matmul(softmax(scores), v);
}

struct Layout {
  const char* name;
  int64_t B, H, T, Tk, d, dv;
  bool causal;
  double scale;
  std::vector<int64_t> bias;  // empty: no bias
};

void check_against_primitives(const Layout& L) {
  CAPTURE(L.name);
  const AttentionOptions opt{L.scale, L.causal};
  std::vector<Tensor> xs{random_tensor({L.B, L.H, L.T, L.d}, 1), random_tensor({L.B, L.H, L.Tk, L.d}, 2),
                         random_tensor({L.B, L.H, L.Tk, L.dv}, 3)};
  if (!L.bias.empty()) xs.push_back(random_tensor(Shape(std::span<const int64_t>(L.bias)), 4));
  std::vector<Tensor> tangents;
  for (size_t i = 0; i < xs.size(); ++i) tangents.push_back(random_tensor(xs[i].shape(), 10 + i));
  const Tensor seed = random_tensor({L.B, L.H, L.T, L.dv}, 20);

  Function fused = [opt](Tape&, std::span<const Var> x) {
    return attention(x[0], x[1], x[2], opt, x.size() > 3 ? x[3] : Var{});
  };
  Function composed = [opt](Tape& tape, std::span<const Var> x) {
    return attention_from_primitives(tape, x[0], x[1], x[2], opt, x.size() > 3 ? x[3] : Var{});
  };
  const Derivatives a = derivatives(fused, xs, seed, tangents);
  const Derivatives b = derivatives(composed, xs, seed, tangents);
  check_same_derivatives(a, b, {"dQ", "dK", "dV", "dB"}, 1e-10);
}

// ---- the attention-bias post's derivative as a claimed VJP (docs/derivations.md §5.3, §5.5) ----

// A = softmax(s·QKᵀ + B) over (B, h, T, Tk), bias of the full shape, in plain loops.
std::vector<double> naive_probabilities(const Tensor& q, const Tensor& k, const Tensor& bias, double s) {
  const Shape& qs = q.shape();
  const int64_t BH = qs[0] * qs[1], T = qs[2], d = qs[3], Tk = k.shape()[2];
  std::vector<double> a(static_cast<size_t>(BH * T * Tk));
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t i = 0; i < T; ++i) {
      double* row = &a[static_cast<size_t>((bh * T + i) * Tk)];
      double max = -kInf, sum = 0;
      for (int64_t j = 0; j < Tk; ++j) {
        double z = bias.item((bh * T + i) * Tk + j);
        for (int64_t c = 0; c < d; ++c) z += s * q.item((bh * T + i) * d + c) * k.item((bh * Tk + j) * d + c);
        row[j] = z;
        max = std::max(max, z);
      }
      for (int64_t j = 0; j < Tk; ++j) sum += row[j] = std::exp(row[j] - max);
      for (int64_t j = 0; j < Tk; ++j) row[j] /= sum;
    }
  return a;
}

enum class ScoreGradient {
  corrected,    // dS = A ⊙ (dA − rowsum(A ⊙ dA)·1ᵀ), dQ = s·dS·K, dK = s·dSᵀ·Q
  prose_ds,     // the post's prose dS = dA ⊙ (dA − (dA·Aᵀ)1), with the corrected dQ and dK
  prose_dq_dk,  // the corrected dS with the post's prose dQ = dS·K and dK = dS·Q (no s, no transpose)
};

// attention(q, k, v, bias) with its real forward and JVP, and the VJP written out in plain loops in the
// given variant. Bias of the full shape, no mask, T = Tk.
Var attention_with_claimed_vjp(Var q, Var k, Var v, Var bias, ScoreGradient variant) {
  Tape& tape = q.tape();
  Function real = [](Tape&, std::span<const Var> x) { return attention(x[0], x[1], x[2], {}, x[3]); };
  std::vector<Tensor> xs{q.value(), k.value(), v.value(), bias.value()};
  Tensor out = tape.empty(DType::f64, {q.shape()[0], q.shape()[1], q.shape()[2], v.shape()[3]});
  out.copy_from(evaluate(real, xs));
  const double s = 1.0 / std::sqrt(static_cast<double>(q.shape()[3]));
  const std::vector<double> a = naive_probabilities(xs[0], xs[1], xs[3], s);
  return tape.record(
      "attention_claimed_vjp", {q, k, v, bias}, out,
      [=](const Tensor& g, std::span<Tensor> gin) {
        const Shape& qs = xs[0].shape();
        const int64_t BH = qs[0] * qs[1], T = qs[2], d = qs[3], dv = xs[2].shape()[3];
        auto A = [&](int64_t bh, int64_t i, int64_t j) { return a[static_cast<size_t>((bh * T + i) * T + j)]; };
        std::vector<double> dA(static_cast<size_t>(T * T)), dS(static_cast<size_t>(T * T));
        for (int64_t bh = 0; bh < BH; ++bh) {
          auto G = [&](int64_t i, int64_t c) { return g.item((bh * T + i) * dv + c); };
          auto V = [&](int64_t j, int64_t c) { return xs[2].item((bh * T + j) * dv + c); };
          auto Q = [&](int64_t i, int64_t c) { return xs[0].item((bh * T + i) * d + c); };
          auto K = [&](int64_t j, int64_t c) { return xs[1].item((bh * T + j) * d + c); };
          for (int64_t i = 0; i < T; ++i)
            for (int64_t j = 0; j < T; ++j) {
              double acc = 0;
              for (int64_t c = 0; c < dv; ++c) acc += G(i, c) * V(j, c);
              dA[static_cast<size_t>(i * T + j)] = acc;
            }
          for (int64_t i = 0; i < T; ++i) {
            double row_term = 0;
            if (variant == ScoreGradient::prose_ds) {  // ((dA·Aᵀ)1)_i = Σ_k Σ_j dA_ij A_kj
              for (int64_t kk = 0; kk < T; ++kk)
                for (int64_t j = 0; j < T; ++j) row_term += dA[static_cast<size_t>(i * T + j)] * A(bh, kk, j);
            } else {  // rowsum(A ⊙ dA)_i
              for (int64_t j = 0; j < T; ++j) row_term += A(bh, i, j) * dA[static_cast<size_t>(i * T + j)];
            }
            for (int64_t j = 0; j < T; ++j) {
              const double da = dA[static_cast<size_t>(i * T + j)];
              const double first = variant == ScoreGradient::prose_ds ? da : A(bh, i, j);
              dS[static_cast<size_t>(i * T + j)] = first * (da - row_term);
            }
          }
          const bool prose_qk = variant == ScoreGradient::prose_dq_dk;
          const double sq = prose_qk ? 1.0 : s;
          for (int64_t i = 0; i < T; ++i)
            for (int64_t c = 0; c < d; ++c) {
              double dq = 0, dk = 0;
              for (int64_t j = 0; j < T; ++j) {
                dq += dS[static_cast<size_t>(i * T + j)] * K(j, c);
                // dK_i = s·Σ_j dS_ji Q_j; the prose form takes dS_ij instead of dS_ji
                dk += (prose_qk ? dS[static_cast<size_t>(i * T + j)] : dS[static_cast<size_t>(j * T + i)]) * Q(j, c);
              }
              gin[0].data<double>()[(bh * T + i) * d + c] += sq * dq;
              gin[1].data<double>()[(bh * T + i) * d + c] += sq * dk;
            }
          for (int64_t j = 0; j < T; ++j)
            for (int64_t c = 0; c < dv; ++c) {
              double acc = 0;
              for (int64_t i = 0; i < T; ++i) acc += A(bh, i, j) * G(i, c);
              gin[2].data<double>()[(bh * T + j) * dv + c] += acc;
            }
          for (int64_t i = 0; i < T * T; ++i) gin[3].data<double>()[bh * T * T + i] += dS[static_cast<size_t>(i)];
        }
      },
      [=](std::span<const Tensor> tin, Tensor& tout) {
        std::vector<Tensor> ts;
        for (size_t i = 0; i < 4; ++i) ts.push_back(tin[i]);
        tout.accumulate(jvp(real, xs, ts).second);
      });
}

GradcheckReport check_claim(ScoreGradient variant) {
  std::vector<Tensor> xs{random_tensor({1, 2, 4, 4}, 31), random_tensor({1, 2, 4, 4}, 32),
                         random_tensor({1, 2, 4, 3}, 33), random_tensor({1, 2, 4, 4}, 34)};
  const std::vector<std::string> names{"q", "k", "v", "bias"};
  Function f = [variant](Tape&, std::span<const Var> x) {
    return attention_with_claimed_vjp(x[0], x[1], x[2], x[3], variant);
  };
  return gradcheck(f, xs, names);
}

bool vjp_failed(const GradcheckReport& r, const std::string& input) {
  for (const auto& c : r.checks)
    if (c.input == input && c.check == "vjp" && !c.passed) return true;
  return false;
}

}  // namespace

TEST_CASE("attention equals softmax(s·QKᵀ + bias + M)·V built from primitive ops: forward, VJP and JVP") {
  const std::vector<Layout> layouts = {
      {"B=2 h=2 T=4 d=3", 2, 2, 4, 4, 3, 3, false, 0, {}},
      {"causal B=1 h=2 T=7 d=5", 1, 2, 7, 7, 5, 5, true, 0, {}},
      {"T=3 Tk=5 dv=2 s=0.7", 2, 1, 3, 5, 4, 2, false, 0.7, {}},
      {"T=1", 1, 2, 1, 1, 3, 3, false, 0, {}},
      {"causal T=1", 2, 1, 1, 1, 3, 2, true, 0, {}},
      {"bias (B,h,T,Tk)", 2, 3, 4, 5, 3, 2, false, 0, {2, 3, 4, 5}},
      {"bias (B,h,T,Tk) causal", 2, 3, 4, 4, 3, 2, true, 0, {2, 3, 4, 4}},
      {"bias (h,T,Tk)", 2, 3, 4, 5, 3, 2, false, 0, {3, 4, 5}},
      {"bias (T,Tk) causal", 2, 3, 4, 4, 3, 2, true, 0, {4, 4}},
      {"bias (B,1,T,Tk)", 2, 3, 4, 5, 3, 2, false, 0, {2, 1, 4, 5}},
      {"bias (B,1,1,Tk) causal", 2, 3, 4, 4, 3, 2, true, 0, {2, 1, 1, 4}},
      {"bias (B,1,1,Tk) B=1 h=2 T=7 d=5", 1, 2, 7, 6, 5, 5, false, 0, {1, 1, 1, 6}},
  };
  for (const Layout& L : layouts) check_against_primitives(L);
}

TEST_CASE(
    "attention-bias post: the prose dS = dA ⊙ (dA − (dA·Aᵀ)1) fails the gradchecker; A ⊙ (dA − rowsum(A ⊙ dA)) "
    "passes") {
  const GradcheckReport prose = check_claim(ScoreGradient::prose_ds);
  MESSAGE("claimed (attention-bias post, prose dS):\n" << prose.str());
  CHECK_FALSE(prose.passed());
  CHECK(vjp_failed(prose, "q"));
  CHECK(vjp_failed(prose, "bias"));

  const GradcheckReport prose_qk = check_claim(ScoreGradient::prose_dq_dk);
  MESSAGE("claimed (attention-bias post, prose dQ = dS·K, dK = dS·Q):\n" << prose_qk.str());
  CHECK_FALSE(prose_qk.passed());
  CHECK(vjp_failed(prose_qk, "q"));
  CHECK(vjp_failed(prose_qk, "k"));

  const GradcheckReport corrected = check_claim(ScoreGradient::corrected);
  INFO(corrected.str());
  CHECK(corrected.passed());
}

TEST_CASE("attention numerics") {
  SUBCASE("logits of ±1e4 give a finite one-hot output and finite gradients, in float64 and float32") {
    // d = 1, s = 1: scores q_i·k_j of size up to ~1e4; each row's softmax is one-hot on its largest score.
    const std::vector<double> qv{100, -100, 50}, kv{100, -90, 20, -100};
    for (DType dt : {DType::f64, DType::f32}) {
      CAPTURE(dt);
      Tape tape;
      Var q = tape.leaf(Tensor::from<double>({1, 1, 3, 1}, std::span<const double>(qv)).to(dt));
      Var k = tape.leaf(Tensor::from<double>({1, 1, 4, 1}, std::span<const double>(kv)).to(dt));
      Var v = tape.leaf(random_tensor({1, 1, 4, 2}, 5).to(dt));
      Var o = attention(q, k, v, {1.0, false});
      CHECK(all_finite(o.value()));
      const int64_t argmax[] = {0, 3, 0};  // row i: argmax_j q_i·k_j
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t c = 0; c < 2; ++c)
          CHECK(o.value().item(i * 2 + c) == doctest::Approx(v.value().item(argmax[i] * 2 + c)).epsilon(1e-6));
      tape.backward(o, random_tensor({1, 1, 3, 2}, 6).to(dt));
      CHECK(all_finite(q.grad()));
      CHECK(all_finite(k.grad()));
      CHECK(all_finite(v.grad()));
    }
  }
  SUBCASE("all-equal scores give uniform A: O_i is the mean of the visible V rows") {
    Tensor q = Tensor::zeros(DType::f64, {1, 2, 5, 3});
    Tensor k = random_tensor({1, 2, 5, 3}, 7), v = random_tensor({1, 2, 5, 4}, 8);
    for (bool causal : {false, true}) {
      CAPTURE(causal);
      std::vector<Tensor> xs{q, k, v};
      Tensor o = evaluate(
          [causal](Tape&, std::span<const Var> x) {
            return attention(x[0], x[1], x[2], {0, causal});
          },
          xs);
      for (int64_t bh = 0; bh < 2; ++bh)
        for (int64_t i = 0; i < 5; ++i)
          for (int64_t c = 0; c < 4; ++c) {
            const int64_t visible = causal ? i + 1 : 5;
            double mean = 0;
            for (int64_t j = 0; j < visible; ++j) mean += v.item((bh * 5 + j) * 4 + c) / static_cast<double>(visible);
            CHECK(std::abs(o.item((bh * 5 + i) * 4 + c) - mean) <= 1e-14);
          }
    }
  }
  SUBCASE("T = Tk = 1: A = 1, so O = V, dV = G and dQ = dK = 0") {
    Tape tape;
    Var q = tape.leaf(random_tensor({2, 1, 1, 3}, 9)), k = tape.leaf(random_tensor({2, 1, 1, 3}, 10));
    Var v = tape.leaf(random_tensor({2, 1, 1, 2}, 11));
    Var o = attention(q, k, v, {0, true});
    CHECK(max_abs_diff(o.value(), v.value()) == 0);
    Tensor g = random_tensor({2, 1, 1, 2}, 12);
    tape.backward(o, g);
    CHECK(max_abs_diff(v.grad(), g) == 0);
    CHECK(max_abs(q.grad()) == 0);
    CHECK(max_abs(k.grad()) == 0);
  }
  SUBCASE("a row fully masked by a −∞ bias gives O_i = 0 and no gradient, not NaN") {
    Tensor bias = Tensor::zeros(DType::f64, {3, 4});
    for (int64_t j = 0; j < 4; ++j) bias.data<double>()[1 * 4 + j] = -kInf;  // query 1 sees no key
    Tape tape;
    Var q = tape.leaf(random_tensor({1, 1, 3, 2}, 13)), k = tape.leaf(random_tensor({1, 1, 4, 2}, 14));
    Var v = tape.leaf(random_tensor({1, 1, 4, 2}, 15));
    Var o = attention(q, k, v, {}, tape.constant(bias));
    CHECK(all_finite(o.value()));
    CHECK(o.value().item(2) == 0);
    CHECK(o.value().item(3) == 0);
    tape.backward(o, random_tensor({1, 1, 3, 2}, 16));
    CHECK(all_finite(q.grad()));
    CHECK(all_finite(k.grad()));
    CHECK(q.grad().item(2) == 0);
    CHECK(q.grad().item(3) == 0);
  }
  SUBCASE("float32 is within 1e-5 (relative to the largest entry) of float64, forward and gradients") {
    const Shape qs{2, 2, 16, 8}, vs{2, 2, 16, 8};
    std::vector<Tensor> xs{random_tensor(qs, 17), random_tensor(qs, 18), random_tensor(vs, 19),
                           random_tensor({2, 1, 16, 16}, 20)};
    const Tensor seed = random_tensor(vs, 21);
    Function f = [](Tape&, std::span<const Var> x) { return attention(x[0], x[1], x[2], {0, true}, x[3]); };
    const auto [forward_err, grad_err] = float32_error(f, xs, seed);
    MESSAGE("float32 vs float64: forward " << forward_err << ", gradients " << grad_err << " (relative to max)");
    CHECK(forward_err <= 1e-5);
    CHECK(grad_err <= 1e-5);
  }
}

TEST_CASE("attention errors name the op and the shapes") {
  Tape tape;
  auto leaf = [&tape](Shape s, DType dt = DType::f64) { return tape.leaf(Tensor::zeros(dt, s)); };
  Var q = leaf({2, 3, 4, 5}), k = leaf({2, 3, 6, 5}), v = leaf({2, 3, 6, 7});
  auto expect = [](const std::string& msg, std::initializer_list<const char*> parts) {
    check_message(msg, "attention: ", parts);
  };
  expect(error_of([&] { attention(leaf({2, 4, 5}), k, v); }), {"Q", "(2, 4, 5)", "rank 4"});
  expect(error_of([&] { attention(q, leaf({2, 3, 6, 5, 1}), v); }), {"K", "(2, 3, 6, 5, 1)", "rank 4"});
  expect(error_of([&] { attention(q, k, leaf({3, 6, 7})); }), {"V", "(3, 6, 7)", "rank 4"});
  expect(error_of([&] { attention(q, leaf({2, 3, 6, 4}), v); }), {"(2, 3, 4, 5)", "(2, 3, 6, 4)", "d"});
  expect(error_of([&] { attention(q, leaf({1, 3, 6, 5}), v); }), {"(2, 3, 4, 5)", "(1, 3, 6, 5)"});
  expect(error_of([&] { attention(q, k, leaf({2, 2, 6, 7})); }), {"(2, 3, 4, 5)", "(2, 2, 6, 7)"});
  expect(error_of([&] { attention(q, k, leaf({2, 3, 5, 7})); }), {"(2, 3, 6, 5)", "(2, 3, 5, 7)", "Tk"});
  expect(error_of([&] { attention(q, k, v, {0, true}); }), {"causal", "(2, 3, 4, 5)", "(2, 3, 6, 5)"});
  expect(error_of([&] { attention(q, k, v, {}, leaf({2, 2, 4, 6})); }), {"bias", "(2, 2, 4, 6)", "(2, 3, 4, 6)"});
  expect(error_of([&] { attention(q, k, v, {}, leaf({4, 5})); }), {"bias", "(4, 5)", "(2, 3, 4, 6)"});
  expect(error_of([&] { attention(q, k, v, {}, leaf({1, 2, 3, 4, 6})); }), {"bias", "(1, 2, 3, 4, 6)"});
  expect(error_of([&] { attention(q, leaf({2, 3, 6, 5}, DType::f32), v); }), {"dtype", "float32", "float64"});
  expect(error_of([&] { attention(q, k, v, {}, leaf({4, 6}, DType::f32)); }), {"dtype", "(4, 6)"});
  expect(error_of([&] {
           attention(tape.leaf(Tensor::zeros(DType::i32, {2, 3, 4, 5}), false), k, v);
         }),
         {"int32", "(2, 3, 4, 5)"});
  // Every allowed bias layout is accepted.
  for (Shape b : {Shape{2, 3, 4, 6}, Shape{3, 4, 6}, Shape{4, 6}, Shape{2, 1, 4, 6}, Shape{2, 1, 1, 6}})
    CHECK(error_of([&] { attention(q, k, v, {}, leaf(b)); }) == kNoError);
}

// attention_qkv against the five nodes it stands for, in float32 at the default GPT's shape (B = 12, T = 64, C = 128,
// 4 heads), causal, on one thread and on two: the same numbers bit for bit (±0 aside: == treats them alike), the
// value, the gradient, the tangent and the Hessian-vector product.
TEST_CASE("attention_qkv equals split_heads ×3, attention, merge_heads bit for bit in float32") {
  const int saved = num_threads();
  const int64_t B = 12, T = 64, C = 128, H = 4;
  AttentionOptions causal;
  causal.causal = true;
  const Function packed = [&](Tape&, std::span<const Var> x) { return attention_qkv(x[0], H, causal); };
  const Function nodes = [&](Tape&, std::span<const Var> x) {
    return merge_heads(
        attention(split_heads(x[0], H, 0, C), split_heads(x[0], H, C, C), split_heads(x[0], H, 2 * C, C), causal));
  };
  const std::vector<Tensor> x{Tensor::randn(DType::f32, {B, T, 3 * C}, 7)};
  const Tensor g = Tensor::randn(DType::f32, {B, T, C}, 8);
  const std::vector<Tensor> t{Tensor::randn(DType::f32, {B, T, 3 * C}, 9)};
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    set_num_threads(threads);
    CHECK(evaluate(packed, x).to_vector() == evaluate(nodes, x).to_vector());
    CHECK(vjp(packed, x, g)[0].to_vector() == vjp(nodes, x, g)[0].to_vector());
    CHECK(jvp(packed, x, t).second.to_vector() == jvp(nodes, x, t).second.to_vector());
    CHECK(hvp(packed, x, g, t)[0].to_vector() == hvp(nodes, x, g, t)[0].to_vector());
  }
  set_num_threads(saved);
}

TEST_CASE("attention_qkv refuses what is not a packed q | k | v, naming the shapes") {
  Tape tape;
  const Var bad_axis = tape.leaf(Tensor::zeros(DType::f64, {2, 4, 10}));
  CHECK_THROWS_WITH_AS(attention_qkv(bad_axis, 2), doctest::Contains("its last axis 10 is not 3C"), Error);
  const Var x = tape.leaf(Tensor::zeros(DType::f64, {2, 4, 12}));
  CHECK_THROWS_WITH_AS(attention_qkv(x, 3), doctest::Contains("do not split into 3 heads"), Error);
  const Var rank2 = tape.leaf(Tensor::zeros(DType::f64, {4, 12}));
  CHECK_THROWS_WITH_AS(attention_qkv(rank2, 2), doctest::Contains("qkv must be (B, T, 3C), got shape"), Error);
  CHECK_THROWS_WITH_AS(attention_qkv(x, 2, AttentionOptions{std::nan(""), false}),
                       doctest::Contains("scale must be a finite number"), Error);
}
