// The kind of finding "consistent": VJP and JVP fail but agree with each other: one derivation shared by both is
// wrong.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet consistent_finding() {
  return {
      .kind = Finding::consistent,
      .title = "consistent",
      .meaning = "VJP and JVP fail but agree with each other: one derivation shared by both is wrong",
      .found_by = "`checker/diagnose.cpp` (which_rule_and_input)",
      .section = "docs/gradchecking.md#consistent-both-rules-wrong-the-same-way",
  };
}

}  // namespace tapegrad
