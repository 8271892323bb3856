// The two functions of <sched.h> that engine/parallel.cpp calls to count the CPUs it may run on, which emscripten's C
// library declares and does not define. A page runs the module on one thread: sched_getaffinity says it cannot tell
// (-1, ENOSYS), so the engine falls back to std::thread::hardware_concurrency(); the pool is made with one thread
// in any case (web/bindings.cpp sets TAPEGRAD_NUM_THREADS=1).
#include <sched.h>

#include <cerrno>
#include <cstddef>

extern "C" {

int sched_getaffinity(pid_t, size_t, cpu_set_t*) {
  errno = ENOSYS;
  return -1;
}

// CPU_COUNT's bit count over the set's bytes.
int __sched_cpucount(size_t size, const cpu_set_t* set) {
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(set);
  int count = 0;
  for (size_t i = 0; i < size; ++i)
    for (unsigned char b = bytes[i]; b; b &= static_cast<unsigned char>(b - 1)) ++count;
  return count;
}

}  // extern "C"
