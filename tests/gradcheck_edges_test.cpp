// checker/edges.hpp: C++ functions with a known edge bug each are found at their edge with a line that reproduces
// it, their fixed versions and every built-in op (its declared edges aside) have no edge finding.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "checker/edges.hpp"
#include "ops/ops.hpp"

using namespace tapegrad;

namespace {

Var ones_like(Tape& tape, const Var& x, double value = 1.0) {
  return tape.constant(Tensor::full(DType::f64, x.shape(), value));
}
Var row_of(const Var& x) { return slice(x, -1, 0, 1); }

// Σ(x − μ)²/m along the last axis, m = n − 1 (the sample variance) or n: the sample's is 0/0 at n = 1.
Var variance(Tape& tape, const Var& x, bool sample) {
  const Var squares = sum(square(sub(x, mean(x, -1, true))), -1, true);
  const auto n = static_cast<double>(x.shape().back());
  return div(squares, ones_like(tape, squares, sample ? n - 1 : n));
}

struct Pair {
  std::string name;
  std::vector<std::string> edges;  // the edges its bug breaks at (the words a finding starts with)
  Function buggy, fixed;
};

// Each a function of one (3, 5) input whose bug shows only at an edge.
std::vector<Pair> pairs() {
  return {
      {"softmax as exp(x)/Σ exp(x)",
       {"a fully masked row", "large values"},
       [](Tape&, std::span<const Var> x) { return div(exp(x[0]), sum(exp(x[0]), -1, true)); },
       [](Tape&, std::span<const Var> x) { return softmax(x[0]); }},
      {"logsumexp as log Σ exp(x)",
       {"a fully masked row", "large values"},
       [](Tape&, std::span<const Var> x) { return log(sum(exp(x[0]), -1)); },
       [](Tape&, std::span<const Var> x) { return sub(row_of(x[0]), row_of(log_softmax(x[0]))); }},
      {"layer norm without eps",
       {"a constant row"},
       [](Tape&, std::span<const Var> x) {
         const Var c = sub(x[0], mean(x[0], -1, true));
         return div(c, sqrt(mean(square(c), -1, true)));
       },
       [](Tape& tape, std::span<const Var> x) {
         const Var w = tape.constant(Tensor::full(DType::f64, {5}, 1.0));
         const Var b = tape.constant(Tensor::zeros(DType::f64, {5}));
         return layer_norm(x[0], w, b, 1e-5);
       }},
      {"L2 normalization x/‖x‖",
       {"a zero row", "tiny values"},
       [](Tape&, std::span<const Var> x) { return div(x[0], sqrt(sum(square(x[0]), -1, true))); },
       [](Tape&, std::span<const Var> x) { return row_normalize(x[0]); }},
      {"the norm ‖x‖",
       {"a zero row"},
       [](Tape&, std::span<const Var> x) { return sqrt(sum(square(x[0]), -1)); },
       [](Tape& tape, std::span<const Var> x) {
         const Var squares = sum(square(x[0]), -1);
         return sqrt(add(squares, ones_like(tape, squares, 1e-12)));
       }},
      {"the sample variance",
       {"a length of 1"},
       [](Tape& tape, std::span<const Var> x) { return variance(tape, x[0], true); },
       [](Tape& tape, std::span<const Var> x) { return variance(tape, x[0], false); }},
      {"RMS normalization without eps",
       {"a zero row", "tiny values"},
       [](Tape&, std::span<const Var> x) { return div(x[0], sqrt(mean(square(x[0]), -1, true))); },
       [](Tape& tape, std::span<const Var> x) {
         const Var squares = mean(square(x[0]), -1, true);
         return div(x[0], sqrt(add(squares, ones_like(tape, squares, 1e-6))));
       }},
  };
}

GradcheckReport probed(const Function& f, uint64_t seed = 7, const UndefinedEdges& undefined = {}) {
  const std::vector<Tensor> x{Tensor::randn(DType::f64, {3, 5}, seed)};
  const std::vector<std::string> names{"x"};
  GradcheckReport report = gradcheck(f, x, names);
  REQUIRE(report.passed);  // right at a random point: only the edges can say otherwise
  probe_edges(report, f, x, names, seed, undefined);
  return report;
}

}  // namespace

TEST_CASE("a function with an edge bug fails at its edge, the finding names it with a line that reproduces it") {
  for (const Pair& p : pairs()) {
    CAPTURE(p.name);
    const GradcheckReport r = probed(p.buggy);
    CHECK_FALSE(r.passed);
    const Diagnosis* d = r.find(Finding::edge, "x");
    REQUIRE(d);
    CHECK(
        std::any_of(p.edges.begin(), p.edges.end(), [&](const std::string& e) { return d->message.rfind(e, 0) == 0; }));
    CHECK(d->message.find("reproduce: x") != std::string::npos);  // x[1, :] = 0, x = x.narrow(-1, 0, 1)
    CHECK(r.str().find("edges: ") != std::string::npos);          // the note of what was probed
  }
}

TEST_CASE("the fixed versions have no edge finding") {
  for (const Pair& p : pairs()) {
    CAPTURE(p.name);
    const GradcheckReport r = probed(p.fixed);
    CHECK(r.passed);
    CHECK_FALSE(r.has(Finding::edge));
    const auto row = std::find_if(r.checks.begin(), r.checks.end(), [](const auto& c) { return c.check == "edges"; });
    REQUIRE(row != r.checks.end());
    CHECK(row->compared >= 6);  // something was probed: a row passes only when it was
  }
}

TEST_CASE("an edge declared undefined is not probed, and the note says so") {
  const Function naive_l2 = pairs()[3].buggy;
  const GradcheckReport r = probed(naive_l2, 7, {{"zeros", "nan"}, {"tiny", "nan"}});
  CHECK(r.passed);
  CHECK(r.str().find("not probed, declared undefined: tiny (nan), zeros (nan)") != std::string::npos);
}

TEST_CASE("every built-in op has no edge finding where its documented behaviour holds") {
  for (const OpSheet& op : builtin_registry().ops())
    for (const GradcheckCase& c : op.cases) {
      CAPTURE(op.name);
      CAPTURE(c.name);
      GradcheckReport r = gradcheck(c, {}, op.name);
      const CaseInputs in = case_inputs(c, {});
      probe_edges(r, c.build, in.values, in.names, in.options.seed, parse_undefined_edges(op.undefined_edges));
      CHECK_MESSAGE(!r.has(Finding::edge), r.str());
    }
}

TEST_CASE("undefined edges are read as EDGE=nan|inf|undefined; anything else is refused naming it") {
  const UndefinedEdges u = parse_undefined_edges(std::vector<std::string>{"masked_rows=nan", "large=inf"});
  CHECK(u.at("masked_rows") == "nan");
  CHECK(u.at("large") == "inf");
  CHECK_THROWS_WITH_AS(parse_undefined_edges(std::vector<std::string>{"masked=nan"}),
                       doctest::Contains("no edge is named 'masked'"), Error);
  CHECK_THROWS_WITH_AS(parse_undefined_edges(std::vector<std::string>{"zeros=zero"}),
                       doctest::Contains("EDGE=nan, EDGE=inf or EDGE=undefined"), Error);
}
