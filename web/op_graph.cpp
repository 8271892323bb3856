// An op's tape for the pages to draw (web/graph_layout.js lays it out): the boxes and edges `tapegrad graph --op OP
// [--case NAME] --unfused --seed SEED --format dot` writes, as records from the same drawing (inspect/tape_dot.hpp,
// tape_graph), so that the page and the terminal cannot draw different graphs. The op's worked example (the one
// `tapegrad explain OP --trace` runs) can be drawn too, at the shapes the trace page gives it.
#include <emscripten/bind.h>

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checker/explain.hpp"
#include "checker/trace.hpp"
#include "engine/tensor.hpp"
#include "inspect/allocation_log.hpp"
#include "inspect/scope_names.hpp"
#include "inspect/tape_dot.hpp"
#include "ops/ops.hpp"
#include "web/page_calls.hpp"

namespace tapegrad::web {

namespace {

using Json = nlohmann::json;

// The case drawn: the op's worked example where case_name is empty, else its gradcheck case of that name.
GradcheckCase case_to_draw(const OpSheet& op, const std::string& case_name) {
  if (case_name.empty()) {
    if (!op.trace) throw Error(fmt::format("graph: op '{}' has no worked example", op.name));
    return op.trace->example;
  }
  for (const GradcheckCase& c : op.cases)
    if (c.name == case_name) return c;
  throw Error(fmt::format("graph: op '{}' has no case '{}'", op.name, case_name));
}

// `tapegrad graph --op OP [--case NAME] --unfused --seed SEED`, forward only, as tools/graph_command.cpp draws it:
// the case's inputs as float64 leaves named as the case names them, and its map as the primitive ops it replaces
// (its own unfused form, or the op's where that is the case's map at its inputs); an op with neither is drawn as
// itself. shapes_json: [["x", [2, 4]], ...] in place of the case's shapes (empty: its own). Answers {nodes, edges,
// caption, title, unfused, cases} (tape_graph's records; cases: the names of the op's gradcheck cases), or {error}.
std::string op_graph(const std::string& name, const std::string& case_name, double seed,
                     const std::string& shapes_json) {
  return answer([&] {
    const uint64_t drawn_seed = seed_from_page(seed);
    const OpSheet* op = builtin_registry().find(name);
    if (!op) throw Error(fmt::format("graph: unknown op '{}'", name));
    GradcheckCase c = case_to_draw(*op, case_name);
    c.inputs = inputs_at_shapes(c, op->name, shapes_from_page(shapes_json), kTraceMaxInputElements, "graph");
    const std::vector<Tensor> xs = make_inputs(c.inputs, DType::f64, drawn_seed);
    const Function form = unfused_form_at(*op, c, xs);
    const bool unfused = static_cast<bool>(form);
    const Function build = unfused ? form : c.build;

    Tape tape;
    tape.set_retain_grads(true);
    AllocationLog allocations(tape);
    ScopeNames scopes(tape);
    DotOptions opt;
    opt.allocations = &allocations;
    opt.scopes = &scopes;
    opt.registry = &builtin_registry();
    std::vector<Var> vars;
    for (size_t i = 0; i < xs.size(); ++i) {
      vars.push_back(tape.leaf(xs[i], c.inputs[i].differentiable()));
      opt.names[vars.back().id()] = c.inputs[i].name;
    }
    build(tape, vars);
    std::string steps;  // the primitive ops recorded, in order
    for (size_t k = 0; unfused && k < tape.num_nodes(); ++k)
      steps += fmt::format("{}{}", k ? ", " : "", tape.node(k).op);
    opt.title = fmt::format("{}{}, {}: float64 inputs drawn with seed {}; forward only", op->name,
                            unfused ? fmt::format(" unfused ({})", steps) : "",
                            case_name.empty() ? "its worked example" : fmt::format("case '{}'", c.name), drawn_seed);
    const TapeGraph g = tape_graph(tape, opt);

    Json nodes = Json::array(), edges = Json::array(), cases = Json::array();
    for (const TapeGraph::Node& n : g.nodes)
      nodes.push_back({{"name", n.name},
                       {"shape", n.shape},
                       {"fill", n.fill},
                       {"border", n.border},
                       {"bad", n.bad},
                       {"loss", n.loss},
                       {"lines", n.lines},
                       {"tooltip", n.tooltip}});
    for (const TapeGraph::Edge& e : g.edges)
      edges.push_back({{"from", e.from}, {"to", e.to}, {"label", e.label}, {"tooltip", e.tooltip}});
    for (const GradcheckCase& k : op->cases) cases.push_back(k.name);
    return Json{{"nodes", nodes},     {"edges", edges},     {"caption", g.caption},
                {"title", opt.title}, {"unfused", unfused}, {"cases", cases}};
  });
}

}  // namespace

}  // namespace tapegrad::web

EMSCRIPTEN_BINDINGS(tapegrad_web_graph) { emscripten::function("opGraph", &tapegrad::web::op_graph); }
