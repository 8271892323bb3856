// The engine's thread pool and the split products: static ranges, nesting, errors, determinism.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "ops/products/blas.hpp"
#include "engine/parallel.hpp"
#include "engine/rng.hpp"

using namespace tapegrad;

namespace {

// Restores the thread count a test changed.
struct ThreadCount {
  int saved = num_threads();
  explicit ThreadCount(int n) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(saved); }
};

std::vector<float> random_floats(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

}  // namespace

TEST_CASE("parallel_for visits every index once, in static equal ranges") {
  ThreadCount threads(2);
  for (int64_t n : {1, 2, 3, 7, 64, 1000, 100003}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::vector<int64_t> begins(2, -1), ends(2, -1);
    parallel_for(n, 1, [&](int64_t b, int64_t e, int64_t chunk) {
      begins[static_cast<size_t>(chunk)] = b;
      ends[static_cast<size_t>(chunk)] = e;
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
    });
    for (auto& h : hits) CHECK(h.load() == 1);
    const int64_t chunks = parallel_chunks(n, 1);
    CHECK(chunks == (n >= 2 ? 2 : 1));
    for (int64_t c = 0; c < chunks; ++c) {
      CHECK(begins[static_cast<size_t>(c)] == chunk_begin(n, chunks, c));
      CHECK(ends[static_cast<size_t>(c)] == chunk_begin(n, chunks, c + 1));
    }
  }
}

TEST_CASE("parallel_for: grain, one thread, nesting") {
  ThreadCount threads(2);
  CHECK(parallel_chunks(10, 6) == 1);  // fewer than two grains: inline
  CHECK(parallel_chunks(12, 6) == 2);
  CHECK(parallel_chunks(0, 1) == 1);
  int calls = 0;
  parallel_for(10, 6, [&](int64_t b, int64_t e) {
    ++calls;
    CHECK(b == 0);
    CHECK(e == 10);
  });
  CHECK(calls == 1);
  std::atomic<int> inner_chunks{0};
  parallel_for(8, 1, [&](int64_t, int64_t) {
    CHECK(in_parallel_region());
    CHECK(parallel_chunks(100, 1) == 1);
    parallel_for(100, 1, [&](int64_t b, int64_t e) {  // runs inline on this range's thread
      CHECK(b == 0);
      CHECK(e == 100);
      inner_chunks.fetch_add(1);
    });
  });
  CHECK(inner_chunks.load() == 2);
  CHECK(!in_parallel_region());
  set_num_threads(1);
  CHECK(num_threads() == 1);
  CHECK(parallel_chunks(1000, 1) == 1);
}

TEST_CASE("an exception in any range reaches the caller, and the pool keeps working") {
  ThreadCount threads(2);
  for (int64_t bad : {0, 99}) {
    CHECK_THROWS_WITH_AS(parallel_for(100, 1,
                                      [&](int64_t b, int64_t e) {
                                        if (bad >= b && bad < e) throw std::runtime_error("range failed");
                                      }),
                         "range failed", std::runtime_error);
  }
  std::atomic<int64_t> sum{0};
  parallel_for(1000, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum.fetch_add(i);
  });
  CHECK(sum.load() == 999 * 1000 / 2);
}

TEST_CASE(
    "a split product equals the unsplit one to rounding (on the engine's kernel to the bit), for every transpose") {
  ThreadCount threads(2);
  // All above the split threshold; odd row counts leave narrow edge blocks.
  struct Dims {
    int64_t m, n, k;
  };
  for (Dims dims :
       {Dims{200, 150, 96}, Dims{197, 130, 301}, Dims{768, 512, 128}, Dims{48, 300, 200}, Dims{197, 144, 301}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int64_t m = dims.m, n = dims.n, k = dims.k;
        CAPTURE(m);
        CAPTURE(ta);
        CAPTURE(tb);
        auto a = random_floats(static_cast<size_t>(m * k), 1), b = random_floats(static_cast<size_t>(k * n), 2);
        auto whole = random_floats(static_cast<size_t>(m * n), 3);
        auto split = whole;
        const int64_t lda = ta ? m : k, ldb = tb ? k : n;
        const blas_detail::Route via = blas_detail::route<float>(m, n, k, ta);
        blas_detail::gemm_call(via, ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 1.0f, whole.data(), n);
        gemm(m, n, k, 0.5f, MatrixOperand<float>{a.data(), lda, ta}, MatrixOperand<float>{b.data(), ldb, tb}, 1.0f,
             split.data(), n);
        float worst = 0;
        for (size_t i = 0; i < whole.size(); ++i)
          worst = std::max(worst, std::fabs(whole[i] - split[i]) / (1 + std::fabs(whole[i])));
        CHECK(worst <= 1e-5f);
        // The engine's kernel sums each element over k in one order whatever the blocks: the same bits.
        if (via == blas_detail::Route::small) CHECK(whole == split);
      }
}

TEST_CASE("a large split product is the same in every run") {
  ThreadCount threads(2);
  const int64_t m = 768, n = 512, k = 128;
  auto a = random_floats(static_cast<size_t>(m * k), 5), b = random_floats(static_cast<size_t>(n * k), 6);
  std::vector<float> first(static_cast<size_t>(m * n)), again(static_cast<size_t>(m * n));
  gemm(m, n, k, 1.0f, as_is(a.data(), k), transposed(b.data(), k), 0.0f, first.data(), n);
  for (int run = 0; run < 5; ++run) {
    gemm(m, n, k, 1.0f, as_is(a.data(), k), transposed(b.data(), k), 0.0f, again.data(), n);
    CHECK(again == first);
  }
}

TEST_CASE("many short parallel_for calls in a row: every chunk runs once, whoever takes it") {
  ThreadCount threads(2);
  std::vector<int64_t> per_chunk(2);
  int64_t total = 0;
  for (int call = 0; call < 20000; ++call) {
    per_chunk.assign(2, 0);
    parallel_for(64, 1, [&](int64_t b, int64_t e, int64_t chunk) {
      for (int64_t i = b; i < e; ++i) per_chunk[static_cast<size_t>(chunk)] += i;
    });
    total += per_chunk[0] + per_chunk[1];
    REQUIRE(per_chunk[0] == 31 * 32 / 2);
  }
  CHECK(total == 20000 * (63 * 64 / 2));
}
