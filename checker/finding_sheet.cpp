// The built-in kinds of finding by their sheets (checker/findings/, listed by the build in builtin_findings()).
#include "checker/finding_sheet.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace tapegrad {

namespace {

const std::vector<FindingSheet>& sheets() {
  static const std::vector<FindingSheet> all = builtin_findings();
  return all;
}

}  // namespace

const FindingSheet* finding_sheet(Finding f) {
  const auto& all = sheets();
  const auto at = std::find_if(all.begin(), all.end(), [f](const FindingSheet& s) { return s.kind == f; });
  return at == all.end() ? nullptr : &*at;
}

std::optional<Finding> finding_named(std::string_view key_or_title) {
  for (const FindingSheet& s : sheets())
    if (s.kind.key() == key_or_title || s.title == key_or_title) return s.kind;
  return std::nullopt;
}

// A kind without a sheet prints as its key.
std::string_view finding_name(Finding f) {
  const FindingSheet* s = finding_sheet(f);
  return s ? s->title : f.key();
}

std::string_view finding_key(Finding f) { return f.key(); }

std::span<const Finding> all_findings() {
  static const std::vector<Finding> kinds = [] {
    std::vector<Finding> k;
    for (const FindingSheet& s : sheets()) k.push_back(s.kind);
    return k;
  }();
  return kinds;
}

void add_finding(GradcheckReport& report, Diagnosis d) {
  auto before_a_named_slip = [](Finding f) {
    const FindingSheet* s = finding_sheet(f);
    return s ? s->before_a_named_slip : BeforeANamedSlip::stays;
  };
  auto& all = report.diagnoses;
  const auto replaced = std::find_if(all.begin(), all.end(), [&](const Diagnosis& e) {
    return e.input == d.input && (e.check == d.check || e.check.empty()) &&
           before_a_named_slip(e.kind) == BeforeANamedSlip::replaced;
  });
  const auto follows = std::find_if(all.begin(), all.end(), [&](const Diagnosis& e) {
    return e.input == d.input && (e.check == d.check || e.check.empty()) &&
           before_a_named_slip(e.kind) != BeforeANamedSlip::stays;
  });
  if (replaced != all.end()) *replaced = std::move(d);
  else if (follows != all.end()) all.insert(follows, std::move(d));
  else all.push_back(std::move(d));
  report.conclude();
}

std::string finding_kinds_table() {
  std::string table = "| kind | key | what it says | found by |\n|---|---|---|---|\n";
  for (const FindingSheet& s : sheets()) {
    std::string_view link = s.section;
    if (link.starts_with("docs/")) link.remove_prefix(5);
    if (link.starts_with("gradchecking.md#")) link.remove_prefix(15);
    // "this file" is the kind's own file; a pass says its rank.
    std::string found(s.found_by);
    if (const size_t at = found.find("this file"); at != std::string::npos)
      found.replace(at, 9, fmt::format("`checker/findings/{}.cpp`", s.kind.key()));
    for (size_t i = 0; i < s.passes.size(); ++i)
      found += fmt::format("{}{}", i == 0 ? (s.passes.size() == 1 ? " (rank " : " (ranks ") : ", ", s.passes[i].rank);
    if (!s.passes.empty()) found += ")";
    table += fmt::format("| [{}]({}) | `{}` | {} | {} |\n", s.title, link, s.kind.key(), s.meaning, found);
  }
  return table;
}

}  // namespace tapegrad
