#include "inspect/anomaly.hpp"

#include <cmath>
#include <string>
#include <vector>

namespace tapegrad {

namespace {

// Index of the first NaN or ±∞ of a float tensor, or −1.
int64_t first_non_finite(const Tensor& t) {
  if (!t.defined() || t.dtype() == DType::i32) return -1;
  return dispatch_float("anomaly detection", t.dtype(), [&]<class T>(T) -> int64_t {
    const T* p = t.data<T>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i)
      if (!std::isfinite(p[i])) return i;
    return -1;
  });
}

// "(i, j, k)": the multi-index of flat element `flat` of a row-major tensor of shape s.
std::string element_index(const Shape& s, int64_t flat) {
  std::vector<int64_t> idx(static_cast<size_t>(s.rank()));
  for (int d = s.rank() - 1; d >= 0; --d) {
    idx[static_cast<size_t>(d)] = s[d] == 0 ? 0 : flat % s[d];
    flat = s[d] == 0 ? 0 : flat / s[d];
  }
  return Shape(std::span<const int64_t>(idx)).str();
}

std::string shapes_of(const std::vector<Shape>& shapes) {
  std::string s;
  for (size_t i = 0; i < shapes.size(); ++i) s += (i ? ", " : "") + shapes[i].str();
  return s;
}

}  // namespace

void AnomalyCheck::on_leaf(const Tape&, const Tensor& value) {
  if (const int64_t bad = first_non_finite(value); bad >= 0)
    fail("non-finite value in a leaf (an input, constant or parameter): {} {} holds {} at {}", value.dtype(),
         value.shape(), value.item(bad), element_index(value.shape(), bad));
}

void AnomalyCheck::on_output(const Tape&, const char* op, std::span<const Var> inputs, const Tensor& out) {
  const int64_t bad = first_non_finite(out);
  if (bad < 0) return;
  std::vector<Shape> in;
  for (const Var& v : inputs) in.push_back(v.shape());
  fail("non-finite value from {}: its output {} {} holds {} at {} (inputs {})", op, out.dtype(), out.shape(),
       out.item(bad), element_index(out.shape(), bad), shapes_of(in));
}

void AnomalyCheck::on_backward_begin(const Tape&, const Tensor& seed) {
  if (const int64_t bad = first_non_finite(seed); bad >= 0)
    fail("backward: the seed gradient {} {} holds {} at {}", seed.dtype(), seed.shape(), seed.item(bad),
         element_index(seed.shape(), bad));
}

void AnomalyCheck::on_vjp_end(const Tape& tape, const Node& n, std::span<const Tensor> gin) {
  for (size_t i = 0; i < gin.size(); ++i) {
    const int64_t bad = first_non_finite(gin[i]);
    if (bad < 0) continue;
    fail(
        "non-finite value from {} (backward): after its VJP the gradient of its input {} {} {} holds {} at {} "
        "(output {})",
        n.op, i, gin[i].dtype(), gin[i].shape(), gin[i].item(bad), element_index(gin[i].shape(), bad),
        tape.value_at(n.out).shape());
  }
}

void AnomalyCheck::on_jvp_end(const Tape& tape, const Node& n, const Tensor& tout) {
  const int64_t bad = first_non_finite(tout);
  if (bad < 0) return;
  std::vector<Shape> in;
  for (uint32_t id : n.inputs) in.push_back(tape.value_at(id).shape());
  fail("non-finite value from {} (forward mode): the tangent of its output {} holds {} at {} (inputs {})", n.op,
       tout.shape(), tout.item(bad), element_index(tout.shape(), bad), shapes_of(in));
}

}  // namespace tapegrad
