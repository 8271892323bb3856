// Whole-file reads and crash-safe whole-file writes, for checkpoints, logs and plots.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace tapegrad {

// Replaces the file at `path` by `bytes` so that a reader (or a crash at any moment) sees either the old
// content or the new one, never a mix: the bytes go to a temporary file in the same directory, which is
// fsynced, renamed over the target, and then the directory is fsynced so that the rename itself is durable.
// A new file gets mode 0644; an existing one keeps its mode. On any failure the temporary is removed and an
// Error names the path and the system's reason.
void write_file_atomic(const std::string& path, std::string_view bytes);
// The same for a file made of `pieces` one after the other (no copy of them is made).
// The one writer of the program's files: every file tapegrad writes goes through it.
//   - a symbolic link is followed to the file it names, which is replaced (the link stays a link);
//   - /dev/stdout, /dev/stderr, /dev/fd/N and /proc/self/fd/N (or a link to one) are written through the
//     descriptor the process holds: into a pipe, or appended to a file opened with `>>`, never renamed over;
//   - an existing file that is not a regular one (a fifo, /dev/null) is written into, never renamed over, since
//     replacing it would destroy it; a fifo that has no reader within a second is refused rather than waited for;
//   - an empty path or a directory is refused.
void write_file_atomic(const std::string& path, std::span<const std::string_view> pieces);

// The descriptor write_file_atomic writes `path` through (1 for /dev/stdout or a link to it), or −1 for a file.
int output_descriptor(const std::string& path);

// Refuses, naming both options, an output path that is the same regular file as an input the command reads
// (`evaluate --checkpoint c --hvp-out c` would destroy the checkpoint); paths that do not exist yet pass.
void refuse_input_as_output(const std::string& output, std::string_view output_option, const std::string& input,
                            std::string_view input_option);

// Whether `a` and `b` (symbolic links followed) are one existing regular file: the same device and inode, whatever
// the names (a link, a hard link, "./x" and "x").
bool same_regular_file(const std::string& a, const std::string& b);

// Whether `dir` holds a run: a checkpoint.safetensors, or a run's lock on it (DirectoryLock, seen in /proc/locks).
bool is_run_directory(const std::string& dir);

// Refuses, naming `option`, the path and the run directory, a write to `path` that would replace an existing file
// (symbolic links followed) in a run directory other than `own_run_dir` (empty: the command has none): a command
// never replaces a run's checkpoint, logs or plots, nor a run another's. A new file there, or a fifo or device
// (written into, never replaced), passes.
void refuse_replacing_run_files(const std::string& path, std::string_view option, const std::string& own_run_dir = {});

// The whole content of a regular file (open_regular_file). Throws an Error naming the path if it does not exist,
// is not a regular file, cannot be read, or holds more than max_bytes (it is sized before it is read). Before it is
// read, the memory the caller will hold for it, its size times held_per_byte (2 for a checkpoint: the bytes and the
// tensors copied out of them), is checked against what the system has available (require_memory,
// inspect/process_memory.hpp).
std::string read_file(const std::string& path, size_t max_bytes, double held_per_byte = 1);

// Opens an input for reading: a regular file (through symbolic links) and nothing else. A fifo, a device
// (/dev/zero, /dev/stdin, a terminal), a socket or a directory is refused, by an Error naming the path and "not a
// regular file", before it is opened: opening a fifo with no writer waits for one for ever, and a device's size
// cannot be known before it is read. The open itself does not block (a fifo swapped in after the check is refused
// too). Returns the descriptor, which the caller closes.
int open_regular_file(const std::string& path);
// "a fifo", "a character device", "a directory", ... for a stat mode (st_mode), for messages.
std::string_view file_type_name(unsigned mode);

// One writer per directory: an exclusive advisory lock (flock) on the directory itself, held while the object
// lives and released by the kernel when the process ends, however it ends (no lock file to go stale). A second
// locker is refused at once, naming the process that holds the lock (from /proc/locks) and `advice`.
class DirectoryLock {
 public:
  DirectoryLock() = default;
  DirectoryLock(const std::string& dir, std::string_view advice);
  ~DirectoryLock();
  DirectoryLock(DirectoryLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  DirectoryLock& operator=(DirectoryLock&& other) noexcept;
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// A file tapegrad ships beside its program (the bundled text, docs/derivations.md, the PyTorch scripts), by its path
// under the share folder: shared_file("data/tinyshakespeare.txt"). The share folder is found from the running
// executable, so an installed copy, a moved prefix and the build tree all work, and no source tree is needed:
//   TAPEGRAD_SHARE_DIR, if set (an override);
//   <the executable's folder>/../share/tapegrad   an installed tapegrad (PREFIX/bin/tapegrad), and the test
//                                                  programs of a build (BUILD/tests/...);
//   <the executable's folder>/share/tapegrad      the build tree (BUILD/tapegrad; CMake links BUILD/share/tapegrad's
//                                                  entries to the sources).
// Throws an Error naming the file and every place looked in when none holds it.
std::string shared_file(std::string_view relative);

}  // namespace tapegrad
