// The kind of finding "against the answer": an exercise's rule (docs/exercises.txt) that fails and differs from the
// exercise's answer at one place in its formula, such that it holds once that part is written as the answer writes
// it. The message names the part and what changes there (a factor or a term missing or too many, the sign, another
// value) without giving the answer away; `tapegrad exercise NAME --solution` shows it.
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet against_the_answer_finding() {
  return {
      .kind = Finding::against_the_answer,
      .title = "against the answer",
      .meaning =
          "an exercise's rule fails and differs from the exercise's answer at one place in its formula: the rule "
          "holds once that part is right (a factor or a term missing or too many, the sign, another value)",
      .found_by = "`checker/formulas/exercise.cpp` (tapegrad exercise: a learner's rule against the hidden answer)",
      .section = "docs/learn.md#exercises",
      .explains = true,
  };
}

}  // namespace tapegrad
