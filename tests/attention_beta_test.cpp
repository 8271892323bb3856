// beta_attention: the fused node against the same map built from primitive ops (forward, gradients, tangents),
// the β-attention post's homogeneity JVP as a claimed derivative that the gradchecker must reject, the required mask on dP,
// numerics, and the errors.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "checker/gradcheck.hpp"
#include "ops/attention/attention.hpp"
#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

// The (T, Tk) causal mask M: 1 where j ≤ i, 0 where j > i.
Tensor causal_mask01(int64_t T, int64_t Tk) {
  Tensor m = Tensor::zeros(DType::f64, {T, Tk});
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j <= i && j < Tk; ++j) m.data<double>()[i * Tk + j] = 1;
  return m;
}

// β((s·Q·Kᵀ) ⊙ M)·V from primitive ops: matmul, transpose, scale, mul, row_normalize.
Var beta_attention_from_primitives(Tape& tape, Var q, Var k, Var v, const AttentionOptions& opt) {
  const double s = opt.scale != 0 ? opt.scale : 1.0 / std::sqrt(static_cast<double>(q.shape()[3]));
  Var scores = scale(matmul(q, transpose(k)), s);
  if (opt.causal) scores = mul(scores, tape.constant(causal_mask01(q.shape()[2], k.shape()[2])));
  return matmul(row_normalize(scores), v);
}

struct Layout {
  const char* name;
  int64_t B, H, T, Tk, d, dv;
  bool causal;
  double scale;
};

void check_against_primitives(const Layout& L) {
  CAPTURE(L.name);
  const AttentionOptions opt{L.scale, L.causal};
  std::vector<Tensor> xs{random_tensor({L.B, L.H, L.T, L.d}, 1), random_tensor({L.B, L.H, L.Tk, L.d}, 2),
                         random_tensor({L.B, L.H, L.Tk, L.dv}, 3)};
  std::vector<Tensor> tangents;
  for (size_t i = 0; i < xs.size(); ++i) tangents.push_back(random_tensor(xs[i].shape(), 10 + i));
  const Tensor seed = random_tensor({L.B, L.H, L.T, L.dv}, 20);
  Function fused = [opt](Tape&, std::span<const Var> x) { return beta_attention(x[0], x[1], x[2], opt); };
  Function composed = [opt](Tape& tape, std::span<const Var> x) {
    return beta_attention_from_primitives(tape, x[0], x[1], x[2], opt);
  };
  const Derivatives a = derivatives(fused, xs, seed, tangents);
  const Derivatives b = derivatives(composed, xs, seed, tangents);
  check_same_derivatives(a, b, {"dQ", "dK", "dV"}, 1e-10);
}

// ---- claimed derivatives, written out in plain loops over one (b, h) slice ----

// The slice's scores P = (s·QKᵀ) ⊙ M (T, Tk), their row norms r, and Bβ = β(P).
struct BetaSlice {
  int64_t T, Tk, d, dv;
  double s;
  bool causal;
  std::vector<double> p, r, beta;
  bool visible(int64_t i, int64_t j) const { return !causal || j <= i; }
};

BetaSlice beta_slice(const Tensor& q, const Tensor& k, const Tensor& v, double s, bool causal) {
  BetaSlice S{q.shape()[2], k.shape()[2], q.shape()[3], v.shape()[3], s, causal, {}, {}, {}};
  S.p.assign(static_cast<size_t>(S.T * S.Tk), 0);
  S.r.assign(static_cast<size_t>(S.T), 0);
  S.beta.assign(S.p.size(), 0);
  for (int64_t i = 0; i < S.T; ++i) {
    double sq = 0;
    for (int64_t j = 0; j < S.Tk; ++j) {
      double z = 0;
      if (S.visible(i, j))
        for (int64_t c = 0; c < S.d; ++c) z += s * q.item(i * S.d + c) * k.item(j * S.d + c);
      S.p[static_cast<size_t>(i * S.Tk + j)] = z;
      sq += z * z;
    }
    S.r[static_cast<size_t>(i)] = std::sqrt(sq);
    for (int64_t j = 0; j < S.Tk; ++j)
      S.beta[static_cast<size_t>(i * S.Tk + j)] = S.p[static_cast<size_t>(i * S.Tk + j)] / (1 + std::sqrt(sq));
  }
  return S;
}

