// The fuzz targets' bodies on every input kept in the repository: the seed corpus of each target and every input a
// fuzzer once found a crash with (fuzz/regressions/<target>/). tools/fuzz.sh runs the fuzzers themselves.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "fuzz/fuzz_targets.hpp"
#include "training_test_util.hpp"
#include "test_paths.hpp"

namespace {

using Target = int (*)(const uint8_t*, size_t);

// Runs every file under fuzz/<dir>/<target>/ through the target; returns how many there were.
size_t replay(const char* dir, const char* target, Target run) {
  const std::filesystem::path root = std::filesystem::path(TAPEGRAD_SOURCE_DIR) / "fuzz" / dir / target;
  if (!std::filesystem::exists(root)) return 0;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(root))
    if (e.is_regular_file()) files.push_back(e.path());
  for (const auto& f : files) {
    CAPTURE(f.string());
    const std::string bytes = tapegrad::testing::slurp(f.string());
    CHECK(run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()) == 0);
  }
  return files.size();
}

}  // namespace

TEST_CASE("the fuzz targets run clean on their seed corpus and on every input that once crashed them") {
  struct {
    const char* name;
    Target run;
  } targets[] = {{"checkpoint", tapegrad::fuzz::checkpoint_input},
                 {"config", tapegrad::fuzz::config_input},
                 {"text", tapegrad::fuzz::text_input},
                 {"formula", tapegrad::fuzz::formula_input}};
  for (const auto& t : targets) {
    const std::string name = t.name;
    CAPTURE(name);
    const size_t seeds = replay("corpus", t.name, t.run);
    const size_t regressions = replay("regressions", t.name, t.run);
    CHECK(seeds >= 3);
    MESSAGE(name, ": ", seeds, " seeds and ", regressions, " regression inputs");
  }
}

TEST_CASE("regression: a JSON number out of range in a checkpoint header is a tapegrad error, not another exception") {
  // Found by fuzz_checkpoint: nlohmann's reader throws out_of_range (not parse_error) for 1e30848.
  const std::string header = R"({"a":{"dtype":"F32","shape":[],"data_offsets":[0,1e30848]}})";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  file += header;
  CHECK(tapegrad::fuzz::checkpoint_input(reinterpret_cast<const uint8_t*>(file.data()), file.size()) == 0);
}
