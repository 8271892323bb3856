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
  CHECK(format_trace(run).find("DIFFERENT") != std::string::npos);
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
  // The last digits of the agreement may differ from one libm to another: that line is compared up to its number.
  const std::regex difference(R"(= [0-9.]+e[-+][0-9]+ \()");
  const std::string printed = format_trace(trace_op(builtin_registry(), "softmax"));
  CHECK_MESSAGE(
      std::regex_replace(printed, difference, "= N (").find(std::regex_replace(excerpt, difference, "= N (")) !=
          std::string::npos,
      "docs/learn.md quotes lines that `tapegrad explain softmax --trace` does not print:\n"
          << printed);
}
