// row_normalize β(x) = x/(1 + ‖x‖): values against a naive reference, the x = 0 branch, float32 against float64,
// errors; and the gradchecker rejecting the β-attention post's claimed JVP dβ(x)·h = f(x,h)·β(x) where ours passes.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "checker/gradcheck.hpp"
#include "ops/ops.hpp"
#include "ops/row_maps.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

Var row_normalize_of(Tape&, std::span<const Var> x) { return row_normalize(x[0]); }

const CheckResult* find_check(const GradcheckReport& r, std::string_view input, std::string_view check) {
  for (const auto& c : r.checks)
    if (c.input == input && c.check == check) return &c;
  return nullptr;
}

// The β-attention post's claimed JVP, f(x,h)·β(x) with f = ⟨x,h⟩/(r²(1 + r)), per row (x ≠ 0).     ty, x, tx: (rows, cols)
void claimed_homogeneity_jvp(double* ty, const double* x, const double* tx, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    const double* xi = x + i * cols;
    const double* hi = tx + i * cols;
    double rr = 0, xh = 0;
    for (int64_t j = 0; j < cols; ++j) {
      rr += xi[j] * xi[j];
      xh += xi[j] * hi[j];
    }
    const double r = std::sqrt(rr);
    const double f = xh / (rr * (1 + r));
    for (int64_t j = 0; j < cols; ++j) ty[i * cols + j] += f * xi[j] / (1 + r);
  }
}

// β with our forward and VJP but the post's claimed JVP (docs/derivations.md §1.3) (float64 only).
Var row_normalize_with_claimed_jvp(Var x) {
  Tape& tape = x.tape();
  const Tensor xv = x.value();
  const int64_t cols = x.shape().back(), rows = x.shape().numel() / cols;
  Tensor y = tape.empty(DType::f64, x.shape());
  Tensor r = tape.empty(DType::f64, Shape{rows});
  for (int64_t i = 0; i < rows; ++i)
    r.data<double>()[i] = beta_row(y.data<double>() + i * cols, xv.data<double>() + i * cols, cols, cols);
  return tape.record(
      "row_normalize_claimed_jvp", {x}, y,
      [=](const Tensor& g, std::span<Tensor> gin) {
        for (int64_t i = 0; i < rows; ++i)
          beta_row_derivative<Into::add>(gin[0].data<double>() + i * cols, g.data<double>() + i * cols,
                                         y.data<double>() + i * cols, r.data<double>()[i], cols, cols);
      },
      [=](std::span<const Tensor> tin, Tensor& ty) {
        claimed_homogeneity_jvp(ty.data<double>(), xv.data<double>(), tin[0].data<double>(), rows, cols);
      });
}

}  // namespace

TEST_CASE("row_normalize matches x/(1 + ‖x‖) row by row in float32 and float64") {
  Tensor x64 = random_tensor({2, 3, 5}, DType::f64, 21, 2.0);
  for (DType dtype : {DType::f64, DType::f32}) {
    CAPTURE(dtype_name(dtype));
    std::vector<Tensor> xs{x64.to(dtype)};
    Tensor y = evaluate(row_normalize_of, xs);
    CHECK(y.dtype() == dtype);
    CHECK(y.shape() == x64.shape());
    const double tol = dtype == DType::f64 ? 1e-15 : 1e-6;
    for (int64_t i = 0; i < 6; ++i) {
      double rr = 0;
      for (int64_t j = 0; j < 5; ++j) rr += x64.item(i * 5 + j) * x64.item(i * 5 + j);
      const double r = std::sqrt(rr);
      double yy = 0;
      for (int64_t j = 0; j < 5; ++j) {
        CHECK(std::abs(y.item(i * 5 + j) - x64.item(i * 5 + j) / (1 + r)) <= tol);
        yy += y.item(i * 5 + j) * y.item(i * 5 + j);
      }
      CHECK(std::sqrt(yy) == doctest::Approx(r / (1 + r)).epsilon(tol * 10));  // ‖β(x)‖ = r/(1 + r) < 1
    }
  }
}

TEST_CASE("at x = 0, β is 0 and both derivatives are the identity") {
  for (DType dtype : {DType::f64, DType::f32}) {
    std::vector<Tensor> xs{Tensor::zeros(dtype, {2, 4})};
    Tensor h = tensor_of({2, 4}, {1, -2, 3, 0.5, 0, 0, 0.25, -1}, dtype);
    std::vector<Tensor> ts{h};
    auto [y, ty] = jvp(row_normalize_of, xs, ts);
    CHECK(max_abs_diff(y, Tensor::zeros(dtype, {2, 4})) == 0);
    CHECK(max_abs_diff(ty, h) == 0);
    CHECK(max_abs_diff(vjp(row_normalize_of, xs, h)[0], h) == 0);
  }
}

