// The kind of finding "zero": the analytic derivative is 0 everywhere: the rule never writes that input's gradient or
// tangent.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "checker/finding_sheet.hpp"
#include "checker/jacobian.hpp"

namespace tapegrad {

namespace {

using namespace gradcheck_detail;

// The rule gives 0 at every entry while y depends on x: nothing was written. The search ends.
bool nothing_written(JacobianSearch& s) {
  const JacobianView& v = s.v;
  if (!std::all_of(v.a.begin(), v.a.end(), [](double e) { return e == 0; })) return false;
  s.found.push_back(
      {Finding::zero, v.input, v.check,
       v.check == "hvp"
           ? fmt::format("H·t is 0 in {} for every direction of {}: the second-order term is missing (a rule that "
                         "adds nothing, or linear_in_inputs for an op whose VJP moves with {})",
                         v.y_name, v.input, v.input)
       : v.check == "vjp"
           ? fmt::format("the VJP leaves x̄ of {} at 0 everywhere while y depends on it: it never writes that "
                         "input's gradient",
                         v.input)
           : fmt::format("the JVP leaves ẏ at 0 for every tangent of {}: it never adds that input's term (an op "
                         "without a forward-mode rule records no_jvp(name) instead)",
                         v.input)});
  return true;
}

}  // namespace

FindingSheet zero_finding() {
  return {
      .kind = Finding::zero,
      .title = "zero",
      .meaning = "the analytic derivative is 0 everywhere: the rule never writes that input's gradient or tangent",
      .found_by =
          "its pass over a failing full Jacobian, in this file; in fast mode, from the projections "
          "(`checker/diagnose.cpp`)",
      .section = "docs/gradchecking.md#zero-not-finite",
      .passes = {{30, nothing_written}},
      .explains = true,
  };
}

}  // namespace tapegrad
