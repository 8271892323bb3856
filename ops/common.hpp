// Shared by the op files: shape and dtype checks (each throws an Error naming the op and the shapes), the
// multi-index of an element for messages, and the bias rows of linear maps.
#pragma once

#include <initializer_list>
#include <string>

#include "../engine/parallel.hpp"
#include "../engine/tape.hpp"

namespace tapegrad {

// The tape of the inputs, after checking that each is defined, recorded since the tape's last clear(), and on
// the same tape as the others; the message lists every input's shape (or why it has none).
inline Tape& tape_of(const char* op, std::initializer_list<Var> xs) {
  auto refuse = [&](const char* why) {
    std::string shapes;
    for (const Var& x : xs) {
      if (!shapes.empty()) shapes += ", ";
      shapes += !x.defined() ? std::string("undefined")
                : !x.live()  ? fmt::format("value #{} from before Tape::clear()", x.id())
                             : x.shape().str();
    }
    fail("{}: {} (inputs: {})", op, why, shapes);
  };
  for (const Var& x : xs)
    if (!x.defined()) refuse("an input is undefined (a default-constructed Var)");
  for (const Var& x : xs)
    if (!x.live()) refuse("an input is from a cleared tape; values do not survive Tape::clear()");
  Tape& t = xs.begin()->tape();
  for (const Var& x : xs)
    if (&x.tape() != &t) refuse("its inputs come from different tapes");
  return t;
}

inline void expect_float(const char* op, const Var& x) {
  (void)tape_of(op, {x});
  if (x.dtype() == DType::i32) fail("{}: expected a float32 or float64 tensor, got int32 {}", op, x.shape());
}

inline void expect_same_dtype(const char* op, const Var& a, const Var& b) {
  (void)tape_of(op, {a, b});
  if (a.dtype() != b.dtype())
    fail("{}: dtypes differ: {} {} and {} {} (mixing dtypes is an error, not a conversion)", op, a.dtype(), a.shape(),
         b.dtype(), b.shape());
}

// The elements of an optional tensor: nullptr when it is undefined (an absent bias, an input whose gradient or
// tangent is not requested), so the kernels test one pointer instead of the tensor.
template <class T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}
template <class T>
T* data_or_null(Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}
template <class T>
T* data_or_null(Tensor&& t) {  // a handle made for the call (a slot picked from gin): writable
  return t.defined() ? t.data<T>() : nullptr;
}
// p + offset, or nullptr where p is: one slice of an optional buffer.
template <class T>
T* offset_or_null(T* p, int64_t offset) {
  return p ? p + offset : nullptr;
}

inline void expect_min_rank(const char* op, const Var& x, int rank, const char* what) {
  (void)tape_of(op, {x});
  if (x.rank() < rank) fail("{}: {} must have rank ≥ {}, got shape {}", op, what, rank, x.shape());
}

// "[i, j, k]": the multi-index of flat element `flat` in a row-major tensor of shape s (for error messages).
inline std::string multi_index(const Shape& s, int64_t flat) {
  std::string out = "]";
  for (int d = s.rank() - 1; d >= 0; --d) {
    out.insert(0, (d > 0 ? ", " : "") + std::to_string(flat % s[d]));
    flat /= s[d];
  }
  return "[" + out;
}

// A bias b (m) on every row of out (n, m), and its adjoint:  out += 1_n·bᵀ;   db += Σ_i g[i, :] = gᵀ1_n.
template <class T>
void add_rows(T* out, const T* b, int64_t n, int64_t m) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) out[i * m + j] += b[j];
}
template <class T>
void sum_rows(T* db, const T* g, int64_t n, int64_t m) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) db[j] += g[i * m + j];
}

// A residual joining an op's output (linear, mlp): where given, it has the output's shape.
inline void expect_residual_shape(const char* op, const Var& residual, const Shape& out, const Var& x) {
  if (residual.defined() && !(residual.shape() == out))
    fail("{}: the residual must have the output's shape {} (x {}), got {}", op, out, x.shape(), residual.shape());
}

// Fresh gradient buffers (engine/tape.hpp, Tape::vjp_writes_fresh), in the VJP of a node marked for them: the β of
// a product that gives input i its gradient, 0 where the buffer is fresh (the product writes it) and 1 where it
// adds; and, for a path that can only add, the buffer zeroed first where it is fresh.
template <class T>
T beta_for(const Tape& tape, size_t input) {
  return tape.fresh_gradient(input) ? T(0) : T(1);
}
inline void zero_if_fresh(const Tape& tape, size_t input, Tensor g) {
  if (g.defined() && tape.fresh_gradient(input)) g.fill_zero();
}

// out[i] (+)= x[i] for i < n, ranges of 16k elements on the engine's threads: with `add` false, a copy (a fresh
// gradient's first contribution).
template <class T>
void add_or_copy_elements(T* out, const T* x, int64_t n, bool add) {
  parallel_for(n, 16384, [=](int64_t begin, int64_t end) {
    if (add)
      for (int64_t i = begin; i < end; ++i) out[i] += x[i];
    else std::copy(x + begin, x + end, out + begin);
  });
}

// out[i] += x[i] for i < n: a residual joining a layer's output, and its gradient (element-wise: the same bits on any
// thread count).
template <class T>
void add_elements(T* out, const T* x, int64_t n) {
  add_or_copy_elements(out, x, n, true);
}

}  // namespace tapegrad
