// The gradchecker over every registered op; planted slips, each of which it must catch and name; the two
// formulas of the source posts that are wrong as written (the β-attention post's homogeneity JVP of β, the
// attention-bias post's prose dS) as claimed derivatives; ops without a JVP; and the gradcheck command on a registry of one's own.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <set>

#include <nlohmann/json.hpp>

#include "checker/gradcheck.hpp"
#include "checker/cli.hpp"
#include "checker/precision.hpp"
#include "engine/parallel.hpp"
#include "ops/attention/attention.hpp"
#include "ops/ops.hpp"
#include "ops/pointwise.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

// The op names recorded on the tape when a case is built.
std::set<std::string> recorded_ops(const GradcheckCase& c) {
  Tape tape;
  auto xs = make_inputs(c.inputs, DType::f64, 1);
  std::vector<Var> vars;
  for (auto& x : xs) vars.push_back(tape.leaf(x, x.dtype() != DType::i32));
  c.build(tape, vars);
  std::set<std::string> names;
  for (size_t i = 0; i < tape.num_nodes(); ++i) names.insert(tape.node(i).op);
  return names;
}

const CheckResult* find_check(const GradcheckReport& r, std::string_view check, std::string_view input = "") {
  for (const auto& c : r.checks)
    if (c.check == check && !c.passed && (input.empty() || c.input == input)) return &c;
  return nullptr;
}

double* data(Tensor t) { return t.data<double>(); }  // a handle: writes the same data

// The engine single-threaded within a scope, as the gradcheck command runs: the problems are tiny.
struct SerialEngine {
  int saved = num_threads();
  SerialEngine() { set_num_threads(1); }
  ~SerialEngine() { set_num_threads(saved); }
};

// ---- y = x², recorded with planted VJP and JVP ----

struct SquareSlip {
  double vjp_factor = 2, jvp_factor = 2;  // x̄ += vjp_factor·x·ȳ, ẏ += jvp_factor·x·ẋ (right at 2)
  bool overwrite = false;                 // the VJP assigns instead of adding
  bool quadratic = false;                 // x̄ += 2x·ȳ²: not linear in ȳ
};

Var planted_square(Var x, SquareSlip s) {
  Tape& tape = x.tape();
  Tensor xv = x.value();
  Tensor y = tape.empty(DType::f64, x.shape());
  const int64_t n = y.numel();
  for (int64_t i = 0; i < n; ++i) data(y)[i] = data(xv)[i] * data(xv)[i];
  return tape.record(
      "planted_square", {x}, y,
      [=](const Tensor& g, std::span<Tensor> gin) {
        for (int64_t i = 0; i < n; ++i) {
          const double gi = s.quadratic ? data(g)[i] * data(g)[i] : data(g)[i];
          const double v = s.vjp_factor * data(xv)[i] * gi;
          data(gin[0])[i] = s.overwrite ? v : data(gin[0])[i] + v;
        }
      },
      [=](std::span<const Tensor> tin, Tensor& ty) {
        for (int64_t i = 0; i < n; ++i) data(ty)[i] += s.jvp_factor * data(xv)[i] * data(tin[0])[i];
      });
}

GradcheckCase square_case(SquareSlip s) {
  return {"planted", {{"x", {3, 4}}}, [=](Tape&, std::span<const Var> x) { return planted_square(x[0], s); }};
}

// ---- claimed VJPs against built-in forwards (plain loops, float64) ----

Var softmax_of(Tape&, std::span<const Var> x) { return softmax(x[0]); }

// The softmax VJP x̄_r = p_r ⊙ (ȳ_r − D_r), D_r = ⟨p_r, ȳ_r⟩, with one of its terms planted wrong.
enum class SoftmaxSlip { none, no_normalizer, no_diagonal, wrong_row, row_term_without_p };

ClaimedVjp softmax_vjp(SoftmaxSlip slip) {
  return [slip](const ClaimPoint& at, const Tensor& g, std::span<Tensor> gin) {
    const Tensor& p = at.output;
    const int64_t cols = p.shape().back(), rows = p.numel() / cols;
    std::vector<double> d(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) d[static_cast<size_t>(r)] += data(p)[r * cols + c] * data(g)[r * cols + c];
    for (int64_t r = 0; r < rows; ++r) {
      // wrong_row: the last row takes the first row's D (an index slip in a per-row normalizer)
      const double dr = slip == SoftmaxSlip::wrong_row && r == rows - 1 ? d[0] : d[static_cast<size_t>(r)];
      for (int64_t c = 0; c < cols; ++c) {
        const double pi = data(p)[r * cols + c], gi = data(g)[r * cols + c];
        double v = pi * (gi - dr);
        if (slip == SoftmaxSlip::no_normalizer) v = pi * gi;            // drops −p·D
        if (slip == SoftmaxSlip::no_diagonal) v = -pi * dr;             // drops p ⊙ ȳ
        if (slip == SoftmaxSlip::row_term_without_p) v = pi * gi - dr;  // −D where −p·D belongs
        data(gin[0])[r * cols + c] += v;
      }
    }
  };
}

GradcheckReport check_softmax(SoftmaxSlip slip) {
  Function f = claimed({"softmax_claimed", softmax_of, softmax_vjp(slip), {}});
  return gradcheck(f, {random_tensor({3, 5}, 7)}, {"x"});
}

// Causal softmax over a square score matrix: y = softmax(x + M), M_ij = −∞ for j > i. Its VJP needs no mask
// (p = 0 above the diagonal); the planted one masks j ≥ i instead of j > i: the boundary off by one.
GradcheckReport check_causal_softmax_mask_off_by_one() {
  const int64_t T = 4;
  Tensor mask = Tensor::zeros(DType::f64, {T, T});
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = i + 1; j < T; ++j) data(mask)[i * T + j] = -INFINITY;
  Function forward = [mask](Tape& tape, std::span<const Var> x) { return softmax(x[0] + tape.constant(mask)); };
  ClaimedVjp off_by_one = [T](const ClaimPoint& at, const Tensor& g, std::span<Tensor> gin) {
    const double* p = data(at.output);
    for (int64_t i = 0; i < T; ++i) {
      double d = 0;
      for (int64_t j = 0; j < T; ++j) d += p[i * T + j] * data(g)[i * T + j];
      for (int64_t j = 0; j < i; ++j) data(gin[0])[i * T + j] += p[i * T + j] * (data(g)[i * T + j] - d);
    }
  };
  return gradcheck(claimed({"causal_softmax_claimed", forward, off_by_one, {}}), {random_tensor({T, T}, 8)}, {"s"});
}

