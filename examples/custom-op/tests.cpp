// custom_op_tests: this project's ops checked in its own test suite, as doctest test cases (checker/doctest.hpp).
// A failing check is reported at the line that made it, with each failing report's diagnosis before its table.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <tapegrad/checker/doctest.hpp>

#include "ops/ops.hpp"

using tapegrad::testing::check_gradients;

TEST_CASE("rms_norm's and softsign's rules hold, to second order") {
  check_gradients(rms_norm_ops());
  check_gradients(softsign_ops());
}

// The VJP claimed with ρ held constant drops a term of each row: this test case fails, naming that term, and
// should_fail() makes its failure the expected outcome.
TEST_CASE("the VJP claimed with a constant ρ is rejected" * doctest::should_fail()) {
  check_gradients(rms_norm_claims(), 1);
}