TEST_CASE("float32 agrees with float64, for small and for large rows") {
  for (double scale : {0.01, 1.0, 1e3}) {
    CAPTURE(scale);
    Tensor x = random_tensor({4, 16}, DType::f64, 31, scale);
    Tensor u = random_tensor({4, 16}, DType::f64, 32);
    Tensor t = random_tensor({4, 16}, DType::f64, 33);
    std::vector<Tensor> x64{x}, x32{x.to(DType::f32)};
    std::vector<Tensor> t64{t}, t32{t.to(DType::f32)};
    CHECK(max_abs_diff(evaluate(row_normalize_of, x64), evaluate(row_normalize_of, x32)) < 1e-6);
    // Derivatives scale like 1/(1 + r): compare relative to that.
    Tensor g64 = vjp(row_normalize_of, x64, u)[0], g32 = vjp(row_normalize_of, x32, u.to(DType::f32))[0];
    Tensor j64 = jvp(row_normalize_of, x64, t64).second, j32 = jvp(row_normalize_of, x32, t32).second;
    double size = 0;
    for (int64_t i = 0; i < g64.numel(); ++i) size = std::max(size, std::abs(g64.item(i)));
    CHECK(max_abs_diff(g64, g32) < 1e-5 * size);
    CHECK(max_abs_diff(j64, j32) < 1e-5 * size);
  }
}

TEST_CASE("the β-attention post's claimed JVP f(x,h)·β(x) holds for h ∥ x and fails for h ⟂ x") {
  const std::vector<double> x{3, 0, 4};  // r = 5
  std::vector<double> beta(3), ours(3, 0.0), claimed(3, 0.0);
  const double r = beta_row(beta.data(), x.data(), 3, 3);
  auto row_normalize_jvp = [&](double* out, const double* tangent) {
    beta_row_derivative<Into::add>(out, tangent, beta.data(), r, 3, 3);
  };
  // h ∥ x: both give (1/(1 + r)²)·h.
  const std::vector<double> h_par{0.6, 0, 0.8};
  row_normalize_jvp(ours.data(), h_par.data());
  claimed_homogeneity_jvp(claimed.data(), x.data(), h_par.data(), 1, 3);
  for (size_t j = 0; j < 3; ++j) {
    CHECK(ours[j] == doctest::Approx(h_par[j] / 36));
    CHECK(claimed[j] == doctest::Approx(ours[j]));
  }
  // h ⟂ x: the true derivative is h/(1 + r); the claimed form gives 0.
  const std::vector<double> h_perp{0, 1, 0};
  ours.assign(3, 0.0);
  claimed.assign(3, 0.0);
  row_normalize_jvp(ours.data(), h_perp.data());
  claimed_homogeneity_jvp(claimed.data(), x.data(), h_perp.data(), 1, 3);
  CHECK(ours[1] == doctest::Approx(1.0 / 6));
  CHECK(claimed[1] == 0);
}

TEST_CASE("the gradchecker rejects the β-attention post's claimed JVP and passes ours") {
  Tensor x = random_tensor({4, 6}, DType::f64, 41);
  std::vector<Tensor> xs{x};
  const std::vector<std::string> names{"x"};

  GradcheckReport claim =
      gradcheck([](Tape&, std::span<const Var> v) { return row_normalize_with_claimed_jvp(v[0]); }, xs, names);
  INFO(claim.str());
  const CheckResult* claim_jvp = find_check(claim, "x", "jvp");
  REQUIRE(claim_jvp);
  CHECK_FALSE(claim.passed());
  CHECK_FALSE(claim_jvp->passed);
  CHECK(claim_jvp->max_rel_err > 0.5);
  CHECK(find_check(claim, "x", "vjp")->passed);  // the same node's VJP is right: the failure is the JVP's alone
  CHECK_FALSE(find_check(claim, "x", "adjoint")->passed);
  MESSAGE("the β-attention post's claimed JVP: max abs error " << claim_jvp->max_abs_err << ", max rel error "
                                                               << claim_jvp->max_rel_err);

  GradcheckReport ours = gradcheck(row_normalize_of, xs, names);
  INFO(ours.str());
  CHECK(ours.passed());
  const CheckResult* our_jvp = find_check(ours, "x", "jvp");
  REQUIRE(our_jvp);
  CHECK(our_jvp->max_rel_err < 1e-6);
  MESSAGE("row_normalize JVP: max abs error " << our_jvp->max_abs_err << ", max rel error " << our_jvp->max_rel_err);
}

TEST_CASE("row_normalize errors name the op and the shapes") {
  Tape tape;
  Var ids = tape.constant(Tensor::zeros(DType::i32, {3, 4}));
  std::string msg = error_of([&] { row_normalize(ids); });
  CHECK(msg.find("row_normalize") != std::string::npos);
  CHECK(msg.find("int32") != std::string::npos);
  CHECK(msg.find("(3, 4)") != std::string::npos);
  Var scalar = tape.leaf(Tensor::zeros(DType::f32, {}));
  msg = error_of([&] { row_normalize(scalar); });
  CHECK(msg.find("row_normalize") != std::string::npos);
  CHECK(msg.find("rank") != std::string::npos);
  CHECK(msg.find("()") != std::string::npos);
}
