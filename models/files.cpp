#include "models/files.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

#include "engine/tensor.hpp"
#include "inspect/process_memory.hpp"

namespace tapegrad {

namespace {

std::string errno_text(int err) { return std::generic_category().message(err); }

// The temporary of write_file_atomic: closed, and removed unless it was renamed into place.
struct TemporaryFile {
  std::string path;
  int fd = -1;
  bool renamed = false;
  ~TemporaryFile() {
    if (fd >= 0) ::close(fd);
    if (!renamed && !path.empty()) ::unlink(path.c_str());
  }
};

// Writes all of `bytes` to fd, through short writes and interrupted calls; false with errno set on failure.
bool write_all(int fd, std::string_view bytes) {
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

// The descriptor that `p` names by itself: /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N; −1 for any other
// path. Such a name is a link into /proc whose target is the open file (a pipe's is "pipe:[1234]", no path at all).
int descriptor_of_name(const std::filesystem::path& p) {
  const std::string s = p.lexically_normal().string();
  if (s == "/dev/stdout") return STDOUT_FILENO;
  if (s == "/dev/stderr") return STDERR_FILENO;
  for (std::string_view dir : {"/dev/fd/", "/proc/self/fd/"}) {
    if (s.size() <= dir.size() || s.compare(0, dir.size(), dir) != 0) continue;
    int fd = 0;
    for (size_t i = dir.size(); i < s.size(); ++i) {
      if (s[i] < '0' || s[i] > '9' || fd > 1'000'000) return -1;
      fd = fd * 10 + (s[i] - '0');
    }
    return fd;
  }
  return -1;
}

// The file a write to `path` lands in: symlinks followed to the end of their chain (a dangling one to the path it
// names), so that the real file is replaced and the link is left as it was. A link to one of the process's
// descriptors (/dev/stdout) stops there: what it leads to is the open file, which is written through the descriptor.
std::string resolved_target(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p(path);
  std::error_code ec;
  for (int hops = 0; descriptor_of_name(p) < 0 && fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
    if (hops == 40) fail("cannot write '{}': too many levels of symbolic links", path);
    fs::path next = fs::read_symlink(p, ec);
    if (ec) fail("cannot write '{}': cannot read the symbolic link '{}': {}", path, p.string(), ec.message());
    p = next.is_absolute() ? next : p.parent_path() / next;
  }
  return p.string();
}

// Streams the pieces into an existing file that is not a regular one (a fifo, a character device such as
// /dev/null or /dev/stdout): such a file cannot be replaced, and renaming over it would destroy it.
// A fifo is opened without blocking: with no reader, a blocking open would wait for one for ever (holding the run
// directory's lock, deaf to signals). A reader gets a second to appear; after that the write is refused.
void write_into_special_file(const std::string& path, const std::string& real,
                             std::span<const std::string_view> pieces) {
  int fd = -1;
  for (int tries = 0;; ++tries) {
    fd = ::open(real.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd >= 0 || errno != ENXIO || tries == 100) break;
    ::usleep(10'000);
  }
  if (fd < 0) {
    int err = errno;
    if (err == ENXIO) fail("cannot write '{}': it is a fifo and nothing reads from it", path);
    fail("cannot write '{}': {}", path, errno_text(err));
  }
  // Opened: the writes may wait for the reader, as writes into a pipe do.
  if (const int flags = ::fcntl(fd, F_GETFL); flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  bool written = true;
  for (size_t i = 0; written && i < pieces.size(); ++i) written = write_all(fd, pieces[i]);
  const int err = errno;
  ::close(fd);
  if (!written) fail("cannot write '{}': {}", path, errno_text(err));
}

// /dev/stdout and its kind: written through the descriptor the process holds, where the shell's redirection put it
// (`>> log` appends, a pipe carries it), never reopened, resolved or renamed over. What stdio holds is flushed
// first, so that the bytes come in the order the program wrote them.
void write_into_descriptor(const std::string& path, int fd, std::span<const std::string_view> pieces) {
  std::fflush(nullptr);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    fail("cannot write '{}': descriptor {} is not open ({})", path, fd, errno_text(err));
  }
  for (const std::string_view piece : pieces)
    if (!write_all(fd, piece)) {
      int err = errno;
      fail("cannot write '{}': {}", path, errno_text(err));
    }
}

// The temporary goes beside the real file, so that the rename stays within one file system and replaces it.
void write_regular_file_atomic(const std::string& path, const std::string& real,
                               std::span<const std::string_view> pieces) {
  namespace fs = std::filesystem;
  fs::path target(real);
  if (!target.has_filename()) fail("cannot write '{}': the path names a directory, not a file", path);
  std::string dir = target.has_parent_path() ? target.parent_path().string() : std::string(".");

  TemporaryFile tmp;
  std::string base = target.filename().string();
  base.insert(0, 1, '.');
  base += ".tmp-XXXXXX";
  std::string name = (fs::path(dir) / base).string();
  tmp.fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (tmp.fd < 0) {
    int err = errno;
    fail("cannot write '{}': cannot create a temporary file in '{}': {}", path, dir, errno_text(err));
  }
  tmp.path = name;

  struct stat old {};
  mode_t mode = (::stat(real.c_str(), &old) == 0 && S_ISREG(old.st_mode)) ? (old.st_mode & 07777) : 0644;
  bool written = ::fchmod(tmp.fd, mode) == 0;
  for (size_t i = 0; written && i < pieces.size(); ++i) written = write_all(tmp.fd, pieces[i]);
  if (!written || ::fsync(tmp.fd) != 0) {
    int err = errno;
    fail("cannot write '{}': {}", path, errno_text(err));
  }
  int fd = tmp.fd;
  tmp.fd = -1;
  if (::close(fd) != 0) {
    int err = errno;
    fail("cannot write '{}': closing the temporary file failed: {}", path, errno_text(err));
  }
  if (::rename(tmp.path.c_str(), real.c_str()) != 0) {
    int err = errno;
    fail("cannot write '{}': renaming the temporary file over it failed: {}", path, errno_text(err));
  }
  tmp.renamed = true;

  // The rename is durable once the directory entry is: sync the directory. A file system that cannot sync a
  // directory says EINVAL; there the rename is as durable as that file system makes it.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    int err = errno;
    fail("wrote '{}' but cannot open its directory to sync it: {}", path, errno_text(err));
  }
  int rc = ::fsync(dfd);
  int err = errno;
  ::close(dfd);
  if (rc != 0 && err != EINVAL) fail("wrote '{}' but syncing its directory failed: {}", path, errno_text(err));
}

}  // namespace

void write_file_atomic(const std::string& path, std::string_view bytes) {
  write_file_atomic(path, std::span<const std::string_view>(&bytes, 1));
}

bool same_regular_file(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return S_ISREG(sa.st_mode) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void refuse_input_as_output(const std::string& output, std::string_view output_option, const std::string& input,
                            std::string_view input_option) {
  // A new file is no input; /dev/stdout and fifos are written into, never replaced.
  if (same_regular_file(output, input))
    fail("{} '{}' is the file {} reads ('{}'): writing it would destroy the input; choose another path", output_option,
         output, input_option, input);
}

int output_descriptor(const std::string& path) {
  try {
    return path.empty() ? -1 : descriptor_of_name(resolved_target(path));
  } catch (const Error&) {  // a loop of links: no descriptor; the write will say why
    return -1;
  }
}

void write_file_atomic(const std::string& path, std::span<const std::string_view> pieces) {
  if (path.empty()) fail("cannot write a file with an empty name");
  const std::string real = resolved_target(path);
  if (const int fd = descriptor_of_name(real); fd >= 0) return write_into_descriptor(path, fd, pieces);
  struct stat st {};
  if (::stat(real.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) fail("cannot write '{}': it is a directory, not a file", path);
    if (!S_ISREG(st.st_mode)) return write_into_special_file(path, real, pieces);
  }
  write_regular_file_atomic(path, real, pieces);
}

std::string_view file_type_name(unsigned mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a fifo";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return S_ISREG(mode) ? "a regular file" : "a special file";
}

int open_regular_file(const std::string& path) {
  auto refuse = [&](unsigned mode) {
    if (S_ISDIR(mode)) fail("cannot read '{}': it is a directory, not a file", path);
    fail("cannot read '{}': not a regular file ({}); give a file", path, file_type_name(mode));
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOENT) fail("cannot read '{}': no such file", path);
    fail("cannot read '{}': {}", path, errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) refuse(st.st_mode);
  // Non-blocking, in case a fifo took the file's place since the stat; for a regular file the flag changes nothing.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) fail("cannot read '{}': no such file", path);
    fail("cannot read '{}': {}", path, errno_text(err));
  }
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot read '{}': {}", path, errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    refuse(st.st_mode);
  }
  return fd;
}

std::string read_file(const std::string& path, size_t max_bytes, double held_per_byte) {
  const int fd = open_regular_file(path);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};

  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    fail("cannot read '{}': {}", path, errno_text(err));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    fail("cannot read '{}': it holds {} bytes, above the limit of {} bytes", path, st.st_size, max_bytes);
  require_memory(held_per_byte * static_cast<double>(st.st_size),
                 fmt::format("reading '{}' ({})", path, bytes_text(static_cast<double>(st.st_size))),
                 "free memory, or give a smaller file");

