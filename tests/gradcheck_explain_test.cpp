// tapegrad explain's library side: every built-in op explains itself (forward, VJP, JVP, the node's file and line,
// derivation sections that exist, bytes, FLOPs where counted, a passing gradcheck), and its parts hold.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "checker/explain.hpp"
#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;

namespace {

ExplainOptions with_docs() {
  ExplainOptions o;
  o.derivations_path = std::string(TAPEGRAD_SOURCE_DIR) + "/docs/derivations.md";
  return o;
}

}  // namespace

TEST_CASE("explain: every registered op has its forward, VJP and JVP, its node's file and a passing check") {
  for (const OpSheet& op : builtin_registry().ops()) {
    INFO("op: " << op.name);
    const Explanation e = explain(builtin_registry(), op.name, with_docs());
    CHECK(!e.forward.empty());
    CHECK(!e.vjp.empty());
    CHECK(!e.jvp.empty());  // every built-in op has a forward-mode rule
    CHECK(e.recorded_at.starts_with("ops/" + op.family + "."));
    CHECK(e.registered_at.starts_with("ops/" + op.family + ".cpp:"));
    CHECK(std::filesystem::is_regular_file(std::string(TAPEGRAD_SOURCE_DIR) + "/ops/" + op.family + ".cpp"));
    CHECK(e.nodes >= 1);
    CHECK((e.bytes_kept > 0 || op.name == "reshape"));  // reshape is a view of its input: it keeps nothing
    // The bytes stated are the tensors listed plus the arena's alignment, less than one 64-byte block per tensor.
    CHECK(e.alignment_padding() >= 0);
    CHECK(e.alignment_padding() < 64 * static_cast<int64_t>(std::max<size_t>(e.kept.size(), 1)));
    CHECK(explanation_json(e)["alignment_padding"] == e.alignment_padding());
    CHECK(e.check.passed);
    CHECK(!format_explanation(e).empty());
    CHECK(explanation_json(e)["op"] == op.name);
  }
}

TEST_CASE("explain points to the section of docs/learn.md or reverse-mode.md that walks through the op") {
  const std::map<std::string, std::string> walked = {
      {"softmax", "2. "}, {"attention", "3. "}, {"layer_norm", "4. "}, {"row_normalize", "5. "}, {"matmul", "6. "}};
  for (const OpSheet& op : builtin_registry().ops()) {
    INFO("op: " << op.name);
    const Explanation e = explain(builtin_registry(), op.name, with_docs());
    const auto it = walked.find(op.name);
    if (it == walked.end()) {
      CHECK(e.learn_section.empty());
      CHECK(format_explanation(e).find("  learn ") == std::string::npos);
      continue;
    }
    CHECK(e.learn_section.starts_with(it->second));
    CHECK(e.learn_file.ends_with(op.name == "matmul" ? "docs/reverse-mode.md" : "docs/learn.md"));
    CHECK(format_explanation(e).find("  learn      " + e.learn_file + " § " + e.learn_section + "\n") !=
          std::string::npos);
    CHECK(explanation_json(e)["learn_section"] == e.learn_section);
  }
}

TEST_CASE("explain: each derivation section an op names is a heading of docs/derivations.md") {
  std::ifstream in(std::string(TAPEGRAD_SOURCE_DIR) + "/docs/derivations.md");
  REQUIRE(in.good());
  int named = 0;
  for (const OpSheet& op : builtin_registry().ops()) {
    const Explanation e = explain(builtin_registry(), op.name, with_docs());
    for (const std::string& s : e.sections) {
      INFO("op " << op.name << " names section " << s);
      // A section found in the file is given with its title; one not found stays a bare number.
      CHECK(s.find(' ') != std::string::npos);
      ++named;
    }
  }
  CHECK(named >= 8);  // the attention family, softmax and β are derived there
  const Explanation row = explain(builtin_registry(), "row_normalize", with_docs());
  REQUIRE(!row.sections.empty());
  CHECK(row.sections.front().starts_with("1.2 β(x) = x/(1 + ‖x‖)"));
}

