// An op's rules checked inside a doctest test case, for ops written against the installed package:
//
//   #include <doctest/doctest.h>
//   #include <tapegrad/checker/doctest.hpp>
//
//   TEST_CASE("my ops' rules") { tapegrad::testing::check_gradients(my_ops()); }   // a sheet function's ops
//   TEST_CASE("softsign's rules") { tapegrad::testing::check_gradients(registry, "softsign", 1); }
//
// Each op's every case is checked to first order and, by default, second (checker/testing.hpp); a failure is a
// failed doctest check at the line that called check_gradients, whose message is each failing report with its
// diagnosis first. Header-only, so that the library itself does not depend on doctest.
#pragma once

#include <doctest/doctest.h>

#include <source_location>
#include <span>
#include <string_view>

#include "../ops/registry.hpp"
#include "testing.hpp"

namespace tapegrad::testing {

inline void check_gradients(const OpSheet& op, int order = 2, const GradcheckOptions& opt = {},
                            std::source_location at = std::source_location::current()) {
  const std::string failures = gradient_failures(op, order, opt);
  if (!failures.empty()) ADD_FAIL_CHECK_AT(at.file_name(), static_cast<int>(at.line()), failures);
}

inline void check_gradients(std::span<const OpSheet> ops, int order = 2, const GradcheckOptions& opt = {},
                            std::source_location at = std::source_location::current()) {
  for (const OpSheet& op : ops) check_gradients(op, order, opt, at);
}

inline void check_gradients(const Registry& registry, std::string_view name, int order = 2,
                            const GradcheckOptions& opt = {},
                            std::source_location at = std::source_location::current()) {
  const OpSheet* op = registry.find(name);
  if (op == nullptr)
    ADD_FAIL_CHECK_AT(at.file_name(), static_cast<int>(at.line()), "no op '" << name << "' in the registry");
  else check_gradients(*op, order, opt, at);
}

}  // namespace tapegrad::testing