  // Read to end of file (a file that grows while it is read stays within the limit).
  std::string out;
  out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      fail("cannot read '{}': {}", path, errno_text(err));
    }
    if (n == 0) break;
    if (out.size() + static_cast<size_t>(n) > max_bytes)
      fail("cannot read '{}': it holds more than the limit of {} bytes", path, max_bytes);
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

namespace {

// The process holding a flock on the file with this device and inode, from /proc/locks
// ("1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF"); 0 when none is listed.
long flock_holder(dev_t dev, ino_t ino) {
  std::FILE* f = std::fopen("/proc/locks", "re");
  if (!f) return 0;
  char line[512];
  long pid = 0;
  const std::string where = fmt::format("{:02x}:{:02x}:{} ", major(dev), minor(dev), ino);
  while (pid == 0 && std::fgets(line, sizeof line, f)) {
    const std::string_view l(line);
    if (l.find("FLOCK") == std::string_view::npos) continue;
    const size_t at = l.find(where);
    if (at == std::string_view::npos) continue;
    size_t end = at;  // the pid is the number before the device
    while (end > 0 && l[end - 1] == ' ') --end;
    size_t begin = end;
    while (begin > 0 && l[begin - 1] >= '0' && l[begin - 1] <= '9') --begin;
    if (begin < end) pid = std::strtol(std::string(l.substr(begin, end - begin)).c_str(), nullptr, 10);
  }
  std::fclose(f);
  return pid;
}

}  // namespace

