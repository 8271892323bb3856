// An additive bias on the attention scores S (B, h, T, Tk), shared by the attention nodes.
//
// The bias broadcasts to (B, h, T, Tk) as in NumPy: its shape is aligned from the right, a missing leading axis
// or a size-1 axis repeats. The layouts in use: (B,h,T,Tk) full, (h,T,Tk) shared over the batch, (T,Tk) shared
// over batch and heads, (B,1,T,Tk) shared over heads, (B,1,1,Tk) a key-padding bias.
//
// With S = s·QKᵀ + bias (bias broadcast by the map E: bias ↦ its (B,h,T,Tk) broadcast), the derivatives are
//   forward  S[b,h,i,j]  += bias[off(b,h,i,j)]
//   JVP      Ṡ[b,h,i,j]  += ḃias[off(b,h,i,j)]                     (E is linear)
//   VJP      d bias[o]   += Σ_{(b,h,i,j): off(b,h,i,j) = o} dS[b,h,i,j]   (Eᵀ: a sum over exactly the broadcast axes)
// where off() is a dot product with strides that are 0 on broadcast axes (docs/derivations.md §5.4: sum over the
// missing leading axes, then over the size-1 axes keeping dims). The VJP adds, so a bias shared by several nodes
// accumulates. Broadcast axes make several (b, h) slices add into one dB element: callers that split the (b, h) loop
// across threads must not run two slices that share dB elements at once.
#pragma once

#include <cstdint>

#include "../engine/tensor.hpp"

namespace tapegrad {

// Element strides of a bias along (b, head, i, j); 0 where that axis is broadcast.
struct BiasLayout {
  int64_t stride_b = 0, stride_h = 0, stride_i = 0, stride_j = 0;

  int64_t offset(int64_t b, int64_t head, int64_t i, int64_t j) const {
    return b * stride_b + head * stride_h + i * stride_i + j * stride_j;
  }
  // The offset of bias element (b, head, i, 0): the start of that score row's bias.
  int64_t row_offset(int64_t b, int64_t head, int64_t i) const {
    return b * stride_b + head * stride_h + i * stride_i;
  }
};

// Checks that `bias` broadcasts to the scores (B, h, T, Tk) and returns its strides. Throws naming `op`.
inline BiasLayout bias_layout(const char* op, const Shape& bias, int64_t B, int64_t h, int64_t T, int64_t Tk) {
  const Shape scores{B, h, T, Tk};
  if (bias.rank() > 4)
    fail("{}: bias {} must broadcast to the scores {} (B, h, T, Tk); it has rank {} > 4", op, bias, scores,
         bias.rank());
  int64_t strides[4] = {0, 0, 0, 0};
  int64_t stride = 1;
  for (int axis = 3; axis >= 0; --axis) {
    const int bias_axis = axis - (4 - bias.rank());
    if (bias_axis < 0) break;  // a missing leading axis: stride 0
    const int64_t n = bias[bias_axis];
    if (n != scores[axis] && n != 1)
      fail("{}: bias {} does not broadcast to the scores {} (B, h, T, Tk): axis {} has size {}, expected {} or 1; "
           "allowed are e.g. (B,h,T,Tk), (h,T,Tk), (T,Tk), (B,1,T,Tk), (B,1,1,Tk)",
           op, bias, scores, bias_axis, n, scores[axis]);
    strides[axis] = n == 1 ? 0 : stride;
    stride *= n;
  }
  return {strides[0], strides[1], strides[2], strides[3]};
}

// S[i0 + r, j0 + c] += bias[off(b, head, i0 + r, j0 + c)] for a block of `rows` × `cols` scores, row stride ld.
// The forward adds bias, the JVP adds its tangent.
template <class T>
void add_bias_block(const BiasLayout& L, T* s, int64_t ld, const T* bias, int64_t b, int64_t head, int64_t i0,
                    int64_t rows, int64_t j0, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* br = bias + L.row_offset(b, head, i0 + r) + j0 * L.stride_j;
    T* sr = s + r * ld;
    if (L.stride_j == 1)
      for (int64_t c = 0; c < cols; ++c) sr[c] += br[c];
    else
      for (int64_t c = 0; c < cols; ++c) sr[c] += br[0];
  }
}

// dB[off(b, head, i0 + r, j0 + c)] += dS[r, c] for a block of `rows` × `cols` score gradients, row stride ld:
// the adjoint of add_bias_block, summing over the broadcast axes.
template <class T>
void accumulate_bias_grad_block(const BiasLayout& L, T* dbias, const T* ds, int64_t ld, int64_t b, int64_t head,
                                int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    T* dr = dbias + L.row_offset(b, head, i0 + r) + j0 * L.stride_j;
    const T* gr = ds + r * ld;
    if (L.stride_j == 1) {
      for (int64_t c = 0; c < cols; ++c) dr[c] += gr[c];
    } else {
      T sum = 0;
      for (int64_t c = 0; c < cols; ++c) sum += gr[c];
      dr[0] += sum;
    }
  }
}

}  // namespace tapegrad
