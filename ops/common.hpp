// Shape and dtype checks shared by the op files: each throws an Error naming the op and the shapes.
#pragma once

#include "engine/tape.hpp"

namespace tapegrad {

inline void expect_float(const char* op, const Var& x) {
  if (x.dtype() == DType::i32) fail("{}: expected a float32 or float64 tensor, got int32 {}", op, x.shape());
}

inline void expect_same_dtype(const char* op, const Var& a, const Var& b) {
  if (a.dtype() != b.dtype())
    fail("{}: dtypes differ: {} {} and {} {} (mixing dtypes is an error, not a conversion)", op, a.dtype(),
         a.shape(), b.dtype(), b.shape());
}

inline void expect_min_rank(const char* op, const Var& x, int rank, const char* what) {
  if (x.rank() < rank) fail("{}: {} must have rank ≥ {}, got shape {}", op, what, rank, x.shape());
}

// The tape of the first input, after checking that every input lives on it.
inline Tape& tape_of(const char* op, std::initializer_list<Var> xs) {
  Tape& t = xs.begin()->tape();
  for (const Var& x : xs)
    if (&x.tape() != &t) fail("{}: its inputs come from different tapes", op);
  return t;
}

}  // namespace tapegrad