bool is_run_directory(const std::string& dir) {
  struct stat st {};
  const std::string d = dir.empty() ? std::string(".") : dir;
  if (::stat((d + "/checkpoint.safetensors").c_str(), &st) == 0) return true;
  // A run that has not written its first checkpoint yet holds the directory's lock; reading /proc/locks takes none.
  return ::stat(d.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && flock_holder(st.st_dev, st.st_ino) != 0;
}

void refuse_replacing_run_files(const std::string& path, std::string_view option, const std::string& own_run_dir) {
  namespace fs = std::filesystem;
  if (path.empty()) return;
  const std::string real = resolved_target(path);
  struct stat st {};
  if (::stat(real.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;  // a new file, or one written into
  const fs::path parent = fs::path(real).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  struct stat d {
  }, own{};  // the command's own run directory first: two stats, where the other reads /proc/locks
  if (!own_run_dir.empty() && ::stat(dir.c_str(), &d) == 0 && ::stat(own_run_dir.c_str(), &own) == 0 &&
      d.st_dev == own.st_dev && d.st_ino == own.st_ino)
    return;
  if (!is_run_directory(dir)) return;
  // Named as a reader would (made/x/../y is made/y); the checks above use the path itself.
  const std::string through =
      real == path ? std::string()
                   : fmt::format(" (through a symbolic link, '{}')", fs::path(real).lexically_normal().string());
  fail(
      "{} '{}'{} is a file of the run in '{}': it would be replaced; write it outside the run's directory, or "
      "remove the file first",
      option, path, through, parent.empty() ? std::string(".") : parent.lexically_normal().string());
}

DirectoryLock::DirectoryLock(const std::string& dir, std::string_view advice) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    fail("cannot lock the directory '{}': {}", dir, errno_text(err));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    struct stat st {};
    const long pid = ::fstat(fd, &st) == 0 ? flock_holder(st.st_dev, st.st_ino) : 0;
    ::close(fd);
    if (err != EWOULDBLOCK) fail("cannot lock the directory '{}': {}", dir, errno_text(err));
    fail("'{}' is in use by {}: one run writes a directory at a time; {}", dir,
         pid > 0 ? fmt::format("process {}", pid) : std::string("another process"), advice);
  }
  fd_ = fd;
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the lock
}

DirectoryLock& DirectoryLock::operator=(DirectoryLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

std::string shared_file(std::string_view relative) {
  namespace fs = std::filesystem;
  std::vector<fs::path> folders;
  if (const char* dir = std::getenv("TAPEGRAD_SHARE_DIR"); dir && *dir) folders.emplace_back(dir);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    folders.push_back(exe.parent_path().parent_path() / "share" / "tapegrad");
    folders.push_back(exe.parent_path() / "share" / "tapegrad");
  }
  std::string looked;
  for (const fs::path& folder : folders) {
    const fs::path file = folder / relative;
    if (fs::is_regular_file(file, ec)) return file.lexically_normal().string();
    looked += (looked.empty() ? "" : ", ") + file.lexically_normal().string();
  }
  fail(
      "cannot find tapegrad's {}: looked in {} (set TAPEGRAD_SHARE_DIR to the folder that holds it, "
      "PREFIX/share/tapegrad when installed)",
      relative, looked.empty() ? std::string("no place: /proc/self/exe cannot be read") : looked);
}

}  // namespace tapegrad
