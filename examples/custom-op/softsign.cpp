// softsign y = x/(1 + |x|) element-wise, an op with a VJP and no forward-mode rule:
//   f′(x) = 1/(1 + |x|)²          VJP  x̄ += ȳ/(1 + |x|)²                       x, y: any shape
// It records no_jvp(name) as its JVP: forward mode through it throws NoJvp, and the gradchecker reports "no JVP"
// (jvp and adjoint skipped) instead of failing.
#include <cmath>

#include "my_ops.hpp"
#include "ops/common.hpp"

using namespace tapegrad;

namespace {

// y = x/(1 + |x|)                                                                   y, x: (n)
template <class T>
void softsign_forward(T* y, const T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1 + std::abs(x[i]));
}

// x̄ += ȳ/(1 + |x|)²                                                                  dx, x, dy: (n)
template <class T>
void softsign_vjp(T* dx, const T* x, const T* dy, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T d = 1 + std::abs(x[i]);
    dx[i] += dy[i] / (d * d);
  }
}

}  // namespace

Var softsign(Var x) {
  static constexpr const char* op = "softsign";
  expect_float(op, x);
  Tape& tape = x.tape();
  const Tensor xv = x.value();
  const int64_t n = xv.numel();
  Tensor y = tape.empty(x.dtype(), x.shape());
  dispatch_float(op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    softsign_forward(y.data<T>(), xv.data<T>(), n);
  });
  return tape.record(
      op, {x}, y,
      [=](const Tensor& g, std::span<const Tensor> gin) {
        dispatch_float(op, g.dtype(), [&](auto tag) {
          using T = decltype(tag);
          softsign_vjp(gin[0].data<T>(), xv.data<T>(), g.data<T>(), n);
        });
      },
      no_jvp(op));
}

void register_softsign(Registry& r) {
  r.add({"softsign", "my_ops", "x̄ += ȳ/(1 + |x|)²; no JVP", {}});
  r.add_case("softsign", {"matrix", {{"x", {3, 4}}}, [](Tape&, std::span<const Var> x) { return softsign(x[0]); }});
}