// y = x·W; the planted VJP gives W̄ = ȲᵀX, the transpose of XᵀȲ.            x (3, 4), w (4, 4), y (3, 4)
GradcheckReport check_matmul_transposed_weight_gradient() {
  ClaimedVjp vjp = [](const ClaimPoint& at, const Tensor& g, std::span<Tensor> gin) {
    const Tensor &x = at.inputs[0], &w = at.inputs[1];
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t k = 0; k < 4; ++k)
        for (int64_t j = 0; j < 4; ++j) {
          data(gin[0])[i * 4 + k] += data(g)[i * 4 + j] * data(w)[k * 4 + j];  // X̄ = ȲWᵀ
          data(gin[1])[j * 4 + k] += data(x)[i * 4 + k] * data(g)[i * 4 + j];  // W̄ᵀ = ȲᵀX: a transpose slip
        }
  };
  Function forward = [](Tape&, std::span<const Var> x) { return matmul(x[0], x[1]); };
  return gradcheck(claimed({"matmul_claimed", forward, vjp, {}}), {random_tensor({3, 4}, 9), random_tensor({4, 4}, 10)},
                   {"x", "w"});
}

// y = x·W with square y; the planted VJP reads ȳ transposed: X̄ = ȲᵀWᵀ.                  x, w, y (4, 4)
GradcheckReport check_matmul_cotangent_read_transposed() {
  ClaimedVjp vjp = [](const ClaimPoint& at, const Tensor& g, std::span<Tensor> gin) {
    const Tensor &x = at.inputs[0], &w = at.inputs[1];
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t k = 0; k < 4; ++k)
        for (int64_t j = 0; j < 4; ++j) {
          data(gin[0])[i * 4 + k] += data(g)[j * 4 + i] * data(w)[k * 4 + j];  // Ȳᵀ where Ȳ belongs
          data(gin[1])[k * 4 + j] += data(x)[i * 4 + k] * data(g)[i * 4 + j];  // W̄ = XᵀȲ
        }
  };
  Function forward = [](Tape&, std::span<const Var> x) { return matmul(x[0], x[1]); };
  return gradcheck(claimed({"matmul_claimed", forward, vjp, {}}),
                   {random_tensor({4, 4}, 16), random_tensor({4, 4}, 17)}, {"x", "w"});
}

// y = M·x with a fixed non-symmetric M; the planted VJP applies M where Mᵀ belongs.     M (4, 4), x (4, 1)
GradcheckReport check_jacobian_applied_untransposed() {
  Tensor m = random_tensor({4, 4}, 11);
  Function forward = [m](Tape& tape, std::span<const Var> x) { return matmul(tape.constant(m), x[0]); };
  ClaimedVjp vjp = [m](const ClaimPoint&, const Tensor& g, std::span<Tensor> gin) {
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 4; ++j) data(gin[0])[i] += data(m)[i * 4 + j] * data(g)[j];  // M ȳ, not Mᵀ ȳ
  };
  return gradcheck(claimed({"linear_map_claimed", forward, vjp, {}}), {random_tensor({4, 1}, 12)}, {"x"});
}

// y = a ⊙ b; the planted VJP gives b̄ = ȳ ⊙ b (it should be ȳ ⊙ a).
GradcheckReport check_mul_wrong_second_gradient() {
  ClaimedVjp vjp = [](const ClaimPoint& at, const Tensor& g, std::span<Tensor> gin) {
    for (int64_t i = 0; i < g.numel(); ++i) {
      data(gin[0])[i] += data(g)[i] * data(at.inputs[1])[i];
      data(gin[1])[i] += data(g)[i] * data(at.inputs[1])[i];
    }
  };
  Function forward = [](Tape&, std::span<const Var> x) { return mul(x[0], x[1]); };
  return gradcheck(claimed({"mul_claimed", forward, vjp, {}}), {random_tensor({2, 3}, 13), random_tensor({2, 3}, 14)},
                   {"a", "b"});
}

// β(x) = x/(1+‖x‖) per row; the planted VJP x̄ = c·ȳ drops the per-row term −c²(⟨x, ȳ⟩/r)·x.
GradcheckReport check_row_normalize_without_normalizer_term() {
  ClaimedVjp vjp = [](const ClaimPoint& at, const Tensor& g, std::span<Tensor> gin) {
    const Tensor& x = at.inputs[0];
    const int64_t cols = x.shape().back(), rows = x.numel() / cols;
    for (int64_t r = 0; r < rows; ++r) {
      double rr = 0;
      for (int64_t c = 0; c < cols; ++c) rr += data(x)[r * cols + c] * data(x)[r * cols + c];
      const double c_r = 1 / (1 + std::sqrt(rr));
      for (int64_t c = 0; c < cols; ++c) data(gin[0])[r * cols + c] += c_r * data(g)[r * cols + c];
    }
  };
  Function forward = [](Tape&, std::span<const Var> x) { return row_normalize(x[0]); };
  return gradcheck(claimed({"row_normalize_claimed", forward, vjp, {}}), {random_tensor({3, 4}, 15)}, {"x"});
}

// ---- a node of one's own: the causal prefix mean y_i = (1/(i+1))·Σ_{j≤i} x_j over rows ----
//   VJP  x̄_j += Σ_{i≥j} ȳ_i/(i+1)            JVP  ẏ_i = (1/(i+1))·Σ_{j≤i} ẋ_j                     x, y: (T, C)
// forget_mask: the VJP sums over every i (the planted slip).

Var prefix_mean(Var x, bool forget_mask) {
  Tape& tape = x.tape();
  const Tensor xv = x.value();
  const int64_t T = x.shape()[0], C = x.shape()[1];
  Tensor y = tape.zeros(DType::f64, x.shape());
  auto apply = [T, C](double* out, const double* in) {  // out_i += (1/(i+1))·Σ_{j≤i} in_j
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j <= i; ++j)
        for (int64_t c = 0; c < C; ++c) out[i * C + c] += in[j * C + c] / static_cast<double>(i + 1);
  };
  apply(data(y), data(xv));
  return tape.record(
      "prefix_mean", {x}, y,
      [=](const Tensor& g, std::span<Tensor> gin) {
        for (int64_t j = 0; j < T; ++j)
          for (int64_t i = forget_mask ? 0 : j; i < T; ++i)
            for (int64_t c = 0; c < C; ++c) data(gin[0])[j * C + c] += data(g)[i * C + c] / static_cast<double>(i + 1);
      },
      [=](std::span<const Tensor> tin, Tensor& ty) { apply(data(ty), data(tin[0])); });
}

