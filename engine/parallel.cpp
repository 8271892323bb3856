#include "engine/parallel.hpp"

#include <cblas.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
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

int cpu_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// TAPEGRAD_NUM_THREADS when it is a whole number from 1 to kMaxThreads; anything else ("abc", "-5", "0", "4x") is
// said on stderr, naming the variable and the value, and the CPUs are used instead; a larger number is said and
// capped. The pool is made lazily, from library code, so a warning (once) rather than an exception.
int default_threads() {
  const char* env = std::getenv("TAPEGRAD_NUM_THREADS");
  if (!env || !*env) return cpu_threads();  // unset, or set empty as shells unset a variable for one command
  const std::string text(env);
  long long n = 0;
  bool whole = !text.empty() && text.size() <= 18;
  for (char c : text) {
    whole = whole && c >= '0' && c <= '9';
    if (whole) n = n * 10 + (c - '0');
  }
  if (!whole || n < 1) {
    const int cpus = cpu_threads();
    std::fprintf(stderr,
                 "tapegrad: warning: TAPEGRAD_NUM_THREADS=%s is not a number of threads (a whole number from 1 to %d); "
                 "using %d, the CPUs this process may run on\n",
                 text.substr(0, 40).c_str(), kMaxThreads, cpus);
    return cpus;
  }
  if (n > kMaxThreads) {
    std::fprintf(stderr, "tapegrad: warning: TAPEGRAD_NUM_THREADS=%s is above the limit of %d threads; using %d\n",
                 text.substr(0, 40).c_str(), kMaxThreads, kMaxThreads);
    return kMaxThreads;
  }
  return static_cast<int>(n);
}

// A parallel_for in progress. It lives on the caller's stack; the caller does not return before every chunk is
// done and no worker is looking at it.
struct Job {
  int64_t n = 0, chunks = 0;
  parallel_detail::RangeFn fn = nullptr;
  void* ctx = nullptr;
  std::atomic<int64_t> done{0};
  std::exception_ptr error;
  std::mutex error_mutex;

  void run_chunk(int64_t c) {
    try {
      fn(ctx, chunk_begin(n, chunks, c), chunk_begin(n, chunks, c + 1), c);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
    done.fetch_add(1, std::memory_order_release);
  }
};

// Chunk c of a job belongs to worker c (chunk 0 to the caller), but whoever claims it first runs it: after its
// own chunk the caller claims the chunks no worker has started, so a worker that the OS has not scheduled yet
// (other processes on the cores) delays nothing. A chunk computes the same thing whichever thread runs it, so the
// results do not depend on who ran what.
//
// Publication: the caller resets the claims, stores the job pointer, bumps the epoch (waking sleeping workers);
// a worker announces itself in `active_` before it reads the pointer. Before returning, the caller clears the
// pointer and waits for `active_` to drain: a worker either was counted (and is waited for) or reads the cleared
// pointer or a later job.
class Pool {
 public:
  explicit Pool(int threads) : threads_(threads), claims_(new std::atomic<bool>[static_cast<size_t>(threads)]) {
    for (int c = 0; c < threads_; ++c) claims_[static_cast<size_t>(c)].store(true);
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
    Job job;
    job.n = n;
    job.chunks = chunks;
    job.fn = fn;
    job.ctx = ctx;
    for (int64_t c = 1; c < chunks; ++c) claims_[static_cast<size_t>(c)].store(false, std::memory_order_relaxed);
    job_.store(&job, std::memory_order_seq_cst);
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) epoch_.notify_all();
    t_in_region = true;
    job.run_chunk(0);
    for (int64_t c = 1; c < chunks; ++c)
      if (!claims_[static_cast<size_t>(c)].exchange(true, std::memory_order_acq_rel)) job.run_chunk(c);
    t_in_region = false;
    job_.store(nullptr, std::memory_order_seq_cst);
    for (int spins = 0; job.done.load(std::memory_order_acquire) < chunks || active_.load() > 0; ++spins) {
      cpu_relax();
      if (spins > 4096) std::this_thread::yield();  // a worker was descheduled inside its chunk
    }
    busy_.clear(std::memory_order_release);
    if (job.error) std::rethrow_exception(job.error);
    return true;
  }

 private:
  void work(int w) {
    // A worker runs kernels, some of them generated (oneDNN's): it never takes an asynchronous signal, whose
    // handler would run on its stack in the middle of one. The program's signals go to its other threads.
    sigset_t asynchronous;
    sigemptyset(&asynchronous);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGPIPE})
      sigaddset(&asynchronous, sig);
    pthread_sigmask(SIG_BLOCK, &asynchronous, nullptr);
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
      active_.fetch_add(1, std::memory_order_seq_cst);
      Job* job = job_.load(std::memory_order_seq_cst);
      if (job && w < job->chunks && !claims_[static_cast<size_t>(w)].exchange(true, std::memory_order_acq_rel))
        job->run_chunk(w);
      active_.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  const int threads_;
  std::unique_ptr<std::atomic<bool>[]> claims_;  // claims_[c]: chunk c of the current job has been taken
  std::vector<std::thread> workers_;
  std::atomic<Job*> job_{nullptr};
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int> active_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::atomic_flag busy_ = ATOMIC_FLAG_INIT;
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
  n = std::clamp(n, 1, kMaxThreads);
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
