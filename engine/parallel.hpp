// The engine's own threads: one small pool, sized to the cores, for the loops of the ops (over batch × heads,
// over rows) and for splitting large matrix products by rows.
//
// parallel_for(n, grain, fn) cuts [0, n) into at most num_threads() contiguous ranges of equal size (static,
// deterministic: the ranges depend on n, grain and the thread count only, never on timing), runs the first on
// the calling thread and the others on the pool, and returns when all are done. fn(begin, end) or
// fn(begin, end, chunk), with chunk ∈ [0, parallel_chunks(n, grain)) the range's index, so that a caller can give
// each range its own scratch or its own partial sum and combine them afterwards in chunk order.
//
// Policy with OpenBLAS. OpenBLAS runs single-threaded (openblas_set_num_threads(1), set when the pool starts):
// the engine's threads are the only ones. A large product is split by rows of its result across the pool,
// each thread one sgemm on its slice (ops/products/blas.hpp); products inside a parallel loop run whole on the
// thread that owns the loop's range. Why not OpenBLAS' threads for large products:
//   - OpenBLAS' pthread workers poll in sched_yield after each threaded call; between the many small products
//     of a training step they held a core about 35% of the time (perf), competing with the engine's own loops;
//   - one thread count for everything: nothing can oversubscribe the cores (N engine threads that each call a
//     BLAS that starts N more), and the blocks of a product, hence its bits, depend on the thread count only.
// A loop body never calls parallel_for recursively in parallel: inside a range (or when another thread of the
// program is already running a parallel_for) it runs inline, serially.
#pragma once

#include <cstdint>
#include <type_traits>

namespace tapegrad {

// The most threads the engine's pool takes.
inline constexpr int kMaxThreads = 256;
// Threads the engine uses (the calling thread included): the TAPEGRAD_NUM_THREADS environment variable if set,
// else the CPUs this process may run on. A value that is not a whole number from 1 to kMaxThreads is named in a
// warning on stderr (then the CPUs are used; above kMaxThreads, kMaxThreads).
int num_threads();
// Changes the thread count (1 = serial); call it outside any parallel_for. Results are bit-identical run to run
// for one thread count; a different count may change the order of float sums.
void set_num_threads(int n);
// True inside a parallel_for range (where nested loops and products run serially).
bool in_parallel_region();

// The number of ranges parallel_for(n, grain, ·) uses: 1 when n < 2·grain, inside a parallel region or with one
// thread; else min(num_threads(), n / grain).
int64_t parallel_chunks(int64_t n, int64_t grain);

// Range c of `chunks` equal ranges of [0, n): [n·c/chunks, n·(c+1)/chunks).
inline int64_t chunk_begin(int64_t n, int64_t chunks, int64_t c) { return n * c / chunks; }

namespace parallel_detail {
using RangeFn = void (*)(void* ctx, int64_t begin, int64_t end, int64_t chunk);
// Runs fn on `chunks` ranges of [0, n), chunk 0 on the calling thread.
void run(int64_t n, int64_t chunks, RangeFn fn, void* ctx);
}  // namespace parallel_detail

template <class F>
void parallel_for(int64_t n, int64_t grain, F&& fn) {
  if (n <= 0) return;
  using Fn = std::remove_reference_t<F>;
  constexpr bool with_chunk = std::is_invocable_v<Fn&, int64_t, int64_t, int64_t>;
  const int64_t chunks = parallel_chunks(n, grain);
  if (chunks <= 1) {
    if constexpr (with_chunk) fn(int64_t{0}, n, int64_t{0});
    else fn(int64_t{0}, n);
    return;
  }
  parallel_detail::run(
      n, chunks,
      [](void* ctx, int64_t begin, int64_t end, int64_t chunk) {
        Fn& f = *static_cast<Fn*>(ctx);
        if constexpr (with_chunk) f(begin, end, chunk);
        else f(begin, end);
      },
      const_cast<void*>(static_cast<const void*>(&fn)));
}

}  // namespace tapegrad