enum class BetaClaim {
  corrected,        // the full dβ in the JVP, dP masked in the VJP
  homogeneity_jvp,  // the β-attention post: Ȯ = (f̃ ⊗ 1ᵀ) ⊙ Att_β(Θ) + Att_β(Q, K, Ṽ), f(x, h) = ⟨x, h⟩/(‖x‖²(1 + ‖x‖))
  unmasked_dp,      // the VJP without the mask on dP
};

// beta_attention on one (b, h) slice (B = h = 1) with its forward, VJP and JVP written out here.
Var beta_attention_claimed(Var q, Var k, Var v, bool causal, BetaClaim claim) {
  Tape& tape = q.tape();
  const Tensor qv = q.value(), kv = k.value(), vv = v.value();
  const BetaSlice S = beta_slice(qv, kv, vv, 1.0 / std::sqrt(static_cast<double>(q.shape()[3])), causal);
  Tensor out = tape.zeros(DType::f64, {1, 1, S.T, S.dv});
  for (int64_t i = 0; i < S.T; ++i)
    for (int64_t c = 0; c < S.dv; ++c)
      for (int64_t j = 0; j < S.Tk; ++j)
        out.data<double>()[i * S.dv + c] += S.beta[static_cast<size_t>(i * S.Tk + j)] * vv.item(j * S.dv + c);
  // u_i ← dβ(p_i)·u_i = c·u − c²(⟨p, u⟩/r)·p, on a (T, Tk) matrix row by row.
  auto apply_dbeta = [S](std::vector<double>& u) {
    for (int64_t i = 0; i < S.T; ++i) {
      const double r = S.r[static_cast<size_t>(i)], c = 1 / (1 + r);
      double pu = 0;
      for (int64_t j = 0; j < S.Tk; ++j)
        pu += S.p[static_cast<size_t>(i * S.Tk + j)] * u[static_cast<size_t>(i * S.Tk + j)];
      for (int64_t j = 0; j < S.Tk; ++j) {
        double& e = u[static_cast<size_t>(i * S.Tk + j)];
        e = c * e - (r > 0 ? c * c * pu / r : 0.0) * S.p[static_cast<size_t>(i * S.Tk + j)];
      }
    }
  };
  return tape.record(
      "beta_attention_claimed", {q, k, v}, out,
      [=](const Tensor& g, std::span<Tensor> gin) {
        std::vector<double> dp(static_cast<size_t>(S.T * S.Tk), 0);  // dBβ = GVᵀ, then dP
        for (int64_t i = 0; i < S.T; ++i)
          for (int64_t j = 0; j < S.Tk; ++j)
            for (int64_t c = 0; c < S.dv; ++c)
              dp[static_cast<size_t>(i * S.Tk + j)] += g.item(i * S.dv + c) * vv.item(j * S.dv + c);
        apply_dbeta(dp);
        if (claim != BetaClaim::unmasked_dp)
          for (int64_t i = 0; i < S.T; ++i)
            for (int64_t j = 0; j < S.Tk; ++j)
              if (!S.visible(i, j)) dp[static_cast<size_t>(i * S.Tk + j)] = 0;
        for (int64_t i = 0; i < S.T; ++i)
          for (int64_t j = 0; j < S.Tk; ++j) {
            const double e = S.s * dp[static_cast<size_t>(i * S.Tk + j)];
            for (int64_t c = 0; c < S.d; ++c) {
              gin[0].data<double>()[i * S.d + c] += e * kv.item(j * S.d + c);
              gin[1].data<double>()[j * S.d + c] += e * qv.item(i * S.d + c);
            }
            for (int64_t c = 0; c < S.dv; ++c)
              gin[2].data<double>()[j * S.dv + c] += S.beta[static_cast<size_t>(i * S.Tk + j)] * g.item(i * S.dv + c);
          }
      },
      [=](std::span<const Tensor> tin, Tensor& tout) {
        // ż = (s(Q̇Kᵀ + QK̇ᵀ)) ⊙ M, the post's z̃_i row by row
        std::vector<double> zdot(static_cast<size_t>(S.T * S.Tk), 0);
        for (int64_t i = 0; i < S.T; ++i)
          for (int64_t j = 0; j < S.Tk; ++j) {
            if (!S.visible(i, j)) continue;
            double z = 0;
            for (int64_t c = 0; c < S.d; ++c) {
              if (tin[0].defined()) z += tin[0].item(i * S.d + c) * kv.item(j * S.d + c);
              if (tin[1].defined()) z += qv.item(i * S.d + c) * tin[1].item(j * S.d + c);
            }
            zdot[static_cast<size_t>(i * S.Tk + j)] = S.s * z;
          }
        double* t = tout.data<double>();
        if (claim == BetaClaim::homogeneity_jvp) {
          // (f̃ ⊗ 1ᵀ) ⊙ Att_β(Θ): row i of O scaled by f(p_i, ż_i)
          for (int64_t i = 0; i < S.T; ++i) {
            const double r = S.r[static_cast<size_t>(i)];
            double pz = 0;
            for (int64_t j = 0; j < S.Tk; ++j)
              pz += S.p[static_cast<size_t>(i * S.Tk + j)] * zdot[static_cast<size_t>(i * S.Tk + j)];
            const double f = r > 0 ? pz / (r * r * (1 + r)) : 0.0;
            for (int64_t c = 0; c < S.dv; ++c) t[i * S.dv + c] += f * out.item(i * S.dv + c);
          }
        } else {
          apply_dbeta(zdot);  // Ḃβ = dβ(P)·Ż, then Ḃβ·V
          for (int64_t i = 0; i < S.T; ++i)
            for (int64_t j = 0; j < S.Tk; ++j)
              for (int64_t c = 0; c < S.dv; ++c)
                t[i * S.dv + c] += zdot[static_cast<size_t>(i * S.Tk + j)] * vv.item(j * S.dv + c);
        }
        if (tin[2].defined())  // Att_β(Q, K, Ṽ) = Bβ·Ṽ
          for (int64_t i = 0; i < S.T; ++i)
            for (int64_t j = 0; j < S.Tk; ++j)
              for (int64_t c = 0; c < S.dv; ++c)
                t[i * S.dv + c] += S.beta[static_cast<size_t>(i * S.Tk + j)] * tin[2].item(j * S.dv + c);
      });
}

