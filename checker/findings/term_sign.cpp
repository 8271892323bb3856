// The kind of finding "sign of a term": one term of the rule has the wrong sign: the formulas agree once a + b
// becomes a − b, or −u becomes u.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet term_sign_finding() {
  return {
      .kind = Finding::term_sign,
      .title = "sign of a term",
      .meaning =
          "one term of the rule has the wrong sign: the formulas agree once a + b becomes a − b, or −u "
          "becomes u",
      .found_by =
          "`checker/formulas/edits.cpp`; from Python, e = −2·(one edge's term) of a Function's forward "
          "(`python/tapegrad/_forward.py`)",
      .section = "docs/gradchecking.md#sign-of-a-term",
      .explains = true,
  };
}

}  // namespace tapegrad
