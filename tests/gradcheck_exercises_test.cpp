// docs/exercises.txt through checker/formulas/exercise.hpp: every answer holds, and every planted wrong answer fails
// with the kind of finding the file names for it, never with "no known kind".
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "checker/formulas/exercise.hpp"
#include "test_paths.hpp"

using namespace tapegrad;

namespace {

std::vector<Exercise> the_exercises() {
  const std::string path = std::string(TAPEGRAD_SOURCE_DIR) + "/docs/exercises.txt";
  std::ifstream in(path);
  REQUIRE(in);
  std::stringstream text;
  text << in.rdbuf();
  return parse_exercises(text.str(), "docs/exercises.txt");
}

const Finding* kind_of(const std::string& key) {
  for (const Finding& f : all_findings())
    if (f.key() == key) return &f;
  return nullptr;
}

// The answer's lines with the slip's rule in place of the answer's for the same rule.
std::vector<std::string> with_slip(const Exercise& e, const Exercise::Slip& s) {
  const std::string rule = s.rule.substr(0, s.rule.find('='));
  std::vector<std::string> lines;
  for (const std::string& a : e.answer)
    if (a.substr(0, a.find('=')) != rule) lines.push_back(a);
  lines.push_back(s.rule);
  return lines;
}

}  // namespace

TEST_CASE("there are at least 20 exercises over at least 5 chapters, each with two planted wrong answers or more") {
  const std::vector<Exercise> all = the_exercises();
  std::set<std::string> chapters;
  for (const Exercise& e : all) chapters.insert(e.chapter);
  CHECK(all.size() >= 20);
  CHECK(chapters.size() >= 5);
  for (const Exercise& e : all) {
    CAPTURE(e.name);
    CHECK(e.slips.size() >= 2);
    CHECK_FALSE(e.task.empty());
  }
}

TEST_CASE("every exercise's answer holds") {
  for (const Exercise& e : the_exercises()) {
    CAPTURE(e.name);
    const GradcheckReport r = check_exercise(e, e.answer);
    CHECK_MESSAGE(r.passed, r.str());
  }
}

TEST_CASE("every planted wrong answer fails, named with its kind, and never with no known kind") {
  for (const Exercise& e : the_exercises())
    for (const Exercise::Slip& s : e.slips) {
      CAPTURE(e.name);
      CAPTURE(s.rule);
      const GradcheckReport r = check_exercise(e, with_slip(e, s));
      CHECK_FALSE(r.passed);
      const Finding* kind = kind_of(s.kind);
      REQUIRE_MESSAGE(kind, "no kind of finding has the key " << s.kind);
      CHECK_MESSAGE(r.has(*kind), r.str());
      CHECK_FALSE_MESSAGE(r.has(Finding::unexplained), r.str());
      for (const Diagnosis& d : r.diagnoses)  // an edit's rule put right is the answer: the hint leaves it out
        CHECK_MESSAGE((d.fix.empty() || d.message.find(d.fix) == std::string::npos), d.str());
    }
}

TEST_CASE("a wrong answer is pointed at where it departs from the answer, without the answer") {
  const std::vector<Exercise> all = the_exercises();
  const auto sigmoid =
      std::find_if(all.begin(), all.end(), [](const Exercise& e) { return e.name == "sigmoid-attention"; });
  REQUIRE(sigmoid != all.end());
  // σ′ written σ: the factor (1 − a) dropped
  const std::vector<std::string> dropped{"vjp s = a * matmul(g, transpose(v, 0, 1))"};
  const GradcheckReport r = check_exercise(*sigmoid, dropped);
  const Diagnosis* d = r.find(Finding::against_the_answer, "s");
  REQUIRE(d);
  CHECK(d->message.find("the slip is in `a` (column 1 of your vjp s): a factor is missing there") != std::string::npos);
  CHECK(d->message.find("1 - a") == std::string::npos);
  // the checker names the slip by itself too, by an edit of the rule, and the hint does not show the rule edited
  const Diagnosis* edit = r.find(Finding::term_factor, "s");
  REQUIRE_MESSAGE(edit, r.str());
  CHECK(edit->message.find("the derivative of `sigmoid(s)` (let a) is written `a`") != std::string::npos);
  CHECK(edit->message.find(" → ") == std::string::npos);
  CHECK(edit->message.find("1 - a") == std::string::npos);
  // a rule written otherwise than the answer but right holds, and is not compared with it
  const std::vector<std::string> other{"vjp s = matmul(g, transpose(v, 0, 1)) * (a - a * a)"};
  CHECK(check_exercise(*sigmoid, other).passed);
}

TEST_CASE("an exercise file is read line by line; anything else is refused naming the line") {
  CHECK_THROWS_WITH_AS(parse_exercises("exercise e\nchapter 1\nforward x\nhint no\n", "f.txt"),
                       doctest::Contains("f.txt:4: unknown line 'hint'"), Error);
  CHECK_THROWS_WITH_AS(parse_exercises("exercise e\nchapter 1\ninput x: 3\nforward x\n", "f.txt"),
                       doctest::Contains("needs a chapter, a forward and an answer"), Error);
  const std::vector<Exercise> one =
      parse_exercises("exercise e\nchapter 1\ntask a\n  b\ninput x: 3\nforward x * x\nanswer vjp x = 2 * x * g\n", "f");
  REQUIRE(one.size() == 1);
  CHECK(one[0].task == "a b");
  CHECK_THROWS_WITH_AS(exercise_claim(one[0], std::vector<std::string>{"vjp z = g"}),
                       doctest::Contains("it has no input 'z'"), Error);
}
