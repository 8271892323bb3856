// Exercises: a forward given, the rule a learner derives written as formulas (a claim's vjp or jvp lines), checked
// by the gradchecker as a claim is (checker/formulas/claim.hpp), with the exercise's answer kept to point at the slip.
// docs/exercises.txt holds docs/learn.md's, one block each:
//   exercise NAME           letters, digits, -
//   chapter TITLE           the chapter of docs/learn.md it belongs to
//   task TEXT               what to derive (indented lines continue a line)
//   input, let, forward     as in a claims file (docs/claims/README.md)
//   answer vjp X = F        a right answer, one line per rule asked (answer jvp F for a JVP)
//   slip KIND: vjp X = F    a typical wrong answer, and the kind of finding its check names (the tests hold it)
// `tapegrad exercise NAME --vjp "X = F"` checks a learner's rule (tools/exercise_command.cpp).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../gradcheck.hpp"
#include "claim.hpp"

namespace tapegrad {

struct Exercise {
  std::string name, chapter, task, where;  // where: "docs/exercises.txt:12"
  ClaimText given;                         // its inputs, lets and forward; no rule
  std::vector<std::string> answer;         // rule lines: "vjp x = F", "jvp F"
  struct Slip {
    std::string kind;  // the key of the finding its check names
    std::string rule;  // one rule line, in place of the answer's for the same rule
  };
  std::vector<Slip> slips;
};

// The exercises of a file's text; throws Error naming the line of anything else (or an exercise without a forward,
// an answer, or a chapter).
std::vector<Exercise> parse_exercises(std::string_view text, std::string_view path);

// The claim the learner's rule lines ("vjp x = F", "jvp F") make with the exercise's forward; throws Error for a
// line that is neither, or a vjp of an input the exercise does not have.
ClaimText exercise_claim(const Exercise& e, std::span<const std::string> rules);

// The learner's rules checked as the claim above. Where a rule fails and differs from the answer's at one place in
// its formula, such that the rule holds once that part is written as the answer writes it, the report names that
// part (kind against_the_answer: checker/findings/against_the_answer.cpp), in place of "no known kind".
GradcheckReport check_exercise(const Exercise& e, std::span<const std::string> rules, const GradcheckOptions& opt = {});

}  // namespace tapegrad
