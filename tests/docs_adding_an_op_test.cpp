// docs/adding-an-op.md, built as written: its marked code blocks (an element-wise op from f, f′ and f″ with its
// sheet, and the sheet of row_normalize) are extracted by cmake/extract_guide_code.cmake into adding_an_op_guide.cpp,
// compiled into this program; here the guide's ops are registered from its sheets and pass the gradchecker to first
// and second order.
#include <doctest/doctest.h>

#include <vector>

#include "checker/gradcheck.hpp"
#include "ops/registry.hpp"
#include "checker/second_order.hpp"

// The guide's sheet functions.
std::vector<tapegrad::OpInfo> softsign_ops();
std::vector<tapegrad::OpInfo> row_normalize_ops();

using namespace tapegrad;

TEST_CASE("the ops docs/adding-an-op.md registers pass the gradchecker, first and second order, as written") {
  const Registry registry{softsign_ops(), row_normalize_ops()};
  REQUIRE(registry.ops().size() == 2);
  for (const OpInfo& op : registry.ops()) {
    CAPTURE(op.name);
    CHECK(!op.forward.empty());
    CHECK(!op.vjp.empty());
    CHECK(!op.jvp.empty());
    CHECK(!op.second_order.empty());
    REQUIRE(!op.cases.empty());
    for (const GradcheckCase& c : op.cases) {
      CAPTURE(c.name);
      const GradcheckReport first = gradcheck(c, {}, op.name);
      CHECK_MESSAGE(first.passed, first.str());
      const GradcheckReport second = gradcheck_second_order(c, {}, op.name);
      CHECK_FALSE(second.checks.empty());
      CHECK_FALSE((!second.checks.empty() && second.checks[0].skipped));  // the op has a second-order rule
      if (!c.at_kink) CHECK_MESSAGE(second.passed(), second.str());
    }
  }
}
