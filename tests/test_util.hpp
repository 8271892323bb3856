// Helpers shared by the test programs: seeded tensors, elementwise distances between tensors, the message of a
// thrown tapegrad::Error, and a Function's value with its gradients and tangent.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/parallel.hpp"
#include "ops/registry.hpp"
#include "engine/rng.hpp"
#include "engine/tape.hpp"
#include "engine/tensor.hpp"
#include "test_paths.hpp"

namespace tapegrad::testing {

// ---- docs ----

// Whether docs/NAME quotes `line` as a line of its own, indented four spaces (a report's diagnosis as the docs show
// it): a quote the checker no longer prints fails the test that makes it.
inline bool quoted_in_doc(const std::string& name, const std::string& line) {
  std::ifstream in(std::string(TAPEGRAD_SOURCE_DIR) + "/docs/" + name);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str().find("\n    " + line + "\n") != std::string::npos;
}

// ---- tensors ----

inline Tensor tensor_of(Shape shape, const std::vector<double>& values, DType dtype) {
  return Tensor::from<double>(shape, std::span<const double>(values)).to(dtype);
}

// Entries offset + scale·N(0, 1) from Rng(seed), drawn in float64 and then converted to dtype.
inline Tensor random_tensor(Shape shape, DType dtype, uint64_t seed, double scale = 1.0, double offset = 0.0) {
  Rng rng(seed);
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (double& e : v) e = offset + scale * rng.normal();
  return tensor_of(shape, v, dtype);
}

// The same draw in float64.
inline Tensor random_tensor(Shape shape, uint64_t seed, double scale = 1.0) {
  return random_tensor(shape, DType::f64, seed, scale);
}

// One input of the given shape as make_inputs draws it (N(0, 1)) from `seed`.
inline Tensor draw_like(const Shape& shape, DType dtype, uint64_t seed) {
  std::vector<InputSpec> spec{{"x", shape}};
  return make_inputs(spec, dtype, seed)[0];
}

// ---- distances ----

// max_i |a_i − b_i|; the shapes must agree.
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.item(i) - b.item(i)));
  return m;
}

// max_i |a_i − b_i| / (1 + |b_i|). Two undefined tensors are 0 apart, a defined and an undefined one 1.
inline double max_relative_difference(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined() ? 0 : 1;
  const auto x = a.to_vector(), y = b.to_vector();
  REQUIRE(x.size() == y.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(x[i] - y[i]) / (1 + std::fabs(y[i])));
  return worst;
}

// max_i |a_i|
inline double max_abs(const Tensor& a) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.item(i)));
  return m;
}

inline bool all_finite(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(t.item(i))) return false;
  return true;
}

// ---- errors ----

// The message of the tapegrad::Error that f throws, or kNoError.
inline constexpr const char* kNoError = "<no error was thrown>";
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const tapegrad::Error& e) {
    return e.what();
  }
  return kNoError;
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Checks that an error message starts with `prefix` (the op's name) and contains every one of `parts`.
inline void check_message(const std::string& msg, std::string_view prefix, std::initializer_list<const char*> parts) {
  CAPTURE(msg);
  CHECK(msg.rfind(prefix, 0) == 0);
  for (const char* p : parts) CHECK(contains(msg, p));
}

// ---- derivatives ----

struct Derivatives {
  Tensor out;
  std::vector<Tensor> grads;  // one per input
  Tensor tangent;             // of the output, for the input tangents
};

// Forward, tape.backward with the seed, and forward mode with the tangents, on fresh tapes.
inline Derivatives derivatives(const Function& f, const std::vector<Tensor>& xs, const Tensor& seed,
                               const std::vector<Tensor>& tangents) {
  Derivatives d;
  {
    Tape tape;
    std::vector<Var> vars;
    for (const Tensor& x : xs) vars.push_back(tape.leaf(x));
    Var y = f(tape, vars);
    d.out = y.value().clone();
    tape.backward(y, seed);
    for (const Var& x : vars) d.grads.push_back(x.grad().clone());
  }
  d.tangent = jvp(f, xs, tangents).second;
  return d;
}

// Checks that two computations of the same map agree to `tol`: the output, the gradient of input i (named
// names[i]) and the tangent.
inline void check_same_derivatives(const Derivatives& a, const Derivatives& b, std::initializer_list<const char*> names,
                                   double tol) {
  CHECK(max_abs_diff(a.out, b.out) <= tol);
  for (size_t i = 0; i < a.grads.size(); ++i) {
    CAPTURE(names.begin()[i]);
    CHECK(max_abs_diff(a.grads[i], b.grads[i]) <= tol);
  }
  CHECK(max_abs_diff(a.tangent, b.tangent) <= tol);
}

// f in float32 against f in float64 at the inputs xs, each error relative to the largest float64 entry: the
// output's, and the largest over the gradients for the cotangent `seed`.
struct Float32Error {
  double forward, gradients;
};
inline Float32Error float32_error(const Function& f, const std::vector<Tensor>& xs, const Tensor& seed) {
  std::vector<Tensor> xs32;
  for (const Tensor& x : xs) xs32.push_back(x.to(DType::f32));
  Tensor o64 = evaluate(f, xs), o32 = evaluate(f, xs32);
  CHECK(o32.dtype() == DType::f32);
  const double forward_err = max_abs_diff(o32, o64) / max_abs(o64);
  const std::vector<Tensor> g64 = vjp(f, xs, seed), g32 = vjp(f, xs32, seed.to(DType::f32));
  double grad_err = 0;
  for (size_t i = 0; i < xs.size(); ++i) grad_err = std::max(grad_err, max_abs_diff(g32[i], g64[i]) / max_abs(g64[i]));
  return {forward_err, grad_err};
}

// A Function with the inputs it is evaluated at.
struct FunctionCase {
  std::string name;
  std::vector<InputSpec> inputs;
  Function f;
};

// Value, vjp and jvp (no tangent for inputs that are not differentiable) on `threads` of the engine's threads,
// with the inputs drawn from `seed`, the cotangent from seed + 1 and the tangents from seed + 2.
inline Derivatives derivatives_on_threads(const FunctionCase& c, int threads, uint64_t seed) {
  set_num_threads(threads);
  auto inputs = make_inputs(c.inputs, DType::f64, seed);
  Derivatives r;
  r.out = evaluate(c.f, inputs);
  Tensor cotangent = make_inputs(std::vector<InputSpec>{{"g", r.out.shape()}}, DType::f64, seed + 1)[0];
  r.grads = vjp(c.f, inputs, cotangent);
  auto tangents = make_inputs(c.inputs, DType::f64, seed + 2);
  for (size_t i = 0; i < tangents.size(); ++i)
    if (!c.inputs[i].differentiable()) tangents[i] = Tensor{};
  r.tangent = jvp(c.f, inputs, tangents).second;
  return r;
}

}  // namespace tapegrad::testing

// Checks that `expr` throws a tapegrad::Error whose message contains every one of the given strings.
#define CHECK_ERROR_HAS(expr, ...)                                                                      \
  do {                                                                                                  \
    std::string error_message_ = ::tapegrad::testing::error_of([&] { (void)(expr); });                  \
    INFO("message: ", error_message_);                                                                  \
    CHECK(error_message_ != ::tapegrad::testing::kNoError);                                             \
    for (std::string_view part_ : std::initializer_list<std::string_view>{__VA_ARGS__})                 \
      CHECK_MESSAGE(error_message_.find(part_) != std::string::npos, "expected: ", std::string(part_)); \
  } while (false)
