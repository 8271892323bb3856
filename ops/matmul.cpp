// Batched matrix product with NumPy batch broadcasting: a (…a, m, k) @ b (…b, k, n) → y (…, m, n), where … is
// the broadcast of …a and …b (aligned from the right, size-1 or missing axes repeat). For each batch index β,
// with α(β) and γ(β) the matrices of a and b it reads:
//   y_β = a_α · b_γ                                                             (m, n)
// The adjoint follows from ⟨ȧ·b, ȳ⟩_F = tr(bᵀȧᵀȳ) = ⟨ȧ, ȳ·bᵀ⟩_F — cyclic invariance of the trace, the step the
// attention-gradient post marks in its d_Q and d_K derivations — and likewise ⟨a·ḃ, ȳ⟩_F = ⟨ḃ, aᵀ·ȳ⟩_F (its step
// for d_V):
//   VJP  ā_α += Σ_{β: α(β) = α} ȳ_β · b_γᵀ                                    (m, k)
//        b̄_γ += Σ_{β: γ(β) = γ} a_αᵀ · ȳ_β                                    (k, n)
//   JVP  ẏ_β  = ȧ_α · b_γ + a_α · ḃ_γ                                         (product rule)
// Every product is one call of gemm() (ops/products/blas.hpp), which runs a float64 product on OpenBLAS and a float32 one
// on OpenBLAS or oneDNN, in f32 or bf16, by the rule of ops/products/products.hpp. The sums over broadcast batch axes
// come from gemm accumulating (β = 1) into the same ā_α or b̄_γ once per β that reads it; nothing is ever
// overwritten.
//
// Fast path: when b holds a single matrix (b 2-D, or all of …b is 1), the matrices of a are consecutive rows of
// one (Π…a·m, k) matrix A and y is the (Π…a·m, n) matrix A·b: the forward, ā += ȳ·bᵀ, b̄ += Aᵀ·ȳ and both JVP
// terms are one gemm each over all batches.
#include <algorithm>
#include <array>
#include <climits>

#include "ops/products/blas.hpp"
#include "ops/sheet.hpp"
#include "ops/common.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

// The batch walk: output batch sizes and, per batch axis, the matrix stride of a and b (0 where broadcast).
struct MatmulGeometry {
  int64_t m = 0, k = 0, n = 0;
  int batch_rank = 0;
  std::array<int64_t, Shape::kMaxRank> batch{}, a_stride{}, b_stride{};
  int64_t batches = 1;    // Π of the output batch sizes
  bool single_b = false;  // b holds one matrix: the fast path
  bool empty() const { return m == 0 || n == 0 || k == 0 || batches == 0; }
};

MatmulGeometry matmul_geometry(const Shape& a, const Shape& b, Shape& out) {
  if (a.rank() < 2 || b.rank() < 2)
    fail("matmul: both inputs need rank ≥ 2 (…, m, k) @ (…, k, n), got a {} and b {}", a, b);
  MatmulGeometry g;
  g.m = a[a.rank() - 2];
  g.k = a[a.rank() - 1];
  g.n = b[b.rank() - 1];
  if (b[b.rank() - 2] != g.k)
    fail("matmul: inner dimensions differ: a {} has k = {} but b {} has k = {}", a, g.k, b, b[b.rank() - 2]);
  const int ra = a.rank() - 2, rb = b.rank() - 2;
  const int r = std::max(ra, rb);
  g.batch_rank = r;
  int64_t sa = 1, sb = 1, b_count = 1;
  for (int d = r - 1; d >= 0; --d) {  // from the innermost batch axis out
    const int da = d - (r - ra), db = d - (r - rb);
    const int64_t na = da >= 0 ? a[da] : 1, nb = db >= 0 ? b[db] : 1;
    if (na != nb && na != 1 && nb != 1)
      fail("matmul: batch dimensions of a {} and b {} do not broadcast (batch axis {}: {} vs {})", a, b, d, na, nb);
    const auto du = static_cast<size_t>(d);
    g.batch[du] = (na == 0 || nb == 0) ? 0 : std::max(na, nb);
    g.a_stride[du] = na == 1 ? 0 : sa;
    g.b_stride[du] = nb == 1 ? 0 : sb;
    sa *= na;
    sb *= nb;
    b_count *= nb;
  }
  for (int d = 0; d < r; ++d) {
    out.push_back(g.batch[static_cast<size_t>(d)]);
    g.batches *= g.batch[static_cast<size_t>(d)];
  }
  out.push_back(g.m);
  out.push_back(g.n);
  g.single_b = b_count == 1;
  for (int64_t dim : {g.m, g.k, g.n, g.single_b ? g.batches * g.m : int64_t{0}})
    if (dim > INT_MAX) fail("matmul: a {} @ b {} has a dimension of {}, above cblas' limit {}", a, b, dim, INT_MAX);
  return g;
}