// y = x² with its VJP and no forward-mode rule.
Var square_without_jvp(Var x) {
  Tape& tape = x.tape();
  const Tensor xv = x.value();
  Tensor y = tape.empty(DType::f64, x.shape());
  for (int64_t i = 0; i < y.numel(); ++i) data(y)[i] = data(xv)[i] * data(xv)[i];
  return tape.record(
      "square_without_jvp", {x}, y,
      [=](const Tensor& g, std::span<Tensor> gin) {
        for (int64_t i = 0; i < g.numel(); ++i) data(gin[0])[i] += 2 * data(xv)[i] * data(g)[i];
      },
      no_jvp("square_without_jvp"));
}

// ---- the posts' formulas (docs/derivations.md §1.3 and §5.3) as claimed derivatives ----

// The β-attention post: dβ(x)·h = f(x, h)·β(x), f = ⟨x, h⟩/(r²(1 + r)), r = ‖x‖, per row.
ClaimedJvp claimed_homogeneity_jvp() {
  return [](const ClaimPoint& at, std::span<const Tensor> tin, Tensor& tout) {
    const Tensor &x = at.inputs[0], &beta = at.output;
    const int64_t cols = x.shape().back(), rows = x.numel() / cols;
    for (int64_t r = 0; r < rows; ++r) {
      double rr = 0, xh = 0;
      for (int64_t c = 0; c < cols; ++c) {
        rr += data(x)[r * cols + c] * data(x)[r * cols + c];
        xh += data(x)[r * cols + c] * data(tin[0])[r * cols + c];
      }
      const double f = xh / (rr * (1 + std::sqrt(rr)));
      for (int64_t c = 0; c < cols; ++c) data(tout)[r * cols + c] += f * data(beta)[r * cols + c];
    }
  };
}

GradcheckReport check_homogeneity_claim() {
  Function forward = [](Tape&, std::span<const Var> x) { return row_normalize(x[0]); };
  return gradcheck(claimed({"beta_homogeneity_jvp", forward, {}, claimed_homogeneity_jvp()}),
                   {random_tensor({4, 6}, 41)}, {"x"});
}

// The attention-bias post on one (b, h) slice, bias of the full shape: A = softmax(s·QKᵀ + B), dA = G Vᵀ, and
//   corrected  dS = A ⊙ (dA − rowsum(A ⊙ dA)·1ᵀ)         prose  dS = dA ⊙ (dA − (dA·Aᵀ)·1)
//   dQ = s·dS·K,  dK = s·dSᵀ·Q  (prose_qk: dQ = dS·K, dK = dS·Q),  dV = AᵀG,  dB = dS.     Q, K (T, d); V (T, dv)
enum class ScoreGradientClaim { corrected, prose_ds, prose_qk };

ClaimedVjp claimed_score_gradient_vjp(ScoreGradientClaim variant) {
  return [variant](const ClaimPoint& at, const Tensor& g, std::span<Tensor> gin) {
    const Tensor &q = at.inputs[0], &k = at.inputs[1], &v = at.inputs[2], &b = at.inputs[3];
    const int64_t T = q.shape()[2], d = q.shape()[3], dv = v.shape()[3];
    const double s = 1 / std::sqrt(static_cast<double>(d));
    std::vector<double> a(static_cast<size_t>(T * T)), da(a.size()), ds(a.size());
    auto at_ij = [T](std::vector<double>& m, int64_t i, int64_t j) -> double& {
      return m[static_cast<size_t>(i * T + j)];
    };
    for (int64_t i = 0; i < T; ++i) {
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < T; ++j) {
        double z = data(b)[i * T + j];
        for (int64_t c = 0; c < d; ++c) z += s * data(q)[i * d + c] * data(k)[j * d + c];
        at_ij(a, i, j) = z;
        mx = std::max(mx, z);
      }
      for (int64_t j = 0; j < T; ++j) sum += at_ij(a, i, j) = std::exp(at_ij(a, i, j) - mx);
      for (int64_t j = 0; j < T; ++j) at_ij(a, i, j) /= sum;
      for (int64_t j = 0; j < T; ++j)
        for (int64_t c = 0; c < dv; ++c) at_ij(da, i, j) += data(g)[i * dv + c] * data(v)[j * dv + c];
    }
    for (int64_t i = 0; i < T; ++i) {
      double row = 0;  // rowsum(A ⊙ dA)_i, or the prose ((dA·Aᵀ)1)_i = Σ_j' Σ_j dA_ij A_j'j
      for (int64_t j = 0; j < T; ++j) {
        if (variant == ScoreGradientClaim::prose_ds)
          for (int64_t jj = 0; jj < T; ++jj) row += at_ij(da, i, j) * at_ij(a, jj, j);
        else row += at_ij(a, i, j) * at_ij(da, i, j);
      }
      for (int64_t j = 0; j < T; ++j)
        at_ij(ds, i, j) =
            (variant == ScoreGradientClaim::prose_ds ? at_ij(da, i, j) : at_ij(a, i, j)) * (at_ij(da, i, j) - row);
    }
    const double sq = variant == ScoreGradientClaim::prose_qk ? 1.0 : s;
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j) {
        for (int64_t c = 0; c < d; ++c) {
          data(gin[0])[i * d + c] += sq * at_ij(ds, i, j) * data(k)[j * d + c];
          // dK_j = s·Σ_i dS_ij Q_i; the prose dK = dS·Q takes dS_ji instead
          const double dkj = variant == ScoreGradientClaim::prose_qk ? at_ij(ds, j, i) : at_ij(ds, i, j);
          data(gin[1])[j * d + c] += sq * dkj * data(q)[i * d + c];
        }
        for (int64_t c = 0; c < dv; ++c) data(gin[2])[j * dv + c] += at_ij(a, i, j) * data(g)[i * dv + c];
        data(gin[3])[i * T + j] += at_ij(ds, i, j);
      }
  };
}

GradcheckReport check_score_gradient_claim(ScoreGradientClaim variant) {
  Function forward = [](Tape&, std::span<const Var> x) { return attention(x[0], x[1], x[2], {}, x[3]); };
  std::vector<Tensor> xs{random_tensor({1, 1, 4, 4}, 31), random_tensor({1, 1, 4, 4}, 32),
                         random_tensor({1, 1, 4, 3}, 33), random_tensor({1, 1, 4, 4}, 34)};
  const std::vector<std::string> names{"q", "k", "v", "bias"};
  return gradcheck(claimed({"attention_claimed_vjp", forward, claimed_score_gradient_vjp(variant), {}}), xs, names);
}

