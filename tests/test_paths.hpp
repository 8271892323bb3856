// Where a test finds the source tree and the tapegrad program. The two paths are defined once, in a source file the
// build writes (tests/CMakeLists.txt, test_paths.cpp), not as a compile definition on every test's objects: a second
// clone of the repository, whose paths differ, then compiles the tests from the cache.
#pragma once

namespace tapegrad::testing {

extern const char* const kSourceDir;  // the source tree's root
extern const char* const kCliPath;    // the built tapegrad program

}  // namespace tapegrad::testing

#define TAPEGRAD_SOURCE_DIR (::tapegrad::testing::kSourceDir)
#define TAPEGRAD_CLI (::tapegrad::testing::kCliPath)