// Calls f(y_index, a_index, b_index) for every output batch, in order (indices count matrices).
template <class F>
void for_each_batch(const MatmulGeometry& g, F&& f) {
  std::array<int64_t, Shape::kMaxRank> idx{};
  int64_t ia = 0, ib = 0;
  for (int64_t q = 0; q < g.batches; ++q) {
    f(q, ia, ib);
    for (int d = g.batch_rank - 1; d >= 0; --d) {
      const auto du = static_cast<size_t>(d);
      ia += g.a_stride[du];
      ib += g.b_stride[du];
      if (++idx[du] < g.batch[du]) break;
      ia -= g.a_stride[du] * g.batch[du];
      ib -= g.b_stride[du] * g.batch[du];
      idx[du] = 0;
    }
  }
}

// y_β = a_α · b_γ        a: (matrices of a, m, k), b: (matrices of b, k, n), y: (g.batches, m, n)
// Fast path: Y (Π…a·m, n) = A (Π…a·m, k) · b (k, n).
template <class T>
void matmul_forward(const MatmulGeometry& g, const T* a, const T* b, T* y) {
  const int64_t m = g.m, k = g.k, n = g.n;
  if (g.single_b) return gemm(g.batches * m, n, k, T(1), as_is(a, k), as_is(b, n), T(0), y, n);
  for_each_batch(g, [&](int64_t q, int64_t ia, int64_t ib) {
    gemm(m, n, k, T(1), as_is(a + ia * m * k, k), as_is(b + ib * k * n, n), T(0), y + q * m * n, n);
  });
}

// ā_α += ȳ_β · b_γᵀ,  b̄_γ += a_αᵀ · ȳ_β      ga like a, gb like b, gy like y; ga or gb null when that input
// needs no gradient.
// Fast path: Ā += Ȳ·bᵀ (Π…a·m, k) and b̄ += Aᵀ·Ȳ (k, n), the sum over batches being the gemm's inner sum.
template <class T>
void matmul_vjp(const MatmulGeometry& g, const T* a, const T* b, const T* gy, T* ga, T* gb) {
  const int64_t m = g.m, k = g.k, n = g.n;
  if (g.single_b) {
    const int64_t rows = g.batches * m;
    if (ga) gemm(rows, k, n, T(1), as_is(gy, n), transposed(b, n), T(1), ga, k);
    if (gb) gemm(k, n, rows, T(1), transposed(a, k), as_is(gy, n), T(1), gb, n);
    return;
  }
  for_each_batch(g, [&](int64_t q, int64_t ia, int64_t ib) {
    const T* gq = gy + q * m * n;
    if (ga) gemm(m, k, n, T(1), as_is(gq, n), transposed(b + ib * k * n, n), T(1), ga + ia * m * k, k);
    if (gb) gemm(k, n, m, T(1), transposed(a + ia * m * k, k), as_is(gq, n), T(1), gb + ib * k * n, n);
  });
}

// ẏ_β += ȧ_α · b_γ + a_α · ḃ_γ                ta like a, tb like b, ty like y; ta or tb null when that input
// has no tangent.
template <class T>
void matmul_jvp(const MatmulGeometry& g, const T* a, const T* b, const T* ta, const T* tb, T* ty) {
  const int64_t m = g.m, k = g.k, n = g.n;
  if (g.single_b) {
    const int64_t rows = g.batches * m;
    if (ta) gemm(rows, n, k, T(1), as_is(ta, k), as_is(b, n), T(1), ty, n);
    if (tb) gemm(rows, n, k, T(1), as_is(a, k), as_is(tb, n), T(1), ty, n);
    return;
  }
  for_each_batch(g, [&](int64_t q, int64_t ia, int64_t ib) {
    T* tq = ty + q * m * n;
    if (ta) gemm(m, n, k, T(1), as_is(ta + ia * m * k, k), as_is(b + ib * k * n, n), T(1), tq, n);
    if (tb) gemm(m, n, k, T(1), as_is(a + ia * m * k, k), as_is(tb + ib * k * n, n), T(1), tq, n);
  });
}

}  // namespace