std::string read_all(std::FILE* f) {
  std::rewind(f);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  return s;
}

}  // namespace

TEST_CASE("every registered op has a gradcheck case, and each case records that op") {
  const Registry& reg = builtin_registry();
  REQUIRE(reg.ops().size() > 0);
  for (const OpSheet& op : reg.ops()) {
    CAPTURE(op.name);
    CHECK_MESSAGE(!op.cases.empty(), "op '" << op.name << "' is registered without a gradcheck case");
    for (const auto& c : op.cases) {
      CAPTURE(c.name);
      CHECK(recorded_ops(c).count(op.name) == 1);
    }
  }
}

TEST_CASE("every registered case passes the VJP, JVP, adjoint and accumulation checks in float64") {
  SerialEngine serial;
  int cases = 0;
  double worst_vjp = 0, worst_jvp = 0;
  for (const OpSheet& op : builtin_registry().ops())
    for (const GradcheckReport& r : gradcheck(op)) {
      CHECK(r.passed);  // prints the report and its diagnosis on a failure
      CHECK(r.checks.size() >= 4);
      CHECK(r.diagnoses.empty());
      for (const auto& c : r.checks) {
        if (c.check == "vjp") worst_vjp = std::max(worst_vjp, c.max_abs_err);
        if (c.check == "jvp") worst_jvp = std::max(worst_jvp, c.max_abs_err);
      }
      ++cases;
    }
  MESSAGE(cases << " cases checked; worst VJP error " << worst_vjp << ", worst JVP error " << worst_jvp);
}

TEST_CASE("the fast mode (random projections) passes on correct ops") {
  GradcheckOptions fast;
  fast.full_jacobian_limit = 0;
  for (const char* name : {"mul", "gelu", "div"}) {
    const OpSheet* op = builtin_registry().find(name);
    REQUIRE(op);
    GradcheckReport r = gradcheck(op->cases.back(), fast, name);
    CHECK(r.passed);
    CHECK(r.checks[0].mode == "fast");
  }
}

TEST_CASE("a report's passed converts to bool, is callable, and streams the table with the diagnosis") {
  GradcheckReport good = gradcheck(square_case({}));
  CHECK(good.passed);
  CHECK(good.passed());
  GradcheckReport bad = gradcheck(square_case({.vjp_factor = -2}));
  CHECK_FALSE(bad.passed);
  const std::string shown = doctest::toString(bad.passed).c_str();  // what a failed CHECK(bad.passed) prints
  CHECK(shown.find("FAILED") != std::string::npos);
  CHECK(shown.find("vjp") != std::string::npos);
  CHECK(shown.find("[sign]") != std::string::npos);
  CHECK(doctest::toString(bad).c_str() == bad.str());
}

TEST_CASE("gradcheck(f, inputs) takes a braced list of inputs and names") {
  Tensor a = random_tensor({2, 3}, 1), b = random_tensor({2, 3}, 2);
  GradcheckReport r = gradcheck([](Tape&, std::span<const Var> x) { return mul(x[0], x[1]); }, {a, b}, {"a", "b"});
  CHECK(r.passed);
  CHECK(r.checks.size() == 8);
  CHECK(r.checks[4].input == "b");
}

// ---- each diagnosis, on a slip planted for it ----

TEST_CASE("diagnosis: a sign slip (ratio −1), in full and in fast mode") {
  for (int64_t limit : {int64_t{40000}, int64_t{0}}) {
    CAPTURE(limit);
    GradcheckOptions opt;
    opt.full_jacobian_limit = limit;
    GradcheckReport r = gradcheck(square_case({.vjp_factor = -2}), opt);
    CHECK_FALSE(r.passed);
    CHECK(find_check(r, "vjp"));
    CHECK(find_check(r, "adjoint"));
    CHECK_FALSE(find_check(r, "jvp"));
    CHECK(r.has(Finding::sign, "x"));
    CHECK(r.has(Finding::vjp_only, "x"));
    CHECK_FALSE(r.has(Finding::scale));
  }
}

TEST_CASE("diagnosis: a missing factor (constant ratio), with the factor printed") {
  GradcheckReport r = gradcheck(square_case({.vjp_factor = 1}));
  INFO(r.str());
  const Diagnosis* d = r.find(Finding::scale, "x");
  REQUIRE(d);
  CHECK(d->check == "vjp");
  CHECK(d->message.find("c = 0.5 = 1/2") != std::string::npos);
  const CheckResult* vj = find_check(r, "vjp");
  REQUIRE(vj);
  CHECK(vj->max_rel_err == doctest::Approx(0.5).epsilon(1e-6));  // half the true derivative
}

TEST_CASE("diagnosis: VJP right, JVP wrong (and the adjoint identity failing with it)") {
  GradcheckReport r = gradcheck(square_case({.jvp_factor = 1}));
  INFO(r.str());
  CHECK(find_check(r, "jvp"));
  CHECK(find_check(r, "adjoint"));
  CHECK_FALSE(find_check(r, "vjp"));
  CHECK(r.has(Finding::jvp_only, "x"));
  CHECK(r.find(Finding::jvp_only, "x")->message.find("adjoint identity") != std::string::npos);
  CHECK(r.has(Finding::scale, "x"));
  CHECK_FALSE(r.has(Finding::vjp_only));
}

TEST_CASE("diagnosis: VJP and JVP each within tolerance but not adjoint to each other") {
  GradcheckReport r = gradcheck(square_case({.vjp_factor = 2 * (1 + 1e-5)}));  // 1e-5 relative: below rtol
  INFO(r.str());
  CHECK_FALSE(find_check(r, "vjp"));
  CHECK_FALSE(find_check(r, "jvp"));
  CHECK(find_check(r, "adjoint"));
  CHECK(r.has(Finding::adjoint, "x"));
}

TEST_CASE("diagnosis: VJP and JVP wrong in the same way (a shared derivation)") {
  GradcheckReport r = gradcheck(square_case({.vjp_factor = 3, .jvp_factor = 3}));
  INFO(r.str());
  CHECK(r.has(Finding::consistent, "x"));
  CHECK(r.find(Finding::scale, "x")->message.find("c = 1.5") != std::string::npos);
}

TEST_CASE("diagnosis: a VJP that overwrites the gradient instead of adding to it") {
  GradcheckReport r = gradcheck(square_case({.overwrite = true}));
  INFO(r.str());
  CHECK_FALSE(r.passed);
  CHECK(find_check(r, "accumulate"));
  CHECK_FALSE(find_check(r, "vjp"));
  CHECK(r.has(Finding::overwrites, "x"));
}

