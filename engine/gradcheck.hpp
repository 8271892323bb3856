// The gradchecker: in float64, for every differentiable input x_i of y = f(x),
//   vjp        J_iᵀu from backward   vs  central differences (f(x+εe_k) − f(x−εe_k)) / 2ε
//              full Jacobian when m·n_i is small; else random projections vᵀJ_iu as PyTorch's fast mode
//   jvp        J_i t from forward mode vs  (f(x+εt) − f(x−εt)) / 2ε, element by element of y
//   adjoint    ⟨J_i t, u⟩ = ⟨t, J_iᵀu⟩  (two analytic results; exact up to rounding)
//   accumulate backward adds J_iᵀu into a gradient that already holds r (it must not overwrite r)
// An element passes when |analytic − numeric| ≤ atol + rtol·|numeric|.
#pragma once

#include <string>
#include <vector>

#include "engine/registry.hpp"

namespace tapegrad {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
  int64_t full_jacobian_limit = 40000;  // m·n_i at most this: full Jacobian; above: projections
  int projections = 4;
  uint64_t seed = 20240809;
};

struct CheckResult {
  std::string input;  // the input's name
  std::string check;  // vjp, jvp, adjoint, accumulate
  std::string mode;   // full, fast (projections), exact
  double max_abs_err = 0;
  double max_rel_err = 0;
  std::string worst;  // where the worst element is: y[j] / x[k] index, or the projection
  double analytic = 0, numeric = 0;  // at the worst element
  bool passed = true;
};

struct GradcheckReport {
  std::string op, case_name;
  std::vector<CheckResult> checks;
  bool passed() const;
  std::string str() const;  // a readable table, one row per check
};

// Checks f at the given float64 inputs; names label the inputs in the report.
GradcheckReport gradcheck(const Function& f, std::span<const Tensor> inputs, std::span<const std::string> names,
                          const GradcheckOptions& opt = {});
// Checks a registered case, with its inputs drawn from opt.seed.
GradcheckReport gradcheck(const GradcheckCase& c, const GradcheckOptions& opt = {}, std::string_view op = "");

}  // namespace tapegrad