TEST_CASE("explain: matmul's FLOPs at a shape are 2·m·k·n forward and twice that for the VJP and the JVP") {
  ExplainOptions o;
  o.shapes = {{"a", Shape{6, 5}}, {"b", Shape{5, 7}}};
  const Explanation e = explain(builtin_registry(), "matmul", o);
  REQUIRE(e.cost.has_value());
  CHECK(e.cost->forward == doctest::Approx(2.0 * 6 * 5 * 7));
  CHECK(e.cost->backward == doctest::Approx(4.0 * 6 * 5 * 7));
  CHECK(e.cost->jvp == doctest::Approx(4.0 * 6 * 5 * 7));
  CHECK(e.output == Shape{6, 7});
  CHECK(e.check.passed);
  // The bytes the node keeps are its float32 output, in whole 64-byte arena blocks.
  CHECK(e.bytes_kept >= 6 * 7 * 4);
  CHECK(e.bytes_kept < 6 * 7 * 4 + 128);
}

TEST_CASE("explain: ops without a cost function say so; errors name what exists") {
  const Explanation e = explain(builtin_registry(), "add");
  CHECK(!e.cost.has_value());
  CHECK(format_explanation(e).find("not counted") != std::string::npos);
  testing::check_message(testing::error_of([] { explain(builtin_registry(), "nosuch"); }), "explain",
                         {"no op 'nosuch'", "softmax", "attention"});
  testing::check_message(testing::error_of([] {
                           ExplainOptions o;
                           o.case_name = "nosuch";
                           explain(builtin_registry(), "softmax", o);
                         }),
                         "explain", {"no case 'nosuch'", "its cases are"});
  testing::check_message(testing::error_of([] {
                           ExplainOptions o;
                           o.shapes = {{"q", Shape{2}}};
                           explain(builtin_registry(), "softmax", o);
                         }),
                         "explain", {"no input 'q'", "its inputs are x"});
  testing::check_message(testing::error_of([] {
                           ExplainOptions o;
                           o.shapes = {{"x", Shape{4096, 4096}}};
                           explain(builtin_registry(), "softmax", o);
                         }),
                         "explain", {"16777216 elements", "at most"});
}

TEST_CASE("explain: the VJP and the JVP are the sheet's two lines, as given") {
  for (const OpSheet& op : builtin_registry().ops()) {
    INFO("op: " << op.name);
    const Explanation e = explain(builtin_registry(), op.name);
    CHECK(e.vjp == op.vjp);
    CHECK(e.jvp == op.jvp);
    const std::string text = format_explanation(e);
    CHECK(text.find("  VJP        " + op.vjp + "\n") != std::string::npos);
    CHECK(text.find("  JVP        " + op.jvp + "\n") != std::string::npos);
    const auto json = explanation_json(e);
    CHECK(json["vjp"] == op.vjp);
    CHECK(json["jvp"] == op.jvp);
  }
  // A sheet without a JVP line says so rather than printing an empty one.
  OpSheet square_vjp_only = *builtin_registry().find("square");
  square_vjp_only.jvp.clear();
  Registry reg;
  reg.add(square_vjp_only);
  CHECK(format_explanation(explain(reg, "square")).find("  JVP        (not given at registration)\n") !=
        std::string::npos);
}

TEST_CASE("parse_named_shape: NAME=D,D,... and one-line errors") {
  CHECK(parse_named_shape("--shape", "x=4,6") == std::pair<std::string, Shape>{"x", Shape{4, 6}});
  CHECK(parse_named_shape("--shape", "s=") == std::pair<std::string, Shape>{"s", Shape{}});
  for (const char* bad : {"x", "=4", "x=4,", "x=a", "x=-1", "x=1,2,3,4,5,6,7", "x=999999,999999,999999"})
    CHECK_MESSAGE(testing::error_of([&] { parse_named_shape("--shape", bad); }).starts_with("--shape: "), bad);
}