Var matmul(Var a, Var b) {
  Tape& tape = tape_of("matmul", {a, b});
  expect_float("matmul", a);
  expect_float("matmul", b);
  expect_same_dtype("matmul", a, b);
  Shape out;
  const MatmulGeometry g = matmul_geometry(a.shape(), b.shape(), out);
  const Tensor av = a.value(), bv = b.value();
  // An empty product (k = 0) is the zero matrix; other empty shapes have no elements to compute.
  Tensor y = g.empty() ? tape.zeros(a.dtype(), out) : tape.empty(a.dtype(), out);
  if (!g.empty())
    dispatch_float("matmul", a.dtype(),
                   [&]<class T>(T) { matmul_forward(g, av.data<T>(), bv.data<T>(), y.data<T>()); });
  return tape.record(
      "matmul", {a, b}, y,
      [=](const Tensor& gy, std::span<Tensor> gin) {
        if (g.empty()) return;
        dispatch_float("matmul", gy.dtype(), [&]<class T>(T) {
          matmul_vjp(g, av.data<T>(), bv.data<T>(), gy.data<T>(), gin[0].defined() ? gin[0].data<T>() : nullptr,
                     gin[1].defined() ? gin[1].data<T>() : nullptr);
        });
      },
      [=](std::span<const Tensor> tin, Tensor& ty) {
        if (g.empty()) return;
        dispatch_float("matmul", ty.dtype(), [&]<class T>(T) {
          matmul_jvp(g, av.data<T>(), bv.data<T>(), tin[0].defined() ? tin[0].data<T>() : nullptr,
                     tin[1].defined() ? tin[1].data<T>() : nullptr, ty.data<T>());
        });
      },
      // Second order: the VJP is bilinear, so its tangent is the VJP with the other input's tangent,
      // ā̇ += ȳ·ḃᵀ and ḃ̄ += ȧᵀ·ȳ (the products above with b → ḃ, a → ȧ).
      [=](const Tensor& gy, std::span<const Tensor> tin, std::span<Tensor> gin_dot) {
        if (g.empty()) return;
        dispatch_float("matmul", gy.dtype(), [&]<class T>(T) {
          T* none = nullptr;
          if (gin_dot[0].defined() && tin[1].defined())
            matmul_vjp(g, av.data<T>(), tin[1].data<T>(), gy.data<T>(), gin_dot[0].data<T>(), none);
          if (gin_dot[1].defined() && tin[0].defined())
            matmul_vjp(g, tin[0].data<T>(), bv.data<T>(), gy.data<T>(), none, gin_dot[1].data<T>());
        });
      });
}

std::vector<OpSheet> matmul_ops() {
  OpSheets r;
  auto product = [](Tape&, std::span<const Var> x) { return matmul(x[0], x[1]); };
  r.add({.name = "matmul",
         .family = "matmul",
         .forward = "y_β = a_α·b_γ: matrix products over the (broadcast) batch axes; β a matrix of y, α and γ the "
                    "matrices of a and b it reads",
         .vjp = "ā_α += Σ_β ȳ_β·b_γᵀ, b̄_γ += Σ_β a_αᵀ·ȳ_β (sums over broadcast batches)",
         .jvp = "ẏ = ȧ·b + a·ḃ",
         .second_order = "ā̇_α += Σ_β ȳ_β·ḃ_γᵀ, b̄̇_γ += Σ_β ȧ_αᵀ·ȳ_β: the VJP with the other factor's tangent",
         .second_order_derivation = "6.2",
         // y (…, m, n) = a (…, m, k) · b (…, k, n): numel(y)·k multiply-adds; ā and b̄ (or ȧ·b and a·ḃ) the same
         // each
         .cost =
             [](std::span<const Shape> in, const Shape& y) {
               const double forward = 2 * static_cast<double>(y.numel()) * static_cast<double>(in[0][in[0].rank() - 1]);
               return OpCost{forward, 2 * forward, 2 * forward};
             },
         // Its gradcheck cases, each checked to first and second order by the suite:
         .cases = {{"2-D (3, 4) @ (4, 2)", {{"a", {3, 4}}, {"b", {4, 2}}}, product},
                   {"odd sizes m=3, k=5, n=7", {{"a", {3, 5}}, {"b", {5, 7}}}, product},
                   {"batched (2, 3, 4) @ (2, 4, 5)", {{"a", {2, 3, 4}}, {"b", {2, 4, 5}}}, product},
                   {"broadcast batch (2, 1, 3, 4) @ (5, 4, 6)", {{"a", {2, 1, 3, 4}}, {"b", {5, 4, 6}}}, product},
                   {"b 2-D, a rank 3: (2, 3, 4) @ (4, 5)", {{"a", {2, 3, 4}}, {"b", {4, 5}}}, product},
                   {"b one matrix with batch axes: (2, 3, 4) @ (1, 1, 4, 5)",
                    {{"a", {2, 3, 4}}, {"b", {1, 1, 4, 5}}},
                    product},
                   {"a 2-D, b rank 3: (3, 4) @ (2, 4, 5)", {{"a", {3, 4}}, {"b", {2, 4, 5}}}, product},
                   {"one input on both sides: x @ x, x (4, 4)",
                    {{"x", {4, 4}}},
                    [](Tape&, std::span<const Var> x) { return matmul(x[0], x[0]); }}},
         .inputs = 2,
         .call = [](std::span<const Var> x, const OpArgs&) { return matmul(x[0], x[1]); }});
  return r.ops;
}

}  // namespace tapegrad
