// checker/testing.hpp and checker/doctest.hpp: an op's rules as a test's assertion, each failing report with its
// diagnosis before its table.
#include <doctest/doctest.h>

#include <string>

#include "checker/doctest.hpp"
#include "ops/ops.hpp"
#include "ops/pointwise.hpp"

using namespace tapegrad;

namespace {

// y = x², its derivative written −2x: a sign slip in both rules.
OpSheet wrong_square() {
  OpSheet op;
  op.name = "wrong_square";
  op.cases = {{"matrix", {{"x", {3, 4}}}, [](Tape&, std::span<const Var> x) {
                 return pointwise(
                     "wrong_square", x[0], [](auto v) { return v * v; }, [](auto v) { return -2 * v; },
                     [](auto v) { return -2 + 0 * v; });
               }}};
  return op;
}

}  // namespace

TEST_CASE("check_gradients passes ops whose rules hold, to second order, by registry and name or by sheet") {
  const Registry& registry = builtin_registry();
  testing::check_gradients(registry, "softmax");
  testing::check_gradients(registry, "layer_norm", 1);
  CHECK(testing::gradient_failures(*registry.find("row_normalize")).empty());
}

TEST_CASE("a wrong rule's failure reads the diagnosis first, then the table") {
  const std::string failures = testing::gradient_failures(wrong_square(), 1);
  CHECK(failures.rfind("wrong_square / matrix: FAILED\n  diagnosis:\n", 0) == 0);
  const size_t diagnosis = failures.find("[sign] x"), table = failures.find("  input    check");
  REQUIRE(diagnosis != std::string::npos);
  REQUIRE(table != std::string::npos);
  CHECK(diagnosis < table);
  CHECK(failures.find("vjp") != std::string::npos);
  CHECK_THROWS_WITH(testing::gradient_failures(wrong_square(), 3), "gradient_failures: order is 1 or 2, not 3");
}

TEST_CASE("an op registered without a case is a failure, not a pass") {
  OpSheet caseless;
  caseless.name = "caseless";
  const std::string failures = testing::gradient_failures(caseless);
  CHECK(failures.find("caseless: no gradcheck case") == 0);
}

TEST_CASE("check_gradients fails the test case that calls it" * doctest::should_fail()) {
  testing::check_gradients(wrong_square(), 1);
}

TEST_CASE("check_gradients fails for a name the registry does not have" * doctest::should_fail()) {
  testing::check_gradients(builtin_registry(), "no_such_op");
}