TEST_CASE("diagnosis: a VJP that is not linear in ȳ, with its degree") {
  GradcheckReport r = gradcheck(square_case({.quadratic = true}));
  INFO(r.str());
  const Diagnosis* d = r.find(Finding::nonlinear, "x");
  REQUIRE(d);
  CHECK(d->message.find("degree 2") != std::string::npos);
  for (const Diagnosis& each : r.diagnoses) CHECK_MESSAGE(quoted_in_doc("gradchecking.md", each.str()), each.str());
}

TEST_CASE("diagnosis: a VJP that writes nothing, and one that writes NaN") {
  GradcheckReport zero = gradcheck(square_case({.vjp_factor = 0}));
  INFO(zero.str());
  CHECK(zero.has(Finding::zero, "x"));
  GradcheckReport nan = gradcheck(square_case({.vjp_factor = NAN}));
  INFO(nan.str());
  CHECK(nan.has(Finding::not_finite, "x"));
}

TEST_CASE("diagnosis: a transpose slip in one input's gradient, confined to that input") {
  GradcheckReport r = check_matmul_transposed_weight_gradient();
  INFO(r.str());
  CHECK(find_check(r, "vjp", "w"));
  CHECK_FALSE(find_check(r, "vjp", "x"));
  const Diagnosis* d = r.find(Finding::transposed_input, "w");
  REQUIRE(d);
  CHECK(d->message.find("axes 0 and 1 of w (4, 4) swapped") != std::string::npos);
  CHECK(r.has(Finding::one_input, "w"));
}

TEST_CASE("diagnosis: a VJP that reads the cotangent transposed (an output's axes swapped)") {
  GradcheckReport r = check_matmul_cotangent_read_transposed();
  INFO(r.str());
  const Diagnosis* d = r.find(Finding::transposed_output, "x");
  REQUIRE(d);
  CHECK(d->message.find("axes 0 and 1 of y (4, 4) swapped") != std::string::npos);
  CHECK(r.has(Finding::one_input, "x"));
}

TEST_CASE("diagnosis: J applied where Jᵀ belongs (the transposed Jacobian)") {
  GradcheckReport r = check_jacobian_applied_untransposed();
  INFO(r.str());
  CHECK(r.has(Finding::transposed_jacobian, "x"));
  CHECK_FALSE(r.has(Finding::scale));
}

// exp over (3, 5) whose VJP is off by one place: it writes x̄[r, c + 1] (writes_over) or reads ȳ[r, c + 1]
// (reads_over) where x̄[r, c] and ȳ[r, c] belong; a sum's VJP that leaves each row's first element out is no shift.
Function exp_off_by_one(bool writes_over) {
  return claimed({"exp_off_by_one",
                  [](Tape&, std::span<const Var> x) { return exp(x[0]); },
                  [writes_over](const ClaimPoint& at, const Tensor& g, std::span<Tensor> gin) {
                    const int64_t cols = at.output.shape().back();
                    for (int64_t e = 0; e < at.output.numel(); ++e) {
                      if (e % cols + 1 == cols) continue;
                      if (writes_over) data(gin[0])[e + 1] += data(g)[e] * data(at.output)[e];
                      else data(gin[0])[e] += data(g)[e + 1] * data(at.output)[e];
                    }
                  },
                  {}});
}

TEST_CASE("diagnosis: a VJP off by one place along an axis of x or of y is shifted") {
  for (const bool writes_over : {true, false}) {
    CAPTURE(writes_over);
    GradcheckReport r = gradcheck(exp_off_by_one(writes_over), {random_tensor({3, 5}, 1)}, {"x"});
    INFO(r.str());
    const Diagnosis* d = r.find(Finding::shifted, "x");
    REQUIRE(d);
    CHECK(d->message.find(writes_over ? "axis 1 of x (3, 5) moved by +1" : "axis 1 of y (3, 5) moved by +1") !=
          std::string::npos);
    CHECK_MESSAGE(quoted_in_doc("gradchecking.md", d->str()), d->str());
  }
  // sum over the last axis, its VJP leaving x̄[r, 0] at 0: N is constant along the row, so N moved by one is N but
  // at the edge; the pattern is masked positions, not a shift.
  Function first_left_out = claimed({"sum_first_left_out",
                                     [](Tape&, std::span<const Var> x) { return sum(x[0], -1); },
                                     [](const ClaimPoint& at, const Tensor& g, std::span<Tensor> gin) {
                                       const int64_t cols = at.inputs[0].shape().back();
                                       for (int64_t e = 0; e < at.inputs[0].numel(); ++e)
                                         if (e % cols != 0) data(gin[0])[e] += data(g)[e / cols];
                                     },
                                     {}});
  GradcheckReport r = gradcheck(first_left_out, {random_tensor({3, 5}, 2)}, {"x"});
  INFO(r.str());
  CHECK(!r.passed);
  CHECK_FALSE(r.has(Finding::shifted));
}

TEST_CASE("diagnosis: an error confined to one input") {
  GradcheckReport r = check_mul_wrong_second_gradient();
  INFO(r.str());
  CHECK(r.has(Finding::one_input, "b"));
  CHECK_FALSE(r.has(Finding::one_input, "a"));
  CHECK(r.has(Finding::vjp_only, "b"));
}

TEST_CASE("diagnosis: a mask missing in the VJP (errors only where y does not depend on x)") {
  GradcheckCase c{"causal", {{"x", {4, 3}}}, [](Tape&, std::span<const Var> x) { return prefix_mean(x[0], true); }};
  GradcheckReport r = gradcheck(c);
  INFO(r.str());
  const Diagnosis* d = r.find(Finding::masked_positions, "x");
  REQUIRE(d);
  CHECK(d->message.find("does not depend on x") != std::string::npos);
  GradcheckCase right{
      "causal", {{"x", {4, 3}}}, [](Tape&, std::span<const Var> x) { return prefix_mean(x[0], false); }};
  CHECK(gradcheck(right).passed);
}

TEST_CASE("diagnosis: a mask boundary off by one (errors on the diagonal of a square input)") {
  GradcheckReport r = check_causal_softmax_mask_off_by_one();
  INFO(r.str());
  const Diagnosis* d = r.find(Finding::diagonal, "s");
  REQUIRE(d);
  CHECK(d->message.find("s[..., i, i]") != std::string::npos);
  CHECK(r.has(Finding::masked_positions, "s"));  // the VJP gives 0 where y does depend on s
  CHECK_FALSE(r.has(Finding::per_row_term));
}

