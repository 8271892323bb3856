// A kind of finding's sheet, as an op has one (ops/sheet.hpp): plain data that describes the kind to whatever reads it
// (the report's printed name, the docs' table of kinds, `tapegrad gradcheck --kinds`), and, for the kinds read from a
// failing VJP's or JVP's full Jacobian, the pass that looks for it there. Each kind is one file of checker/findings/,
// named by its key, that ends in its sheet function
//   FindingSheet KEY_finding() { ... }
// at the start of a line within namespace tapegrad; the build lists those functions in builtin_findings()
// (cmake/generate_sheet_list.cmake), so a kind's file is all there is to add one (docs/adding-a-finding.md).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "finding.hpp"
#include "gradcheck.hpp"

namespace tapegrad {

namespace gradcheck_detail {
struct JacobianSearch;  // checker/jacobian.hpp
}

// A pass over a failing full Jacobian: it reads the search (the Jacobian, its failing elements, what the passes
// before it found), adds what it finds to search.found, and returns true when that explains the failure as a whole
// and no later pass runs (checker/diagnose.cpp runs them in the order of their ranks, lowest first).
using JacobianPass = bool (*)(gradcheck_detail::JacobianSearch&);
struct RankedPass {
  int rank;  // its place among every kind's passes; two passes never share one (a test holds it)
  JacobianPass run;
};

// How a finding of a kind stands to one that a later pass names for the same input and check (the Python module's
// naming from a Function's forward, add_finding below).
enum class BeforeANamedSlip {
  stays,     // it stays where it is: it says something else (which rule, a scale, ...)
  replaced,  // it gives its place to the named slip: it names nothing ("no known kind")
  follows,   // it stays, after the named slip: it says where the error lies or what shape it has in each row, not
             // which term of the rule makes it
};

struct FindingSheet {
  Finding kind;
  std::string_view title;               // as the report prints it: "per-row term"
  std::string_view meaning;             // what a finding of this kind says of the rule, in one line
  std::string_view found_by;            // where such a finding is made: this file's pass, or the file that makes it
  std::string_view section;             // its section of docs/gradchecking.md, an anchor: "#per-row-term"
  std::vector<RankedPass> passes = {};  // over a failing full Jacobian, where the kind is read from one
  // Whether a finding of this kind names its input's failure, so that no later pass looks for the term of a
  // Function's forward that makes it (python/tapegrad/_gradcheck.py reads it).
  bool explains = false;
  BeforeANamedSlip before_a_named_slip = BeforeANamedSlip::stays;
};

// Every built-in kind's sheet, file by file in the order of their names under checker/findings/ (generated).
std::vector<FindingSheet> builtin_findings();
// The built-in sheet of that kind, or nullptr.
const FindingSheet* finding_sheet(Finding f);
// The built-in kind with that key or printed name ("per_row_term", "per-row term").
std::optional<Finding> finding_named(std::string_view key_or_title);
// Adds a finding that a later pass named (from Python) to a report made before: in the place of the input's finding
// for that check, or for the input as a whole, that gives way to it (BeforeANamedSlip::replaced: one report says one
// thing of an input), else before the first of the input's findings for that check, or for the input as a whole,
// that follow a named slip, else last; and concludes the report again.
void add_finding(GradcheckReport& report, Diagnosis d);

// The built-in kinds as a Markdown table, a row per sheet: its printed name linked to its section (links relative
// to docs/), its key, what it says, where it is found (its passes' ranks, or the files). `tapegrad gradcheck --kinds`
// prints it; docs/gradchecking.md holds it, and a docs test that it is this table.
std::string finding_kinds_table();

}  // namespace tapegrad
