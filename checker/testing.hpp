// Gradchecks as a test's assertions, for any test framework: an op's every case checked to first and second order,
// and what the failing ones say, each with its diagnosis before its table (checker/doctest.hpp makes a doctest
// check of it).
//
//   const std::string failures = tapegrad::testing::gradient_failures(*registry.find("my_op"));
//   EXPECT_TRUE(failures.empty()) << failures;   // or any framework's assertion with a message
#pragma once

#include <string>

#include "../ops/sheet.hpp"
#include "gradcheck.hpp"

namespace tapegrad::testing {

// Every case of op checked to first order (checker/gradcheck.hpp) and, where order is 2, to second
// (checker/second_order.hpp), at opt: the reports that did not pass, each with its diagnosis first
// (GradcheckReport::Order::diagnosis_first), one after another; "" when every check passed.
std::string gradient_failures(const OpSheet& op, int order = 2, const GradcheckOptions& opt = {});

}  // namespace tapegrad::testing
