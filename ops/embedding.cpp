// Embedding lookup: a row gather from a table, indexed by integer token ids.
//
// ids (...) int32, table E (V, C) → Y (..., C) with, for every id position p,
//   Y[p, :] = E[ids[p], :]
// Y is linear in E and piecewise constant in ids, so ids carry no derivative. With p running over the
// positions of ids:
//   VJP  Ē[v, :] += Σ_{p : ids[p] = v} Ȳ[p, :]      (scatter-add; a repeated id collects the sum of its rows)
//   JVP  Ẏ[p, :]  = Ė[ids[p], :]                     (the same gather, applied to the tangent)
#include <algorithm>
#include <string>

#include "ops/sheet.hpp"
#include "engine/parallel.hpp"
#include "ops/common.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

// Work: the gather and its tangent split the positions across the engine's threads. The scatter-add cannot (two
// positions with one id would add into one row at once): it splits the table's rows instead, each thread adding
// the positions whose id falls in its rows, in position order.
constexpr int64_t kGrain = 16384;  // elements per range, at least

// Y (n, C) = E[ids] for n = numel(ids) positions; E (V, C).
template <class T>
void embedding_forward(const int32_t* ids, int64_t n, const T* table, int64_t channels, T* y) {
  parallel_for(n, std::max<int64_t>(1, kGrain / std::max<int64_t>(channels, 1)), [=](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      std::copy_n(table + static_cast<int64_t>(ids[p]) * channels, channels, y + p * channels);
  });
}

// Ē (V, C) += scatter of Ȳ (n, C) by ids: Ē[ids[p]] += Ȳ[p].
template <class T>
void embedding_vjp(const int32_t* ids, int64_t n, const T* gy, int64_t channels, int64_t vocab, T* gtable) {
  const int64_t grain = n * channels >= 2 * kGrain ? 1 : vocab;
  parallel_for(vocab, grain, [=](int64_t v0, int64_t v1) {
    for (int64_t p = 0; p < n; ++p) {
      if (ids[p] < v0 || ids[p] >= v1) continue;
      T* row = gtable + static_cast<int64_t>(ids[p]) * channels;
      const T* g = gy + p * channels;
      for (int64_t c = 0; c < channels; ++c) row[c] += g[c];
    }
  });
}

// Ẏ (n, C) += Ė[ids] with Ė (V, C).
template <class T>
void embedding_jvp(const int32_t* ids, int64_t n, const T* ttable, int64_t channels, T* ty) {
  parallel_for(n, std::max<int64_t>(1, kGrain / std::max<int64_t>(channels, 1)), [=](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* row = ttable + static_cast<int64_t>(ids[p]) * channels;
      T* t = ty + p * channels;
      for (int64_t c = 0; c < channels; ++c) t[c] += row[c];
    }
  });
}

}  // namespace

Var embedding(Var ids, Var table) {
  constexpr const char* op = "embedding";
  Tape& tape = tape_of(op, {ids, table});
  if (ids.dtype() != DType::i32) fail("{}: ids must be int32, got {} {}", op, ids.dtype(), ids.shape());
  expect_float(op, table);
  if (table.rank() != 2) fail("{}: table must be 2-D (V, C), got shape {}", op, table.shape());
  if (ids.rank() >= Shape::kMaxRank)
    fail("{}: ids of shape {} have rank {}; the output (..., C) allows ids of rank ≤ {}", op, ids.shape(), ids.rank(),
         Shape::kMaxRank - 1);
  const int64_t vocab = table.shape()[0], channels = table.shape()[1];
  const Tensor idv = ids.value(), tv = table.value();
  const int32_t* pid = idv.data<int32_t>();
  const int64_t n = idv.numel();
  for (int64_t p = 0; p < n; ++p)
    if (pid[p] < 0 || pid[p] >= vocab)
      fail("{}: id {} at ids{} is out of range for a table of V = {} rows (ids of shape {}, table {})", op, pid[p],
           multi_index(idv.shape(), p), vocab, idv.shape(), tv.shape());

  Shape out_shape = idv.shape();
  out_shape.push_back(channels);
  Tensor y = tape.empty(tv.dtype(), out_shape);
  dispatch_float(op, tv.dtype(), [&]<class T>(T) { embedding_forward(pid, n, tv.data<T>(), channels, y.data<T>()); });
  return tape.record(
      op, {ids, table}, y,
      [idv, n, channels, vocab](const Tensor& g, std::span<Tensor> gin) {
        if (!gin[1].defined()) return;
        dispatch_float(op, g.dtype(), [&]<class T>(T) {
          embedding_vjp(idv.data<int32_t>(), n, g.data<T>(), channels, vocab, gin[1].data<T>());
        });
      },
      [idv, n, channels](std::span<const Tensor> tin, Tensor& ty) {
        if (!tin[1].defined()) return;
        dispatch_float(op, ty.dtype(), [&]<class T>(T) {
          embedding_jvp(idv.data<int32_t>(), n, tin[1].data<T>(), channels, ty.data<T>());
        });
      },
      Tape::linear_in_inputs);
}

std::vector<OpSheet> embedding_ops() {
  OpSheets r;
  auto lookup = [](Tape&, std::span<const Var> x) { return embedding(x[0], x[1]); };
  r.add({.name = "embedding",
         .family = "embedding",
         .forward = "Y[p] = E[ids[p]]: the rows of the table E the ids name",
         .vjp = "Ē[v] += Σ_{p: ids[p] = v} Ȳ[p]; ids not differentiable",
         .jvp = "Ẏ[p] = Ė[ids[p]]",
         .second_order = kNoSecondOrderTerm,
         // Its gradcheck cases, each checked to first and second order by the suite:
         .cases = {{"ids (2, 3), V = 6", {{"ids", {2, 3}, Fill::indices, 6}, {"table", {6, 4}}}, lookup},
                   {"12 ids, V = 5", {{"ids", {12}, Fill::indices, 5}, {"table", {5, 3}}}, lookup},
                   {"ids (2, 2, 3), V = 4", {{"ids", {2, 2, 3}, Fill::indices, 4}, {"table", {4, 2}}}, lookup},
                   {"scalar id, V = 3", {{"ids", {}, Fill::indices, 3}, {"table", {3, 5}}}, lookup}},
         .inputs = 2,
         .call = [](std::span<const Var> x, const OpArgs&) { return embedding(x[0], x[1]); }});
  return r.ops;
}

}  // namespace tapegrad
