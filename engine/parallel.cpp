#include "engine/parallel.hpp"

#include <cblas.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tapegrad {

namespace {

thread_local bool t_in_region = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// How long a worker keeps polling for the next job before it sleeps on a futex. A training step runs a parallel
// loop every few microseconds to a millisecond; polling through such gaps saves the wake-up (tens of µs), and
// a worker that found nothing for this long leaves its core to the rest of the machine.
constexpr auto kSpin = std::chrono::microseconds(300);

int default_threads() {
  if (const char* env = std::getenv("TAPEGRAD_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n >= 1) return std::min(n, 256);
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// Workers 1..n−1 wait for a new epoch, run their range of the current job (if it has one for them) and count
// down `pending`; the caller returns, and may publish the next job, only when every worker has counted down.
class Pool {
 public:
  explicit Pool(int threads) : threads_(threads) {
    for (int w = 1; w < threads_; ++w) workers_.emplace_back([this, w] { work(w); });
  }
  ~Pool() {
    stop_.store(true);
    epoch_.fetch_add(1);
    epoch_.notify_all();
    for (auto& t : workers_) t.join();
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  int threads() const { return threads_; }

  // Runs the job on the calling thread and the workers; false (nothing run) if another thread holds the pool.
  bool run(int64_t n, int64_t chunks, parallel_detail::RangeFn fn, void* ctx) {
    if (chunks > threads_ || busy_.test_and_set(std::memory_order_acquire)) return false;
    n_ = n;
    chunks_ = chunks;
    fn_ = fn;
    ctx_ = ctx;
    error_ = nullptr;
    pending_.store(threads_ - 1, std::memory_order_relaxed);  // every worker acknowledges every job
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) epoch_.notify_all();
    t_in_region = true;
    try {
      fn(ctx, 0, chunk_begin(n, chunks, 1), 0);
    } catch (...) {
      record_error();
    }
    t_in_region = false;
    for (int spins = 0; pending_.load(std::memory_order_acquire) > 0; ++spins) {
      cpu_relax();
      if (spins > 4096) std::this_thread::yield();  // the worker may have been descheduled
    }
    std::exception_ptr error = error_;
    busy_.clear(std::memory_order_release);
    if (error) std::rethrow_exception(error);
    return true;
  }

 private:
  void work(int w) {
    t_in_region = true;
    uint64_t seen = 0;
    for (;;) {
      const auto spin_until = std::chrono::steady_clock::now() + kSpin;
      for (int k = 0; epoch_.load(std::memory_order_acquire) == seen; ++k) {
        cpu_relax();
        if ((k & 255) == 255 && std::chrono::steady_clock::now() > spin_until) {
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          epoch_.wait(seen, std::memory_order_seq_cst);
          sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        }
      }
      seen = epoch_.load(std::memory_order_acquire);
      if (stop_.load()) return;
      if (w < chunks_) {
        try {
          fn_(ctx_, chunk_begin(n_, chunks_, w), chunk_begin(n_, chunks_, w + 1), w);
        } catch (...) {
          record_error();
        }
      }
      pending_.fetch_sub(1, std::memory_order_release);  // after this the caller may publish the next job
    }
  }

  void record_error() {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (!error_) error_ = std::current_exception();
  }

  const int threads_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::atomic_flag busy_ = ATOMIC_FLAG_INIT;
  // The current job, written by run() before the epoch is published.
  int64_t n_ = 0, chunks_ = 0;
  parallel_detail::RangeFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::exception_ptr error_;
  std::mutex error_mutex_;
};

std::mutex g_pool_mutex;
Pool* g_pool = nullptr;  // deliberately never destroyed: workers may outlive static destructors that use it

Pool& pool() {
  static Pool* const first = [] {
    openblas_set_num_threads(1);  // the policy in parallel.hpp: the engine's threads are the only ones
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    if (!g_pool) g_pool = new Pool(default_threads());
    return g_pool;
  }();
  (void)first;
  return *g_pool;
}

}  // namespace

int num_threads() { return pool().threads(); }

void set_num_threads(int n) {
  n = std::clamp(n, 1, 256);
  pool();
  if (t_in_region) return;
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (g_pool->threads() == n) return;
  delete g_pool;
  g_pool = new Pool(n);
}

bool in_parallel_region() { return t_in_region; }

int64_t parallel_chunks(int64_t n, int64_t grain) {
  if (t_in_region) return 1;
  grain = std::max<int64_t>(grain, 1);
  if (n < 2 * grain) return 1;
  return std::min<int64_t>(pool().threads(), n / grain);
}

void parallel_detail::run(int64_t n, int64_t chunks, RangeFn fn, void* ctx) {
  if (!pool().run(n, chunks, fn, ctx)) {  // another thread is using the pool: the same ranges, one by one
    t_in_region = true;
    try {
      for (int64_t c = 0; c < chunks; ++c) fn(ctx, chunk_begin(n, chunks, c), chunk_begin(n, chunks, c + 1), c);
    } catch (...) {
      t_in_region = false;
      throw;
    }
    t_in_region = false;
  }
}

}  // namespace tapegrad
