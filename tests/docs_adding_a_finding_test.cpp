// docs/adding-a-finding.md, built as written. Its code block marked "adding_a_finding" is the whole of a kind of
// finding, the file checker/findings/reversed.cpp: cmake/extract_guide_code.cmake writes it into a checker/findings/
// folder of the build, which is compiled beside tapegrad's own kinds into the library tapegrad_guide, whose
// builtin_findings() the build generates from the sheet functions of all of them (tests/CMakeLists.txt). The block
// marked "adding_a_finding_test" is the guide's test, included here as written; the report line the guide quotes is
// the one its planted slip gets.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "checker/claimed.hpp"
#include "checker/finding_sheet.hpp"
#include "checker/gradcheck.hpp"
#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

#include "adding_a_finding_test.inc"

TEST_CASE("the guide's kind is built in beside tapegrad's own, and the guide quotes its report") {
  const FindingSheet* sheet = finding_sheet(Finding{"reversed"});
  REQUIRE_MESSAGE(sheet != nullptr, "the guide's sheet function is not in the generated builtin_findings()");
  CHECK(sheet->title == "reversed");
  CHECK(finding_sheet(Finding::per_row_term) != nullptr);
  CHECK(finding_kinds_table().find("| [reversed](adding-a-finding.md#the-slip) | `reversed` |") != std::string::npos);

  const GradcheckReport slip = gradcheck(exp_written_at(true), {random_tensor({3, 5}, 1)}, {"x"});
  const Diagnosis* d = slip.find(Finding{"reversed"}, "x");
  REQUIRE(d != nullptr);
  std::ifstream in(std::string(TAPEGRAD_SOURCE_DIR) + "/docs/adding-a-finding.md");
  std::ostringstream guide;
  guide << in.rdbuf();
  CHECK_MESSAGE(guide.str().find("    " + d->str() + "\n") != std::string::npos,
                "docs/adding-a-finding.md does not quote the report's line: " << d->str());
}
