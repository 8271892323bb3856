// tapegrad explain OP --trace (checker/trace.hpp): each op's worked example computes, line by line, the gradients its
// node's VJP gives; a wrong line is caught; and every `tapegrad explain OP --trace` the docs name has an example.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "checker/trace.hpp"
#include "ops/ops.hpp"
#include "test_paths.hpp"

using namespace tapegrad;

TEST_CASE("every worked example ends with the gradients its node's VJP gives, and the node passes there") {
  int traced = 0;
  for (const OpSheet& op : builtin_registry().ops()) {
    if (!op.trace) continue;
    CAPTURE(op.name);
    ++traced;
    const OpTraceRun run = trace_op(builtin_registry(), op.name);
    CHECK_MESSAGE(run.passed, format_trace(run));
    CHECK(run.check.passed);
    std::set<std::string> parts;
    for (const TracedLine& line : run.lines) {
      parts.insert(line.part);
      CHECK(line.value.dtype() == DType::f64);
    }
    CHECK(parts.size() == 2);  // the forward's lines and the VJP's
    size_t differentiable = 0;
    for (const InputSpec& s : op.trace->example.inputs) differentiable += s.differentiable() ? 1 : 0;
    CHECK(run.gradients.size() == differentiable);
    for (const TracedGradient& g : run.gradients) CHECK_MESSAGE(g.agrees, g.input);
    REQUIRE(run.jacobians.size() == differentiable);  // x̄ = Jᵀȳ with J from forward mode, for every input
    for (const TracedJacobian& jac : run.jacobians) {
      CHECK_MESSAGE(jac.agrees, jac.input);
      CHECK(jac.value.defined() == (jac.rows * jac.cols <= kTracePrintedJacobian));
    }
    // Tiny: a learner reads every number.
    for (const auto& [name, value] : run.inputs) CHECK(value.numel() <= 24);
    const nlohmann::json j = trace_json(run);
    CHECK(j["lines"].size() == run.lines.size());
    CHECK(j["passed"] == true);
  }
  CHECK(traced >= 4);
}

TEST_CASE("a worked example with a wrong line does not pass") {
  OpSheet op = *builtin_registry().find("softmax");
  // The row term dropped: x̄ = y ⊙ ȳ.
  op.trace->lines = [](TraceLines& t, std::span<const Var> x, const Var& g) -> std::vector<Var> {
    const Var y = t.show("y = softmax(x)", softmax(x[0]));
    t.part("VJP");
    return {t.show("x̄ = y ⊙ ȳ", mul(y, g))};
  };
  const Registry registry{{op}};
  const OpTraceRun run = trace_op(registry, "softmax");
  CHECK_FALSE(run.passed);
  REQUIRE(run.gradients.size() == 1);
  CHECK_FALSE(run.gradients[0].agrees);
  REQUIRE(run.jacobians.size() == 1);
  CHECK_FALSE(run.jacobians[0].agrees);  // Jᵀȳ, from the node's JVP, shows the lines' x̄ wrong too
  CHECK(format_trace(run).find("DIFFERENT") != std::string::npos);
}

TEST_CASE("softmax's worked example shows the row term as its own step and J = diag(y) − y yᵀ per row") {
  const std::vector<std::pair<std::string, Shape>> rows_of_four{{"x", Shape{2, 4}}};
  const OpTraceRun run = trace_op(builtin_registry(), "softmax", {}, rows_of_four);
  CHECK(run.passed);
  CHECK(run.shapes_given);
  auto line = [&](std::string_view starts) {
    for (const TracedLine& l : run.lines)
      if (l.formula.starts_with(starts)) return l.value.to_vector();
    FAIL("no line " << starts);
    return std::vector<double>{};
  };
  const std::vector<double> y = line("y = "), own = line("y ⊙ ȳ, x̄ without"), row = line("y ⊙ D, the row term"),
                            xbar = line("x̄ = ");
  for (size_t i = 0; i < xbar.size(); ++i) CHECK(xbar[i] == doctest::Approx(own[i] - row[i]).epsilon(1e-14));
  REQUIRE(run.jacobians.size() == 1);
  const TracedJacobian& jac = run.jacobians[0];
  REQUIRE(jac.value.defined());
  REQUIRE(jac.value.shape() == Shape{8, 8});
  const std::vector<double> j = jac.value.to_vector();
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c) {
      CAPTURE(r);
      CAPTURE(c);
      const double expected = r / 4 != c / 4 ? 0.0 : (r == c ? y[r] : 0.0) - y[r] * y[c];
      CHECK(j[r * 8 + c] == doctest::Approx(expected).epsilon(1e-12).scale(1e-15));
    }
  CHECK(format_trace(run).find("∂y/∂x (8 × 8) =") != std::string::npos);
  CHECK(format_trace(run).find("at x (2, 4)") != std::string::npos);
}