TEST_CASE("explain: the tensors a node keeps, by name") {
  const Explanation e = explain(builtin_registry(), "layer_norm");
  std::vector<std::string> names;
  for (const auto& a : e.kept) names.push_back(a.what ? a.what : "");
  CHECK(names == std::vector<std::string>{"output", "μ per row", "ρ = 1/√(var + ε) per row"});
  CHECK(format_explanation(e).find("μ per row") != std::string::npos);
  CHECK(explanation_json(e)["kept"].size() == 3);
}

TEST_CASE("explain: formulas written outside the node's file are named by file and line, at their function") {
  // A sheet names the file and the function; explain finds the line where the function is defined.
  auto line_at = [](const std::string& place) {
    const size_t colon = place.rfind(':');
    REQUIRE(colon != std::string::npos);
    std::ifstream in(std::string(TAPEGRAD_SOURCE_DIR) + "/" + place.substr(0, colon));
    REQUIRE(in.good());
    const int line = std::stoi(place.substr(colon + 1));
    std::string text;
    for (int i = 1; std::getline(in, text) && i < line; ++i) {}
    return text;
  };
  int places = 0;
  for (const OpSheet& op : builtin_registry().ops()) {
    INFO("op: " << op.name);
    for (const FormulaLocation& place : explain(builtin_registry(), op.name, with_docs()).formulas_at) {
      INFO(place.what << " at " << place.at);
      CHECK(line_at(place.at).find(place.function + "(") != std::string::npos);
      ++places;
    }
  }
  CHECK(places >= 11);  // softmax, log_softmax, row_normalize, attention, beta_attention
  const Explanation row = explain(builtin_registry(), "row_normalize", with_docs());
  REQUIRE(row.formulas_at.size() == 3);
  CHECK(row.formulas_at[0].what == "forward");
  CHECK(line_at(row.formulas_at[0].at).find("beta_row(") != std::string::npos);
  CHECK(line_at(row.formulas_at[1].at).find("beta_row_derivative(") != std::string::npos);
  CHECK(explanation_json(row)["formulas_at"][1]["what"] == "VJP and JVP");
  CHECK(line_at(row.formulas_at[2].at).find("beta_row_second_order(") != std::string::npos);
  // A tree that does not have the file is passed over; the place starts with the file, and the function is named.
  ExplainOptions elsewhere;
  elsewhere.source_dir = "/nonexistent";
  const FormulaLocation f = explain(builtin_registry(), "softmax", elsewhere).formulas_at.front();
  CHECK(f.function == "softmax_row");
  CHECK(f.at.starts_with("ops/row_maps.hpp"));
}

TEST_CASE("every function an op's sheet names is defined in the file it names") {
  int named = 0;
  for (const OpSheet& op : builtin_registry().ops())
    for (const FormulaPlace& f : op.formulas_at) {
      INFO(op.name << ": " << f.what << " in " << f.file << ", function " << f.function);
      CHECK(line_of_function(std::string(TAPEGRAD_SOURCE_DIR) + "/" + f.file, f.function) > 0);
      ++named;
    }
  CHECK(named >= 11);
  CHECK(line_of_function(std::string(TAPEGRAD_SOURCE_DIR) + "/ops/row_maps.hpp", "no_such_function") == 0);
}

TEST_CASE("explain: every op shows its second-order rule, where it is derived, and its second-order check") {
  for (const OpSheet& op : builtin_registry().ops()) {
    INFO("op: " << op.name);
    CHECK_FALSE(op.second_order.empty());
  }
  const Explanation e = explain(builtin_registry(), "softmax", with_docs());
  CHECK(e.second_order.find("⟨ẏ, ȳ⟩·y") != std::string::npos);
  CHECK(e.second_order_section == "6.4 Softmax");
  CHECK(e.check_second_order.passed());
  const std::string text = format_explanation(e);
  CHECK(text.find("  2nd order  per row: ẋ̄ += ") != std::string::npos);
  CHECK(text.find("§ 6.4 Softmax") != std::string::npos);
  CHECK(text.find("symmetry") != std::string::npos);
  const auto json = explanation_json(e);
  CHECK(json["second_order"] == e.second_order);
  CHECK(json["gradcheck_second_order"]["passed"] == true);
  // A linear op says so rather than leaving the line empty.
  const Explanation reshape = explain(builtin_registry(), "reshape", with_docs());
  CHECK(reshape.second_order == kNoSecondOrderTerm);
  CHECK(reshape.second_order_section == "6.1 Ops linear in their inputs");
  // Every op's section is one of docs/derivations.md's headings (found: more than its number).
  for (const OpSheet& op : builtin_registry().ops()) {
    INFO("op: " << op.name);
    CHECK(explain(builtin_registry(), op.name, with_docs()).second_order_section.find(' ') != std::string::npos);
  }
}