TEST_CASE("diagnosis: an error on the Jacobian's diagonal (softmax without its p ⊙ ȳ term)") {
  GradcheckReport r = check_softmax(SoftmaxSlip::no_diagonal);
  INFO(r.str());
  const Diagnosis* d = r.find(Finding::diagonal, "x");
  REQUIRE(d);
  CHECK(d->message.find("Jacobian's diagonal") != std::string::npos);
  CHECK(check_softmax(SoftmaxSlip::none).passed);
}

TEST_CASE("diagnosis: an error confined to one row (the last row takes the first row's normalizer)") {
  GradcheckReport r = check_softmax(SoftmaxSlip::wrong_row);
  INFO(r.str());
  const Diagnosis* d = r.find(Finding::one_row, "x");
  REQUIRE(d);
  CHECK(d->message.find("x[2, :]") != std::string::npos);
}

TEST_CASE("diagnosis: a per-row term missing (softmax without −⟨p, ȳ⟩·p; β without −c²⟨x, ȳ⟩/r·x)") {
  GradcheckReport r = check_softmax(SoftmaxSlip::no_normalizer);
  INFO(r.str());
  const Diagnosis* d = r.find(Finding::per_row_term, "x");
  REQUIRE(d);
  CHECK(d->message.find("α_r·y_r·y_rᵀ with α = 1 in every row") != std::string::npos);
  CHECK(d->message.find("⟨y_r, ȳ_r⟩·y_r") != std::string::npos);

  GradcheckReport no_p = check_softmax(SoftmaxSlip::row_term_without_p);
  INFO(no_p.str());
  const Diagnosis* dp = no_p.find(Finding::per_row_term, "x");
  REQUIRE(dp);
  CHECK(dp->message.find("x̄_r is off by α_r·⟨y_r, ȳ_r⟩·(y_r − 1)") != std::string::npos);

  GradcheckReport beta = check_row_normalize_without_normalizer_term();
  INFO(beta.str());
  const Diagnosis* db = beta.find(Finding::per_row_term, "x");
  REQUIRE(db);
  CHECK(db->message.find("α_r·x_r·x_rᵀ") != std::string::npos);
}

TEST_CASE("diagnosis: a kink at the check point is named as such, not blamed on the derivative") {
  GradcheckReport r =
      gradcheck([](Tape&, std::span<const Var> x) { return relu(x[0]); }, {Tensor::zeros(DType::f64, {2, 3})}, {"x"});
  INFO(r.str());
  CHECK_FALSE(r.passed);
  const Diagnosis* d = r.find(Finding::kink, "x");
  REQUIRE(d);
  CHECK(d->message.find("Fill::away_from_zero") != std::string::npos);
  CHECK_FALSE(r.has(Finding::scale));
  CHECK_FALSE(r.has(Finding::diagonal));
  GradcheckCase away{
      "relu", {{"x", {2, 3}, Fill::away_from_zero}}, [](Tape&, std::span<const Var> x) { return relu(x[0]); }};
  CHECK(gradcheck(away).passed);
}

TEST_CASE("diagnosis: a tolerance tighter than finite differences resolve is named, not blamed on the rule") {
  GradcheckOptions strict;
  strict.atol = 1e-30;
  strict.rtol = 0;
  GradcheckReport r =
      gradcheck([](Tape&, std::span<const Var> x) { return exp(x[0]); }, {random_tensor({2, 3}, 6)}, {"x"}, strict);
  INFO(r.str());
  CHECK_FALSE(r.passed);
  CHECK(r.has(Finding::tolerance, "x"));
  CHECK_FALSE(r.has(Finding::consistent));
}

// ---- ops without a JVP, and claims ----

TEST_CASE("an op recorded with no_jvp gets a 'no JVP' note, not a failure") {
  GradcheckReport r = gradcheck([](Tape&, std::span<const Var> x) { return square_without_jvp(x[0]); },
                                {random_tensor({2, 3}, 3)}, {"x"});
  INFO(r.str());
  CHECK(r.passed);
  CHECK(r.has(Finding::no_jvp));
  for (const auto& c : r.checks) CHECK(c.skipped == (c.check == "jvp" || c.check == "adjoint"));
  CHECK(r.str().find("skipped (no JVP)") != std::string::npos);
  // Forward mode itself says which op has no JVP.
  std::vector<Tensor> xs{random_tensor({2}, 4)}, ts{random_tensor({2}, 5)};
  CHECK_THROWS_WITH_AS(jvp([](Tape&, std::span<const Var> x) { return exp(square_without_jvp(x[0])); }, xs, ts),
                       doctest::Contains("'square_without_jvp' has no JVP"), NoJvp);
}

TEST_CASE("a claim without claimed derivatives is its forward: it records one node and passes") {
  Claim c{"softmax_as_claim", softmax_of, {}, {}};
  GradcheckCase gc{"rows", {{"x", {3, 4}}}, claimed(c)};
  CHECK(recorded_ops(gc) == std::set<std::string>{"softmax_as_claim"});
  CHECK(gradcheck(gc).passed);
  CHECK(check_softmax(SoftmaxSlip::none).passed);
  CHECK_THROWS_AS(claimed({"", softmax_of, {}, {}}), Error);
  CHECK_THROWS_AS(claimed({"no forward", {}, {}, {}}), Error);
}

TEST_CASE(
    "β-attention post (docs/derivations.md §1.3): the homogeneity JVP dβ(x)·h = f(x,h)·β(x) — JVP only, right along x "
    "alone") {
  GradcheckReport r = check_homogeneity_claim();
  MESSAGE("β-attention post, claimed JVP of β:\n" << r.str());
  CHECK_FALSE(r.passed);
  CHECK(find_check(r, "jvp", "x"));
  CHECK_FALSE(find_check(r, "vjp", "x"));
  CHECK(r.has(Finding::jvp_only, "x"));
  CHECK(r.has(Finding::radial, "x"));
  CHECK_FALSE(r.has(Finding::nonlinear));  // the claim is linear in h: wrong, but a linear map
}

