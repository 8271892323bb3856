// Running the tapegrad program from the reliability tests, and what a run leaves on the file system.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <filesystem>
#include <map>
#include <cctype>
#include <string>
#include <vector>

#include "models/checkpoint.hpp"
#include "training_test_util.hpp"
#include "test_paths.hpp"

namespace tapegrad::testing {

// Options of a model that trains in a fraction of a second.
inline const std::vector<std::string> kTiny = {
    "--n-layer",    "1", "--n-head",        "2", "--n-embd", "16", "--block-size", "8", "--batch-size", "4",
    "--eval-iters", "2", "--sample-tokens", "0", "-q"};

// a followed by b, where an option b gives replaces the same option in a (with its value): tapegrad refuses an
// option that takes one value given twice, so with(kTiny, {"--block-size", "16"}) is kTiny at a context of 16.
inline std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  auto is_option = [](const std::string& s) {
    return s.size() > 1 && s[0] == '-' && !std::isdigit(static_cast<unsigned char>(s[1])) && s[1] != '.';
  };
  for (const std::string& option : b) {
    if (!is_option(option)) continue;
    const std::string name = option.substr(0, option.find('='));
    for (size_t i = 0; i < a.size();) {
      if (a[i] != name && a[i].rfind(name + "=", 0) != 0) {
        ++i;
        continue;
      }
      const bool value = a[i] == name && i + 1 < a.size() && !is_option(a[i + 1]);
      a.erase(a.begin() + static_cast<std::ptrdiff_t>(i), a.begin() + static_cast<std::ptrdiff_t>(i + (value ? 2 : 1)));
    }
  }
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The step a run's checkpoint holds, or −1 while there is none.
inline int64_t checkpoint_step(const std::string& path) {
  if (!std::filesystem::exists(path)) return -1;
  try {
    return std::stoll(load_checkpoint(path).metadata.at("tapegrad.step"));
  } catch (const std::exception&) {
    return -1;
  }
}

// n bytes of English text, a sentence repeated.
inline std::string text_of_length(size_t n) {
  const std::string line = "the quick brown fox jumps over the lazy dog, then rests.\n";
  std::string s;
  while (s.size() < n) s += line;
  s.resize(n);
  return s;
}

struct CliRun {
  int code = -1;        // exit code; -1 if the program died of a signal
  int signal = 0;       // the signal that killed it, or 0
  std::string out;      // stdout and stderr, interleaved
  long max_rss_kb = 0;  // the child's peak resident memory (ru_maxrss)
};

// Whether this build (and so the program it tests) runs under AddressSanitizer, whose shadow memory and quarantine
// make up most of a process's resident memory: the bound on a refusal's memory is checked in unsanitized builds.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

// How much longer the program takes under the sanitizers (checked builds run several times slower): the bounds on
// how soon a signal or a refusal is answered are scaled by it, the promise itself is made of the normal build.
inline constexpr double kSanitizerSlowdown = kAddressSanitizer ? 4 : 1;

// A refusal takes under 100 MB of resident memory at its peak (not checked under AddressSanitizer, above).
inline bool refused_in_little_memory(const CliRun& r) { return kAddressSanitizer || r.max_rss_kb < 100 * 1024; }

// Runs the tapegrad program with `args` (no shell: every byte of an argument is passed as is) in directory `cwd`,
// killed by SIGALRM after `timeout_s` seconds.
inline CliRun run_cli(const std::string& cwd, const std::vector<std::string>& args, unsigned timeout_s = 300) {
  // Everything the child needs is made before fork: between fork and exec it only makes system calls.
  std::string program = TAPEGRAD_CLI;
  std::vector<std::string> copy = args;
  std::vector<char*> argv{program.data()};
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    if (chdir(cwd.c_str()) != 0) _exit(126);
    alarm(timeout_s);  // survives exec: a hung run dies of SIGALRM
    execv(program.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  CliRun r;
  std::array<char, 4096> buf{};
  ssize_t n;
  while ((n = read(fds[0], buf.data(), buf.size())) > 0 || (n < 0 && errno == EINTR))
    if (n > 0) r.out.append(buf.data(), static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  struct rusage usage {};
  while (wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {}
  r.max_rss_kb = usage.ru_maxrss;
  if (WIFEXITED(status)) r.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

// In dir: text.txt (3000 bytes of text_of_length) and a tiny softmax run on it of `steps` steps, evaluated every 2,
// in made/softmax/ (its checkpoint is kTinyCheckpoint). The run's exit, for the caller to require.
inline const std::string kTinyCheckpoint = "made/softmax/checkpoint.safetensors";
inline CliRun make_tiny_run(const std::filesystem::path& dir, int steps) {
  spit((dir / "text.txt").string(), text_of_length(3000));
  return run_cli(dir.string(), with({"train", "--data", "text.txt", "--max-iters", std::to_string(steps),
                                     "--eval-interval", "2", "--out", "made"},
                                    kTiny));
}

// Every file and directory under `root` with its size and modification time: equal snapshots mean nothing was
// created, removed or rewritten.
inline std::map<std::string, std::string> snapshot(const std::filesystem::path& root) {
  std::map<std::string, std::string> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    struct stat st {};
    if (::lstat(e.path().c_str(), &st) != 0) continue;
    files[std::filesystem::relative(e.path(), root).string()] =
        std::to_string(st.st_size) + "@" + std::to_string(st.st_mtim.tv_sec) + "." +
        std::to_string(st.st_mtim.tv_nsec) + (S_ISDIR(st.st_mode) ? "/" : "");
  }
  return files;
}

}  // namespace tapegrad::testing