GradcheckReport check_claim(BetaClaim claim, bool causal) {
  std::vector<Tensor> xs{random_tensor({1, 1, 5, 4}, 41), random_tensor({1, 1, 5, 4}, 42),
                         random_tensor({1, 1, 5, 3}, 43)};
  const std::vector<std::string> names{"q", "k", "v"};
  Function f = [claim, causal](Tape&, std::span<const Var> x) {
    return beta_attention_claimed(x[0], x[1], x[2], causal, claim);
  };
  // The hand-written forward is the node's forward.
  Function real = [causal](Tape&, std::span<const Var> x) { return beta_attention(x[0], x[1], x[2], {0, causal}); };
  CHECK(max_abs_diff(evaluate(f, xs), evaluate(real, xs)) <= 1e-14);
  return gradcheck(f, xs, names);
}

bool failed(const GradcheckReport& r, const std::string& input, const std::string& check) {
  for (const auto& c : r.checks)
    if (c.input == input && c.check == check && !c.passed) return true;
  return false;
}

}  // namespace

TEST_CASE("beta_attention equals β((s·QKᵀ) ⊙ M)·V built from primitive ops: forward, VJP and JVP") {
  const std::vector<Layout> layouts = {
      {"B=2 h=2 T=4 d=3", 2, 2, 4, 4, 3, 3, false, 0},
      {"causal B=1 h=2 T=7 d=5", 1, 2, 7, 7, 5, 5, true, 0},
      {"T=3 Tk=5 dv=2 s=0.7", 2, 1, 3, 5, 4, 2, false, 0.7},
      {"T=1 Tk=4", 1, 2, 1, 4, 3, 3, false, 0},
      {"causal T=1", 2, 1, 1, 1, 3, 2, true, 0},
      {"causal B=2 h=3 T=6 d=4 dv=2", 2, 3, 6, 6, 4, 2, true, 0},
  };
  for (const Layout& L : layouts) check_against_primitives(L);
}

