// Whole-file reads and atomic writes: content, modes, and what a failed write leaves behind.
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/stat.h>

#include <csignal>
#include <string>

#include "engine/tensor.hpp"
#include "models/files.hpp"
#include "training_test_util.hpp"

using namespace tapegrad;
using tapegrad::testing::ScratchDir;

TEST_CASE("write_file_atomic writes, overwrites and leaves no temporary behind") {
  ScratchDir dir;
  std::string path = dir.file("out.bin");
  std::string bytes("a\0b\nc", 5);
  write_file_atomic(path, bytes);
  CHECK(read_file(path, 100) == bytes);
  write_file_atomic(path, "second");
  CHECK(read_file(path, 100) == "second");
  write_file_atomic(path, "");
  CHECK(read_file(path, 100).empty());
  CHECK(dir.entries() == std::vector<std::string>{"out.bin"});
}

TEST_CASE("write_file_atomic gives a new file mode 0644 and keeps an existing file's mode") {
  ScratchDir dir;
  std::string path = dir.file("f.txt");
  write_file_atomic(path, "x");
  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0644);
  REQUIRE(chmod(path.c_str(), 0600) == 0);
  write_file_atomic(path, "y");
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
}

TEST_CASE("write_file_atomic names the path and the reason when it cannot write") {
  ScratchDir dir;
  std::string missing_dir = dir.file("no/such/dir/f.txt");
  CHECK_ERROR_HAS(write_file_atomic(missing_dir, "x"), missing_dir, "No such file or directory");

  // Renaming over a directory fails after the temporary is complete: the temporary must go.
  std::string target_dir = dir.file("subdir");
  std::filesystem::create_directory(target_dir);
  CHECK_ERROR_HAS(write_file_atomic(target_dir, "x"), target_dir);
  CHECK(dir.entries() == std::vector<std::string>{"subdir"});
  CHECK_THROWS_AS(write_file_atomic(dir.path.string() + "/", "x"), Error);
}

TEST_CASE("a write that fails midway leaves the old file whole and no temporary") {
  ScratchDir dir;
  std::string path = dir.file("ckpt");
  write_file_atomic(path, "old content");
  // Cap the size of files this process may write, so that the write of the temporary fails with EFBIG.
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old_limit{};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
  rlimit capped = old_limit;
  capped.rlim_cur = 1000;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &capped) == 0);
  bool threw = false;
  std::string message;
  try {
    write_file_atomic(path, std::string(100000, 'n'));
  } catch (const Error& e) {
    threw = true;
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  CHECK(threw);
  CHECK(message.find(path) != std::string::npos);
  CHECK(message.find("too large") != std::string::npos);  // EFBIG: "File too large"
  CHECK(read_file(path, 100) == "old content");
  CHECK(dir.entries() == std::vector<std::string>{"ckpt"});
}

TEST_CASE("read_file refuses a missing file, a directory and a file above the limit") {
  ScratchDir dir;
  std::string missing = dir.file("missing.txt");
  CHECK_ERROR_HAS(read_file(missing, 10), missing, "no such file");
  CHECK_ERROR_HAS(read_file(dir.path.string(), 10), "is a directory");
  std::string big = dir.file("big.txt");
  write_file_atomic(big, std::string(11, 'x'));
  CHECK_ERROR_HAS(read_file(big, 10), big, "11 bytes", "limit of 10 bytes");
  CHECK(read_file(big, 11) == std::string(11, 'x'));
}