TEST_CASE("tapegrad explain --index-markdown: one row per op from its sheet, VJP and JVP in their own columns") {
  const std::string generated = index_markdown(builtin_registry());
  CHECK(generated.starts_with("| op | file | forward | VJP | JVP | second order | derived in |\n"));
  CHECK(std::count(generated.begin(), generated.end(), '\n') == 2 + static_cast<long>(builtin_registry().ops().size()));
  CHECK(generated.find("| `exp` | `ops/pointwise.cpp` | y = exp x | x̄ += y·ȳ | ẏ = y·ẋ | ẋ̄ += y·ẋ·ȳ |") !=
        std::string::npos);
  CHECK(generated.find("y = \\|x\\|") != std::string::npos);  // a formula's | is escaped in its cell
  // The table is made when asked for: no doc keeps a copy that a new op would leave behind.
  std::ifstream in(std::string(TAPEGRAD_SOURCE_DIR) + "/docs/derivations.md");
  REQUIRE(in.good());
  for (std::string line; std::getline(in, line);) CHECK_MESSAGE(!line.starts_with("| `exp` |"), line);
}

TEST_CASE("the case counts docs/derivations.md gives for a node are its sheet's") {
  // Its measured figures say over how many cases they were taken (the cases column of "Gradcheck per node", or
  // "Gradcheck of `op`, N cases" in running text): a case added to a sheet must reach them, or this fails.
  std::ifstream in(std::string(TAPEGRAD_SOURCE_DIR) + "/docs/derivations.md");
  REQUIRE(in.good());
  std::string text, table;
  bool per_node = false;
  for (std::string line; std::getline(in, line);) {
    text += line + " ";
    if (line.starts_with("## ")) per_node = line == "## Gradcheck per node";
    if (per_node && line.starts_with("| `")) table += line + "\n";
  }
  auto check = [](const std::regex& pattern, const std::string& where, int& counted) {
    for (auto m = std::sregex_iterator(where.begin(), where.end(), pattern); m != std::sregex_iterator(); ++m) {
      const OpSheet* op = builtin_registry().find((*m)[1].str());
      INFO("docs/derivations.md: " << m->str());
      REQUIRE(op != nullptr);
      CHECK(std::stoul((*m)[2].str()) == op->cases.size());
      ++counted;
    }
  };
  int counted = 0;
  check(std::regex(R"(Gradcheck of `(\w+)`[^.:;]{0,40}?\b(\d+) cases)"), text, counted);
  check(std::regex(R"(\| `(\w+)`[^|]*\| (\d+) \|)"), table, counted);
  CHECK(counted >= 7);  // every row of "Gradcheck per node"
}

TEST_CASE("explain names the file whose opening comment derives an op's rules, where a sheet says so") {
  int named = 0;
  for (const OpSheet& op : builtin_registry().ops()) {
    if (op.derived_in.empty()) continue;
    INFO("op " << op.name << " is derived in " << op.derived_in);
    ++named;
    std::ifstream in(std::string(TAPEGRAD_SOURCE_DIR) + "/" + op.derived_in);
    REQUIRE(in.good());
    std::string first;
    std::getline(in, first);
    CHECK(first.starts_with("//"));
    const std::string text = format_explanation(explain(builtin_registry(), op.name, with_docs()));
    CHECK(text.find("  derivation " + op.derived_in + " (the comment at its top)") != std::string::npos);
  }
  CHECK(named >= 1);  // layer_norm
}