TEST_CASE(
    "β-attention post: the homogeneity JVP (f̃ ⊗ 1ᵀ) ⊙ Att_β(Θ) + Att_β(Q,K,Ṽ) fails the gradchecker; the full dβ "
    "passes") {
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    const GradcheckReport claimed = check_claim(BetaClaim::homogeneity_jvp, causal);
    MESSAGE("claimed (β-attention post, homogeneity JVP, causal " << causal << "):\n" << claimed.str());
    CHECK_FALSE(claimed.passed());
    CHECK(failed(claimed, "q", "jvp"));
    CHECK(failed(claimed, "k", "jvp"));
    CHECK_FALSE(failed(claimed, "v", "jvp"));  // the Att_β(Q, K, Ṽ) term is right

    const GradcheckReport corrected = check_claim(BetaClaim::corrected, causal);
    INFO(corrected.str());
    CHECK(corrected.passed());
  }
  // The property itself: for h ⟂ x, dβ(x)·h = h/(1 + ‖x‖) ≠ 0 while f(x, h)·β(x) = 0.
  const double x[2] = {3, 4}, h[2] = {-4, 3}, eps = 1e-6;  // ‖x‖ = 5, ⟨x, h⟩ = 0
  auto beta = [](double a, double b, int i) { return (i == 0 ? a : b) / (1 + std::hypot(a, b)); };
  for (int i = 0; i < 2; ++i) {
    const double numeric =
        (beta(x[0] + eps * h[0], x[1] + eps * h[1], i) - beta(x[0] - eps * h[0], x[1] - eps * h[1], i)) / (2 * eps);
    CHECK(numeric == doctest::Approx(h[i] / 6).epsilon(1e-8));
  }
}

TEST_CASE("β-attention's VJP must mask dP: without the mask the gradchecker rejects dQ and dK") {
  const GradcheckReport unmasked = check_claim(BetaClaim::unmasked_dp, true);
  MESSAGE("claimed (dP not masked, causal):\n" << unmasked.str());
  CHECK(failed(unmasked, "q", "vjp"));
  CHECK(failed(unmasked, "k", "vjp"));
  CHECK_FALSE(failed(unmasked, "v", "vjp"));
}