TEST_CASE("attention's worked example computes D as the code does, and rowsum(A ⊙ dA) beside it is the same") {
  for (const Shape& bias : {Shape{3, 3}, Shape{1, 1, 3, 3}, Shape{2, 1, 3, 3}}) {
    CAPTURE(bias);
    const std::vector<std::pair<std::string, Shape>> shapes{{"bias", bias}};
    const OpTraceRun run = trace_op(builtin_registry(), "attention", {}, shapes);
    CHECK_MESSAGE(run.passed, format_trace(run));
    std::vector<double> code, definition;
    for (const TracedLine& l : run.lines) {
      if (l.formula.starts_with("D = rowsum(G ⊙ O)")) code = l.value.to_vector();
      if (l.formula.starts_with("rowsum(A ⊙ dA)")) definition = l.value.to_vector();
    }
    REQUIRE(code.size() == 6);  // one per query row: B = 2, h = 1, T = 3
    REQUIRE(definition.size() == code.size());
    for (size_t i = 0; i < code.size(); ++i) CHECK(definition[i] == doctest::Approx(code[i]).epsilon(1e-13));
  }
}

TEST_CASE("--shape runs every worked example at other shapes, and refuses what it cannot run") {
  using Shapes = std::vector<std::pair<std::string, Shape>>;
  CHECK(trace_op(builtin_registry(), "layer_norm", {}, Shapes{{"x", {2, 2, 3}}, {"w", {3}}, {"b", {3}}}).passed);
  CHECK(trace_op(builtin_registry(), "row_normalize", {}, Shapes{{"x", {4, 3}}}).passed);
  CHECK(trace_op(builtin_registry(), "attention", {},
                 Shapes{{"q", {1, 2, 4, 3}}, {"k", {1, 2, 5, 3}}, {"v", {1, 2, 5, 1}}, {"bias", {2, 4, 5}}})
            .passed);
  CHECK_THROWS_WITH(trace_op(builtin_registry(), "softmax", {}, Shapes{{"x", {100, 100}}}),
                    doctest::Contains("at most 256 for explain --trace"));
  CHECK_THROWS_WITH(trace_op(builtin_registry(), "softmax", {}, Shapes{{"z", {3}}}),
                    doctest::Contains("has no input 'z'; its inputs are x"));
  CHECK_THROWS_WITH(trace_op(builtin_registry(), "layer_norm", {}, Shapes{{"x", {3, 5}}}),
                    doctest::Contains("weight must have shape (5)"));
}

TEST_CASE("an op without a worked example is refused, naming the ops that have one") {
  CHECK_THROWS_WITH(trace_op(builtin_registry(), "matmul"), doctest::Contains("the ops that have one: attention"));
  CHECK_THROWS_WITH(trace_op(builtin_registry(), "no_such_op"), doctest::Contains("no op named 'no_such_op'"));
}

TEST_CASE("every `tapegrad explain OP --trace` the docs name runs a worked example that passes") {
  const std::regex command(R"(tapegrad explain ([a-z_]+) --trace)");
  int named = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(TAPEGRAD_SOURCE_DIR) + "/docs")) {
    if (entry.path().extension() != ".md") continue;
    std::ifstream in(entry.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (auto it = std::sregex_iterator(text.begin(), text.end(), command); it != std::sregex_iterator(); ++it) {
      const std::string op = (*it)[1];
      CAPTURE(entry.path().filename().string());
      CAPTURE(op);
      ++named;
      const OpTraceRun run = trace_op(builtin_registry(), op);
      CHECK(run.passed);
    }
  }
  CHECK(named >= 4);
}

TEST_CASE("docs/learn.md's excerpt of `tapegrad explain softmax --trace` is what it prints") {
  std::ifstream in(std::string(TAPEGRAD_SOURCE_DIR) + "/docs/learn.md");
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = doc.find("See the numbers: `tapegrad explain softmax --trace`");
  REQUIRE(at != std::string::npos);
  const size_t open = doc.find("```\n", at), close = doc.find("\n```", open + 4);
  REQUIRE(close != std::string::npos);
  const std::string excerpt = doc.substr(open + 4, close - open - 4);
  // The last digits of an agreement may differ from one libm to another: those lines are compared up to their number.
  const std::regex difference(R"(= [0-9.]+e[-+][0-9]+( \(|:))");
  const std::string printed = format_trace(trace_op(builtin_registry(), "softmax"));
  CHECK_MESSAGE(
      std::regex_replace(printed, difference, "= N$1").find(std::regex_replace(excerpt, difference, "= N$1")) !=
          std::string::npos,
      "docs/learn.md quotes lines that `tapegrad explain softmax --trace` does not print:\n"
          << printed);
}
