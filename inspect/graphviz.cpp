#include "inspect/graphviz.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/tensor.hpp"

extern char** environ;

namespace tapegrad {

std::optional<std::string> find_program(std::string_view name) {
  auto runnable = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (name.empty()) return std::nullopt;
  if (name.find('/') != std::string_view::npos) {
    const std::string p(name);
    return runnable(p) ? std::optional<std::string>(p) : std::nullopt;
  }
  const char* env = std::getenv("PATH");
  const std::string_view path = env ? env : "/usr/local/bin:/usr/bin:/bin";
  for (size_t start = 0; start <= path.size();) {
    size_t end = path.find(':', start);
    if (end == std::string_view::npos) end = path.size();
    std::string candidate(start == end ? std::string_view(".") : path.substr(start, end - start));
    candidate += '/';
    candidate += name;
    if (runnable(candidate)) return candidate;
    start = end + 1;
  }
  return std::nullopt;
}

std::optional<std::string> find_dot_program() { return find_program("dot"); }

namespace {

struct Fd {
  int fd = -1;
  Fd() = default;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { close(); }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

void make_pipe(Fd& read_end, Fd& write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) fail("render_dot: cannot make a pipe: {}", std::strerror(errno));
  read_end.fd = fds[0];
  write_end.fd = fds[1];
}

// SIGPIPE blocked in this thread while it lives, so that writing to a dot that has exited fails with EPIPE
// instead of ending the process; a SIGPIPE raised meanwhile is taken off before the mask is restored.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeBlock() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec now{};
      sigtimedwait(&pipe_, nullptr, &now);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;
  const sigset_t& old_mask() const { return old_; }

 private:
  sigset_t pipe_{}, old_{};
  bool was_pending_ = false;
};

// The child: killed and reaped if its output is abandoned (an error while talking to it).
struct Child {
  pid_t pid = -1;
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    wait();
  }
  int wait() {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    pid = -1;
    return status;
  }
};

}  // namespace

std::string render_dot(std::string_view dot_text, std::string_view format) {
  if (format.empty()) fail("render_dot: no output format given (svg, png, json, ...)");
  const auto dot = find_dot_program();
  if (!dot) fail("render_dot: Graphviz's dot program is not on PATH (Debian's package graphviz)");
  Fd in_read, in_write, out_read, out_write, err_read, err_write;
  make_pipe(in_read, in_write);
  make_pipe(out_read, out_write);
  make_pipe(err_read, err_write);
  SigpipeBlock sigpipe;

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_read.fd, 0);
  posix_spawn_file_actions_adddup2(&actions, out_write.fd, 1);
  posix_spawn_file_actions_adddup2(&actions, err_write.fd, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setsigmask(&attr, &sigpipe.old_mask());
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  std::string flag = "-T" + std::string(format);
  char name[] = "dot";
  char* argv[] = {name, flag.data(), nullptr};
  Child child;
  const int spawned = posix_spawn(&child.pid, dot->c_str(), &actions, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (spawned != 0) {
    child.pid = -1;
    fail("render_dot: cannot run {}: {}", *dot, std::strerror(spawned));
  }
  in_read.close();
  out_write.close();
  err_write.close();
  ::fcntl(in_write.fd, F_SETFL, ::fcntl(in_write.fd, F_GETFL) | O_NONBLOCK);

  // dot's input, output and messages at once: a large graph fills a pipe before dot has read all of its input.
  std::string out, err;
  size_t written = 0;
  if (dot_text.empty()) in_write.close();
  char buffer[1 << 16];
  while (out_read.fd >= 0 || err_read.fd >= 0) {
    pollfd fds[3] = {{in_write.fd, POLLOUT, 0}, {out_read.fd, POLLIN, 0}, {err_read.fd, POLLIN, 0}};
    if (::poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      fail("render_dot: poll: {}", std::strerror(errno));
    }
    if (in_write.fd >= 0 && fds[0].revents != 0) {
      const ssize_t n = ::write(in_write.fd, dot_text.data() + written, dot_text.size() - written);
      if (n > 0) written += static_cast<size_t>(n);
      if ((n < 0 && errno != EAGAIN && errno != EINTR) || written == dot_text.size()) in_write.close();
    }
    for (auto [fd, text, revents] :
         {std::tuple{&out_read, &out, fds[1].revents}, std::tuple{&err_read, &err, fds[2].revents}}) {
      if (fd->fd < 0 || revents == 0) continue;
      const ssize_t n = ::read(fd->fd, buffer, sizeof buffer);
      if (n > 0) text->append(buffer, static_cast<size_t>(n));
      else if (n == 0 || (errno != EAGAIN && errno != EINTR)) fd->close();
    }
  }
  in_write.close();
  const int status = child.wait();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return out;
  std::string message = err.substr(0, err.find('\n'));
  if (message.empty()) message = "no message";
  const std::string how = WIFEXITED(status) ? fmt::format("exit code {}", WEXITSTATUS(status))
                                            : fmt::format("signal {}", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  fail("render_dot: dot -T{} failed ({}): {}", format, how, message);
}

}  // namespace tapegrad