TEST_CASE(
    "attention-bias post (docs/derivations.md §5.3): the prose dS = dA ⊙ (dA − (dA·Aᵀ)1) — not linear in ȳ; the code's "
    "dS passes") {
  GradcheckReport prose = check_score_gradient_claim(ScoreGradientClaim::prose_ds);
  MESSAGE("attention-bias post, prose dS:\n" << prose.str());
  CHECK_FALSE(prose.passed);
  for (const char* x : {"q", "k", "bias"}) {
    CAPTURE(x);
    CHECK(prose.has(Finding::vjp_only, x));
    const Diagnosis* d = prose.find(Finding::nonlinear, x);
    REQUIRE(d);
    CHECK(d->message.find("degree 2") != std::string::npos);
  }
  CHECK_FALSE(find_check(prose, "vjp", "v"));  // dV = AᵀG does not involve dS

  GradcheckReport qk = check_score_gradient_claim(ScoreGradientClaim::prose_qk);
  MESSAGE("attention-bias post, prose dQ = dS·K and dK = dS·Q:\n" << qk.str());
  const Diagnosis* dq = qk.find(Finding::scale, "q");
  REQUIRE(dq);
  CHECK(dq->message.find("c = 2") != std::string::npos);  // 1/s with s = 1/√4
  CHECK(find_check(qk, "vjp", "k"));

  GradcheckReport corrected = check_score_gradient_claim(ScoreGradientClaim::corrected);
  CHECK(corrected.passed);
}

// ---- the gradcheck command over a registry of one's own ----

TEST_CASE("run_gradcheck and gradcheck_main over a registry of one's own ops") {
  Registry reg;
  reg.add({.name = "square_without_jvp", .family = "test", .vjp = "x̄ += 2x·ȳ", .jvp = "no forward-mode rule"});
  reg.add_case("square_without_jvp",
               {"rows", {{"x", {2, 3}}}, [](Tape&, std::span<const Var> x) { return square_without_jvp(x[0]); }});
  reg.add({.name = "planted_square", .family = "test", .vjp = "x̄ += −2x·ȳ (a sign slip)"});
  reg.add_case("planted_square", square_case({.vjp_factor = -2}));
  reg.add({.name = "beta_homogeneity_jvp", .family = "claims", .jvp = "the β-attention post: dβ(x)·h = f(x,h)·β(x)"});
  reg.add_case("beta_homogeneity_jvp", {"rows",
                                        {{"x", {4, 6}}},
                                        claimed({"beta_homogeneity_jvp",
                                                 [](Tape&, std::span<const Var> x) { return row_normalize(x[0]); },
                                                 {},
                                                 claimed_homogeneity_jvp()})});

  auto run = [&](std::vector<std::string> ops, bool json = false) {
    GradcheckRun args;
    args.ops = std::move(ops);
    args.json = json;
    std::FILE* f = std::tmpfile();
    REQUIRE(f);
    int code = run_gradcheck(reg, args, f);
    std::string out = read_all(f);
    std::fclose(f);
    return std::pair{code, out};
  };
  {
    auto [code, out] = run({"square_without_jvp"});
    INFO(out);
    CHECK(code == 0);
    CHECK(out.find("ok (no JVP)") != std::string::npos);
  }
  {
    auto [code, out] = run({"planted_square", "beta_homogeneity_jvp"});
    INFO(out);
    CHECK(code == 1);
    CHECK(out.find("[sign] x, vjp") != std::string::npos);
    CHECK(out.find("[radial] x, jvp") != std::string::npos);
    CHECK(out.find("2 ops, 2 cases: 0 passed, 2 failed") != std::string::npos);
  }
  {
    auto [code, out] = run({"square_without_jvp", "planted_square"}, true);
    CHECK(code == 1);
    auto rows = nlohmann::json::parse(out);
    CHECK(rows.size() == 2 + 4);  // the skipped jvp and adjoint rows are left out
    for (const auto& row : rows) {
      CHECK(row.size() == 7);
      for (const char* key : {"op", "case", "input", "check", "max_abs_err", "max_rel_err", "passed"})
        CHECK(row.contains(key));
    }
  }
  CHECK_THROWS_WITH(run({"nope"}), doctest::Contains("no op named 'nope'"));

  auto main_with = [&](std::vector<const char*> args) {
    args.insert(args.begin(), "my_ops");
    return gradcheck_main(reg, static_cast<int>(args.size()), args.data());
  };
  CHECK(main_with({"gradcheck", "--list"}) == 0);
  CHECK(main_with({"--op", "square_without_jvp"}) == 0);
  CHECK(main_with({"--op", "nope"}) == 2);
  CHECK(main_with({"--bogus"}) == 2);
  CHECK(main_with({"--atol", "-1"}) == 2);
  CHECK(main_with({"--eps", "abc"}) == 2);
  CHECK(main_with({"--op"}) == 2);
  CHECK(main_with({"--help"}) == 0);
  CHECK(main_with({"--precision", "f16"}) == 2);
  CHECK_THROWS_WITH(parse_check_precision("f16"), doctest::Contains("expected f64, f32 or bf16"));
  CHECK_FALSE(parse_check_precision("f64").has_value());
  CHECK(parse_check_precision("bf16") == ProductPrecision::bf16);
  // Both command lines print the one paragraph, written from the check's own constants.
  CHECK(precision_option_help().find(fmt::format("within {}x", kBoundMultiple)) != std::string::npos);
  CHECK(precision_option_help().find(fmt::format("{} seeds", kRoundingSeeds)) != std::string::npos);
}

TEST_CASE("gradcheck refuses float32 inputs") {
  Tensor x = Tensor::zeros(DType::f32, {2});
  std::vector<Tensor> xs{x};
  CHECK_THROWS_AS(gradcheck([](Tape&, std::span<const Var> v) { return exp(v[0]); }, xs), Error);
}

// ---- diagnoses at any size ----

TEST_CASE("a failure found by random projections is named on fewer rows, where the full Jacobian fits") {
  // (64, 8) softmax rows: 512 × 512 Jacobian entries, above the limit, so the check uses projections; the first 16
  // rows (128 × 128) are checked in full and name the dropped per-row term there.
  Function f = claimed({"softmax_claimed", softmax_of, softmax_vjp(SoftmaxSlip::no_normalizer), {}});
  GradcheckReport r = gradcheck(f, {random_tensor({64, 8}, 7)}, {"x"});
  CHECK_FALSE(r.passed);
  CHECK(find_check(r, "vjp")->mode == "fast");
  const Diagnosis* d = r.find(Finding::per_row_term, "x");
  REQUIRE_MESSAGE(d, r.str());
  CHECK_MESSAGE(d->message.find("on the first 16 of 64 rows (a full Jacobian there): ") == 0, r.str());
  CHECK_MESSAGE(quoted_in_doc("gradchecking.md", d->str()), d->str());
}

