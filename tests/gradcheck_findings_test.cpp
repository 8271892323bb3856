// The kinds of finding as sheets (checker/finding_sheet.hpp): one file of checker/findings/ per kind, named by its
// key; every built-in handle (Finding::scale, ...) has a sheet; keys, printed names and pass ranks are each used once;
// where a sheet says its kind is found, those files exist.
#include <doctest/doctest.h>

#include <filesystem>
#include <regex>
#include <set>
#include <string>

#include "checker/finding_sheet.hpp"
#include "test_paths.hpp"

using namespace tapegrad;
namespace fs = std::filesystem;

TEST_CASE("findings: every built-in handle has a sheet, in a file of checker/findings/ named by its key") {
  const Finding handles[] = {Finding::not_finite,
                             Finding::zero,
                             Finding::nonlinear,
                             Finding::sign,
                             Finding::scale,
                             Finding::transposed_jacobian,
                             Finding::transposed_input,
                             Finding::transposed_output,
                             Finding::transposed_term,
                             Finding::term_sign,
                             Finding::wrong_axis,
                             Finding::masked_positions,
                             Finding::diagonal,
                             Finding::one_row,
                             Finding::per_row_term,
                             Finding::unexplained,
                             Finding::radial,
                             Finding::kink,
                             Finding::tolerance,
                             Finding::one_input,
                             Finding::jvp_only,
                             Finding::vjp_only,
                             Finding::adjoint,
                             Finding::consistent,
                             Finding::overwrites,
                             Finding::no_jvp,
                             Finding::term_dropped,
                             Finding::term_added,
                             Finding::term_factor,
                             Finding::wrong_value,
                             Finding::ignores_cotangent,
                             Finding::per_row_factor,
                             Finding::elementwise,
                             Finding::first_order,
                             Finding::hessian_block,
                             Finding::asymmetric,
                             Finding::saved_in_forward,
                             Finding::precision_defect,
                             Finding::not_a_function,
                             Finding::rounds_inside,
                             Finding::shifted,
                             Finding::edge,
                             Finding::against_the_answer};
  for (const Finding f : handles) {
    CAPTURE(f.key());
    CHECK(finding_sheet(f) != nullptr);
  }
  const fs::path root(TAPEGRAD_SOURCE_DIR);
  std::set<std::string_view> keys, titles;
  std::set<int> ranks;
  for (const FindingSheet& s : builtin_findings()) {
    CAPTURE(s.kind.key());
    CHECK(keys.insert(s.kind.key()).second);
    CHECK(titles.insert(s.title).second);
    CHECK(fs::exists(root / "checker" / "findings" / (std::string(s.kind.key()) + ".cpp")));
    CHECK(std::regex_match(std::string(s.kind.key()), std::regex("[a-z0-9]+(_[a-z0-9]+)*")));
    CHECK(!s.meaning.empty());
    CHECK(!s.found_by.empty());
    for (const RankedPass& p : s.passes) {
      CHECK(static_cast<bool>(p.run));
      CHECK_MESSAGE(ranks.insert(p.rank).second, "two passes share rank " << p.rank);
    }
    CHECK(finding_named(s.kind.key()) == s.kind);
    CHECK(finding_named(s.title) == s.kind);
  }
  CHECK(keys.size() == std::size(handles));
  CHECK(!finding_named("no_such_kind"));
}

TEST_CASE("findings: the files a sheet says its kind is found in exist") {
  const fs::path root(TAPEGRAD_SOURCE_DIR);
  const std::regex path(R"((checker|python)/[A-Za-z0-9_/]+\.(cpp|hpp|py))");
  for (const FindingSheet& s : builtin_findings()) {
    CAPTURE(s.kind.key());
    const std::string text(s.found_by);
    for (auto m = std::sregex_iterator(text.begin(), text.end(), path); m != std::sregex_iterator(); ++m)
      CHECK_MESSAGE(fs::exists(root / m->str()), m->str());
  }
}