TEST_CASE("beta_attention numerics") {
  SUBCASE("zero scores give output 0 exactly and finite gradients (dβ(0) = I)") {
    for (bool causal : {false, true}) {
      CAPTURE(causal);
      Tape tape;
      Var q = tape.leaf(Tensor::zeros(DType::f64, {1, 2, 4, 3})), k = tape.leaf(random_tensor({1, 2, 4, 3}, 5));
      Var v = tape.leaf(random_tensor({1, 2, 4, 2}, 6));
      Var o = beta_attention(q, k, v, {0, causal});
      CHECK(max_abs(o.value()) == 0);
      tape.backward(o, random_tensor({1, 2, 4, 2}, 7));
      CHECK(all_finite(q.grad()));
      CHECK(max_abs(q.grad()) > 0);  // dQ = s·M ⊙ (GVᵀ)·K
      CHECK(max_abs(k.grad()) == 0);
      CHECK(max_abs(v.grad()) == 0);
    }
  }
  SUBCASE("a row whose keys are all zero gives output 0, never NaN") {
    Tape tape;
    Var q = tape.leaf(random_tensor({1, 1, 3, 2}, 8)), k = tape.leaf(Tensor::zeros(DType::f64, {1, 1, 3, 2}));
    Var v = tape.leaf(random_tensor({1, 1, 3, 2}, 9));
    Var o = beta_attention(q, k, v, {0, true});
    CHECK(max_abs(o.value()) == 0);
    tape.backward(o, random_tensor({1, 1, 3, 2}, 10));
    CHECK(all_finite(q.grad()));
    CHECK(all_finite(k.grad()));
  }
  SUBCASE("scores of ±1e4 stay finite; β saturates at a unit vector") {
    for (DType dt : {DType::f64, DType::f32}) {
      CAPTURE(dt);
      Tape tape;
      Var q = tape.leaf(random_tensor({1, 1, 3, 1}, 11, 100).to(dt)),
          k = tape.leaf(random_tensor({1, 1, 3, 1}, 12, 100).to(dt));
      Var v = tape.leaf(random_tensor({1, 1, 3, 2}, 13).to(dt));
      Var o = beta_attention(q, k, v, {1.0, false});
      CHECK(all_finite(o.value()));
      tape.backward(o, random_tensor({1, 1, 3, 2}, 14).to(dt));
      CHECK(all_finite(q.grad()));
      CHECK(all_finite(k.grad()));
    }
  }
  SUBCASE("T = 1") {
    // One query over Tk = 3 keys: O = β(s·qKᵀ)·V, checked against the formula directly.
    Tensor q = random_tensor({1, 1, 1, 2}, 15), k = random_tensor({1, 1, 3, 2}, 16),
           v = random_tensor({1, 1, 3, 2}, 17);
    std::vector<Tensor> xs{q, k, v};
    Tensor o = evaluate(
        [](Tape&, std::span<const Var> x) {
          return beta_attention(x[0], x[1], x[2], {0.5, false});
        },
        xs);
    double p[3], r = 0;
    for (int j = 0; j < 3; ++j) {
      p[j] = 0.5 * (q.item(0) * k.item(2 * j) + q.item(1) * k.item(2 * j + 1));
      r += p[j] * p[j];
    }
    r = std::sqrt(r);
    for (int c = 0; c < 2; ++c) {
      double expect = 0;
      for (int j = 0; j < 3; ++j) expect += p[j] / (1 + r) * v.item(2 * j + c);
      CHECK(std::abs(o.item(c) - expect) <= 1e-15);
    }
  }
  SUBCASE("float32 is within 1e-5 (relative to the largest entry) of float64, forward and gradients") {
    const Shape qs{2, 2, 16, 8};
    std::vector<Tensor> xs{random_tensor(qs, 18), random_tensor(qs, 19), random_tensor(qs, 20)};
    const Tensor seed = random_tensor(qs, 21);
    Function f = [](Tape&, std::span<const Var> x) { return beta_attention(x[0], x[1], x[2], {0, true}); };
    const auto [forward_err, grad_err] = float32_error(f, xs, seed);
    MESSAGE("float32 vs float64: forward " << forward_err << ", gradients " << grad_err << " (relative to max)");
    CHECK(forward_err <= 1e-5);
    CHECK(grad_err <= 1e-5);
  }
}

TEST_CASE("beta_attention errors name the op and the shapes") {
  Tape tape;
  auto leaf = [&tape](Shape s, DType dt = DType::f64) { return tape.leaf(Tensor::zeros(dt, s)); };
  Var q = leaf({2, 3, 4, 5}), k = leaf({2, 3, 6, 5}), v = leaf({2, 3, 6, 7});
  auto expect = [](const std::string& msg, std::initializer_list<const char*> parts) {
    check_message(msg, "beta_attention: ", parts);
  };
  expect(error_of([&] { beta_attention(leaf({4, 5}), k, v); }), {"Q", "(4, 5)", "rank 4"});
  expect(error_of([&] { beta_attention(q, leaf({2, 3, 6, 4}), v); }), {"(2, 3, 4, 5)", "(2, 3, 6, 4)", "d"});
  expect(error_of([&] { beta_attention(q, leaf({2, 1, 6, 5}), v); }), {"(2, 3, 4, 5)", "(2, 1, 6, 5)"});
  expect(error_of([&] { beta_attention(q, k, leaf({1, 3, 6, 7})); }), {"(2, 3, 4, 5)", "(1, 3, 6, 7)"});
  expect(error_of([&] { beta_attention(q, k, leaf({2, 3, 7, 7})); }), {"(2, 3, 6, 5)", "(2, 3, 7, 7)", "Tk"});
  expect(error_of([&] { beta_attention(q, k, v, {0, true}); }), {"causal", "(2, 3, 4, 5)", "(2, 3, 6, 5)"});
  expect(error_of([&] { beta_attention(q, k, leaf({2, 3, 6, 7}, DType::f32)); }), {"dtype", "float32", "float64"});
}