TEST_CASE("where no slice can be made, a failure found by projections says how to get a diagnosis") {
  // A sum to a scalar has no rows to cut; 50000 inputs are above the limit.
  Function f = claimed({"square_sum",
                        [](Tape&, std::span<const Var> x) { return sum(x[0] * x[0]); },
                        [](const ClaimPoint& at, const Tensor& g, std::span<Tensor> gin) {
                          for (int64_t k = 0; k < gin[0].numel(); ++k)  // 3x where 2x belongs... and a term more
                            data(gin[0])[k] += data(g)[0] * (3 * data(at.inputs[0])[k] + 1);
                        },
                        {}});
  GradcheckReport r = gradcheck(f, {random_tensor({50000}, 3)}, {"x"});
  CHECK_FALSE(r.passed);
  const Diagnosis* d = r.find(Finding::unexplained, "x");
  REQUIRE_MESSAGE(d, r.str());
  CHECK(d->message.find("raise full_jacobian_limit to 50000") != std::string::npos);
  CHECK_MESSAGE(quoted_in_doc("gradchecking.md", d->str()), d->str());
  CHECK(d->message.find("share no leading axis") != std::string::npos);
}

TEST_CASE("diagnosis: each row off by a factor of its own (a per-row normalizer), with the factor read") {
  // β(x) = x/(1 + r), r = ‖x_r‖ per row: x̄ = ȳ/(1 + r) − x⟨x, ȳ⟩/(r(1 + r)²). The slip leaves out the first
  // division by 1 + r everywhere: every row of x̄ is (1 + r) times too large.
  ClaimedVjp forgot_normalizer = [](const ClaimPoint& at, const Tensor& g, std::span<Tensor> gin) {
    const Tensor& x = at.inputs[0];
    const int64_t cols = x.shape().back(), rows = x.numel() / cols;
    for (int64_t q = 0; q < rows; ++q) {
      double rr = 0, xg = 0;
      for (int64_t c = 0; c < cols; ++c) {
        rr += data(x)[q * cols + c] * data(x)[q * cols + c];
        xg += data(x)[q * cols + c] * data(g)[q * cols + c];
      }
      const double r = std::sqrt(rr);
      for (int64_t c = 0; c < cols; ++c)
        data(gin[0])[q * cols + c] += data(g)[q * cols + c] - data(x)[q * cols + c] * xg / (r * (1 + r));
    }
  };
  Function f = claimed(
      {"beta_claimed", [](Tape&, std::span<const Var> x) { return row_normalize(x[0]); }, forgot_normalizer, {}});
  GradcheckReport r = gradcheck(f, {random_tensor({4, 5}, 11)}, {"x"});
  CHECK_FALSE(r.passed);
  const Diagnosis* d = r.find(Finding::per_row_factor, "x");
  REQUIRE_MESSAGE(d, r.str());
  CHECK_MESSAGE(d->message.find("c_r = (1 + ‖x_r‖) in every row") != std::string::npos, d->message);
  CHECK_MESSAGE(quoted_in_doc("gradchecking.md", d->str()), d->str());
  CHECK_FALSE(r.has(Finding::unexplained));
}

TEST_CASE("diagnosis: an element-wise op's derivative read along the diagonal, as a factor or a term of x") {
  // y = x³ with f′ claimed 3x³ (the exponent not lowered), then 3x² + 1 (a term too many).
  for (int slip : {0, 1}) {
    CAPTURE(slip);
    Function f = [slip](Tape&, std::span<const Var> x) {
      return pointwise(
          "cube", x[0], [](auto v) { return v * v * v; },
          [slip](auto v) { return slip == 0 ? 3 * v * v * v : 3 * v * v + 1; });
    };
    GradcheckReport r = gradcheck(f, {random_tensor({3, 4}, 5)}, {"x"});
    CHECK_FALSE(r.passed);
    const Diagnosis* d = r.find(Finding::elementwise, "x");
    REQUIRE_MESSAGE(d, r.str());
    CHECK_MESSAGE(
        d->message.find(slip == 0 ? "(analytic = numeric × x)" : "(analytic − numeric = 1)") != std::string::npos,
        d->message);
    CHECK_MESSAGE(quoted_in_doc("gradchecking.md", d->str()), d->str());
  }
}

TEST_CASE("diagnosis: a weight's gradient averaged over y's rows is one scale, its factor the count of rows") {
  // y = x·W, W̄ = xᵀȳ. The slip takes the mean over y's rows where the forward sums (W̄/N), or sums where it would
  // average (W̄·N). Random projections at all N = 256 rows read c = 1/256 (256) and the full Jacobian on the first s
  // rows c = 1/s (s): one line says both, and why.
  for (bool divided : {true, false}) {
    CAPTURE(divided);
    ClaimedVjp slipped = [divided](const ClaimPoint& at, const Tensor& g, std::span<Tensor> gin) {
      const Tensor &x = at.inputs[0], &w = at.inputs[1];
      const int64_t n = x.shape()[0], d = x.shape()[1], k = w.shape()[1];
      const double count = divided ? 1.0 / static_cast<double>(n) : static_cast<double>(n);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < d; ++j)
          for (int64_t c = 0; c < k; ++c) {
            data(gin[0])[i * d + j] += data(g)[i * k + c] * data(w)[j * k + c];
            data(gin[1])[j * k + c] += data(x)[i * d + j] * data(g)[i * k + c] * count;
          }
    };
    Function f = claimed({"xw_counted", [](Tape&, std::span<const Var> x) { return matmul(x[0], x[1]); }, slipped, {}});
    GradcheckReport r = gradcheck(f, {random_tensor({256, 16}, 3), random_tensor({16, 16}, 4)}, {"x", "w"});
    CHECK_FALSE(r.passed);
    int scales = 0;
    for (const Diagnosis& d : r.diagnoses) scales += d.kind == Finding::scale && d.input == "w";
    CHECK_MESSAGE(scales == 1, r.str());
    const Diagnosis* d = r.find(Finding::scale, "w");
    REQUIRE_MESSAGE(d, r.str());
    const std::string said = divided ? "c × (y's rows) = 1 at both: the rule divides by the count of y's rows"
                                     : "c ÷ (y's rows) = 1 at both: the rule multiplies by the count of y's rows";
    CHECK_MESSAGE(d->message.find(said) != std::string::npos, d->message);
    if (divided) CHECK_MESSAGE(quoted_in_doc("gradchecking.md", d->str()), d->str());
    CHECK_FALSE(r.has(Finding::unexplained));
  }
}
