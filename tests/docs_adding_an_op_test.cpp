// docs/adding-an-op.md, built as written. Its code block marked "adding_an_op" is the whole of an op, the file
// ops/softsign.cpp: cmake/extract_guide_code.cmake writes it into an ops/ folder of the build, which is compiled beside
// tapegrad's own ops into the library tapegrad_guide, whose builtin_ops() the build generates from the sheet
// functions of all of them, as for tapegrad itself (tests/CMakeLists.txt). This program links that library: the
// guide's op is built in, passes `gradcheck --op softsign` to first and second order as `tapegrad gradcheck` runs it,
// and is called by name. The guide's quote of ops/row_normalize.cpp's sheet is that file's text.
#include <doctest/doctest.h>

#include <cctype>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checker/cli.hpp"
#include "checker/second_order.hpp"
#include "ops/all_ops.hpp"
#include "ops/ops.hpp"
#include "ops/registry.hpp"
#include "test_paths.hpp"

using namespace tapegrad;

namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string without_spaces(const std::string& s) {
  std::string t;
  for (const char c : s)
    if (!std::isspace(static_cast<unsigned char>(c))) t += c;
  return t;
}

}  // namespace

TEST_CASE("the guide's op, compiled into ops/, is built in and passes the gradchecker to first and second order") {
  const OpSheet* op = builtin_registry().find("softsign");
  REQUIRE_MESSAGE(op != nullptr, "the guide's sheet function is not in the generated builtin_ops()");
  CHECK(op->family == "softsign");
  CHECK(!op->forward.empty());
  CHECK(!op->vjp.empty());
  CHECK(!op->jvp.empty());
  CHECK(!op->second_order.empty());
  REQUIRE(!op->cases.empty());
  // Beside tapegrad's own ops, one more than they are.
  CHECK(builtin_registry().find("row_normalize") != nullptr);
  CHECK(builtin_registry().find("attention") != nullptr);

  // `gradcheck --op softsign` and `--order 2`, as `tapegrad gradcheck` runs them on its registry.
  for (const char* order : {"1", "2"}) {
    CAPTURE(order);
    const char* argv[] = {"test_guide", "gradcheck", "--op", "softsign", "--order", order};
    CHECK(gradcheck_main(builtin_registry(), 6, argv) == 0);
  }
  // The second order is checked, not skipped: the op has a second-order rule.
  for (const GradcheckCase& c : op->cases) {
    CAPTURE(c.name);
    const GradcheckReport second = gradcheck_second_order(c, {}, op->name);
    REQUIRE_FALSE(second.checks.empty());
    CHECK_FALSE(second.checks[0].skipped);
    CHECK_MESSAGE(second.passed(), second.str());
  }

  // By name, as Tape.op from Python calls it: y = x/(1 + |x|).
  Tape tape;
  const std::vector<Var> x{tape.leaf(Tensor::from<double>({3}, {-3.0, 0.0, 1.0}))};
  const Var y = builtin_registry().call("softsign", x, OpArgs{});
  CHECK(y.value().data<double>()[0] == doctest::Approx(-0.75));
  CHECK(y.value().data<double>()[1] == 0.0);
  CHECK(y.value().data<double>()[2] == doctest::Approx(0.5));
}

TEST_CASE("the guide's quote of ops/row_normalize.cpp's sheet is that file's text") {
  const std::string guide = read(std::string(TAPEGRAD_SOURCE_DIR) + "/docs/adding-an-op.md");
  const std::string marker = "<!-- quoted by tests: ops/row_normalize.cpp -->\n```cpp\n";
  const size_t at = guide.find(marker);
  REQUIRE(at != std::string::npos);
  const size_t start = at + marker.size(), end = guide.find("\n```", start);
  REQUIRE(end != std::string::npos);
  const std::string quote = guide.substr(start, end - start);
  CHECK(quote.starts_with("std::vector<OpSheet> row_normalize_ops() {"));
  const std::string file = read(std::string(TAPEGRAD_SOURCE_DIR) + "/ops/row_normalize.cpp");
  CHECK_MESSAGE(without_spaces(file).find(without_spaces(quote)) != std::string::npos,
                "docs/adding-an-op.md quotes a sheet of row_normalize that ops/row_normalize.cpp does not have: copy "
                "the file's row_normalize_ops() into the guide");
}
