// Drawing the tape (inspect/tape_dot.hpp): the DOT text, read back through Graphviz's own parser (dot -Tjson), has
// one node per value and one edge per input of each node, labels with the op and shape, tooltips with the
// op's VJP and JVP and source line, the bytes the tape keeps, red for NaN and ±∞, and a node limit. The scopes,
// retained gradients and read accessors the drawing uses (engine/tape.hpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "inspect/tape_dot.hpp"
#include "models/gpt.hpp"
#include "ops/attention/attention.hpp"
#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using nlohmann::json;

namespace {

struct DotNode {
  std::string label, tooltip, fillcolor;
};

// A drawing as Graphviz reads it.
struct Drawing {
  std::map<std::string, DotNode> nodes;                // by DOT name
  std::vector<std::pair<std::string, std::string>> edges;  // tail, head
  std::vector<std::string> clusters;                   // cluster labels
  std::string caption;
};

// Runs dot -Tjson on the text: the test needs Graphviz (tools/dev.sh installs it).
Drawing parse(const std::string& dot) {
  if (!find_dot_program())
    FAIL("Graphviz's dot program is not on PATH: install Debian's package graphviz (bash tools/dev.sh deps)");
  const json g = json::parse(render_dot(dot, "json"));
  Drawing d;
  d.caption = g.value("label", "");
  const size_t subgraphs = g.value("_subgraph_cnt", size_t{0});
  std::map<int, std::string> by_id;
  for (size_t i = 0; i < g["objects"].size(); ++i) {
    const json& o = g["objects"][i];
    if (i < subgraphs) {
      d.clusters.push_back(o.value("label", ""));
      continue;
    }
    by_id[o["_gvid"].get<int>()] = o["name"].get<std::string>();
    d.nodes[o["name"].get<std::string>()] = {o.value("label", ""), o.value("tooltip", ""), o.value("fillcolor", "")};
  }
  if (g.contains("edges"))
    for (const json& e : g["edges"]) d.edges.emplace_back(by_id.at(e["tail"].get<int>()), by_id.at(e["head"].get<int>()));
  return d;
}

std::string vname(uint32_t id) { return fmt::format("v{}", id); }

// The numbers N of every "keeps N bytes" in a text.
size_t bytes_in(const std::string& text) {
  size_t total = 0;
  for (size_t at = text.find("keeps "); at != std::string::npos; at = text.find("keeps ", at + 1)) {
    size_t used = 0;
    const std::string rest = text.substr(at + 6);
    if (rest.empty() || !std::isdigit(static_cast<unsigned char>(rest[0]))) continue;
    const size_t n = std::stoull(rest, &used);
    if (rest.compare(used, 6, " bytes") == 0) total += n;
  }
  return total;
}

size_t tape_bytes(const Tape& tape) {
  size_t total = 0;
  for (size_t k = 0; k < tape.num_nodes(); ++k) total += tape.node(k).bytes_kept;
  return total;
}

constexpr const char* kRed = "#f8cecc";

// Ungrouped: a node per value named v<id>, an edge per (input, node) pair, and each op node's label, tooltip and
// bytes; the caption's bytes are the sum of Node::bytes_kept.
void check_drawing(const Tape& tape, const Drawing& d) {
  CHECK(d.nodes.size() == tape.num_values());
  for (uint32_t id = 0; id < tape.num_values(); ++id) CHECK_MESSAGE(d.nodes.count(vname(id)) == 1, vname(id));
  std::vector<std::pair<std::string, std::string>> expected;
  for (size_t k = 0; k < tape.num_nodes(); ++k) {
    const Node& n = tape.node(k);
    for (uint32_t in : n.inputs) expected.emplace_back(vname(in), vname(n.out));
    const DotNode& node = d.nodes.at(vname(n.out));
    CAPTURE(node.label);
    CAPTURE(node.tooltip);
    CHECK(testing::contains(node.label, fmt::format("<b>{}</b>", n.op)));
    CHECK(testing::contains(node.label, tape.value_at(n.out).shape().str()));
    const OpInfo* info = builtin_registry().find(n.op);
    REQUIRE(info != nullptr);
    CHECK(testing::contains(node.tooltip, "VJP: " + info->vjp));
    CHECK(testing::contains(node.tooltip, "JVP: " + info->jvp));
    CHECK(testing::contains(node.tooltip, fmt::format("ops/{}.cpp:{}", info->family, n.where.line())));
    CHECK(testing::contains(node.tooltip, fmt::format("keeps {} bytes", n.bytes_kept)));
  }
  auto actual = d.edges;
  std::sort(actual.begin(), actual.end());
  std::sort(expected.begin(), expected.end());
  CHECK(actual == expected);
  size_t shown = 0;
  for (const auto& [name, node] : d.nodes) shown += bytes_in(node.tooltip);
  CHECK(shown == tape_bytes(tape));
  CHECK(testing::contains(d.caption, fmt::format("({} bytes", tape_bytes(tape))));
}

// The registry's first case of `op` on a fresh tape with every gradient kept, after backward with a random seed.
Var record_case(Tape& tape, const std::string& op, size_t which, bool backward) {
  const GradcheckCase& c = builtin_registry().find(op)->cases.at(which);
  const std::vector<Tensor> xs = make_inputs(c.inputs, DType::f64, 5);
  std::vector<Var> vars;
  for (size_t i = 0; i < xs.size(); ++i) vars.push_back(tape.leaf(xs[i], c.inputs[i].differentiable()));
  tape.set_retain_grads(true);
  Var y = c.build(tape, vars);
  if (backward) tape.backward(y, testing::draw_like(y.shape(), y.dtype(), 6));
  return y;
}

DotOptions with_registry() {
  DotOptions opt;
  opt.registry = &builtin_registry();
  return opt;
}

}  // namespace

TEST_CASE("tape_to_dot: matmul, softmax and attention cases draw one node per value and one edge per input") {
  for (const char* op : {"matmul", "softmax", "attention"}) {
    const size_t cases = builtin_registry().find(op)->cases.size();
    for (size_t i = 0; i < cases; ++i) {
      CAPTURE(op);
      CAPTURE(builtin_registry().find(op)->cases[i].name);
      for (bool backward : {false, true}) {
        Tape tape;
        const Var y = record_case(tape, op, i, backward);
        const std::string dot = tape_to_dot(tape, with_registry());
        const Drawing d = parse(dot);
        check_drawing(tape, d);
        // After backward every value that requires a gradient shows one; before, none does.
        for (uint32_t id = 0; id < tape.num_values(); ++id) {
          const std::string& label = d.nodes.at(vname(id)).label;
          const bool seed = testing::contains(label, "grad (the seed): norm");
          CHECK((testing::contains(label, "grad: norm") || seed) == (backward && tape.requires_grad_at(id)));
          CHECK(seed == (backward && id == y.id()));
        }
        CHECK(testing::contains(dot, "peripheries=2") == backward);  // the loss
      }
    }
  }
}

TEST_CASE("tape_to_dot: x @ x draws two edges from x, and a hand-built chain shows names, kinds and the loss") {
  Tape tape;
  Var x = tape.leaf(testing::random_tensor({3, 3}, 1));
  Var w = tape.param(testing::random_tensor({3, 3}, 2), Tensor::zeros(DType::f64, {3, 3}));
  Var c = tape.constant(testing::random_tensor({3, 3}, 3));
  Var xx = matmul(x, x);
  Var loss = sum(softmax(xx + matmul(w, c)));
  tape.backward(loss);
  DotOptions opt = with_registry();
  opt.names[x.id()] = "x";
  opt.names[w.id()] = "w";
  opt.title = "a title";
  const Drawing d = parse(tape_to_dot(tape, opt));
  check_drawing(tape, d);
  CHECK(std::count(d.edges.begin(), d.edges.end(), std::pair{vname(x.id()), vname(xx.id())}) == 2);
  CHECK(testing::contains(d.nodes.at(vname(x.id())).label, "<b>leaf</b> x"));
  CHECK(testing::contains(d.nodes.at(vname(w.id())).label, "<b>param</b> w"));
  CHECK(testing::contains(d.nodes.at(vname(c.id())).label, "<b>constant</b>"));
  CHECK(testing::contains(d.nodes.at(vname(loss.id())).label, "loss"));
  CHECK(testing::contains(d.caption, "a title"));
  // Gradients of intermediates were not kept (no set_retain_grads): the node says so.
  CHECK(testing::contains(d.nodes.at(vname(xx.id())).label, "not kept"));
  CHECK(testing::contains(d.nodes.at(vname(x.id())).label, "grad: norm"));
}

TEST_CASE("tape_to_dot: a NaN or an infinity in a value or a gradient colours its node red") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tape tape;
  tape.set_retain_grads(true);
  Var a = tape.leaf(Tensor::from<double>({3}, {1, nan, 2}));
  Var x = tape.leaf(Tensor::from<double>({2}, {1, 0}));
  Var y = log(x);  // log 0 = −∞, and its gradient 1/x = +∞ at 0
  Var z = sum(exp(a));
  Var fine = tape.leaf(Tensor::from<double>({2}, {1, 2}));
  Var s = sum(y * fine);
  const Drawing before = parse(tape_to_dot(tape, with_registry()));
  CHECK(before.nodes.at(vname(a.id())).fillcolor == kRed);
  CHECK(before.nodes.at(vname(z.id())).fillcolor == kRed);
  CHECK(before.nodes.at(vname(y.id())).fillcolor == kRed);
  CHECK(before.nodes.at(vname(x.id())).fillcolor != kRed);
  CHECK(before.nodes.at(vname(fine.id())).fillcolor != kRed);
  CHECK(testing::contains(before.nodes.at(vname(a.id())).label, "1 NaN"));
  CHECK(testing::contains(before.nodes.at(vname(y.id())).label, "value: norm 0, min 0, max 0 over the finite ones; 1 -inf"));
  tape.backward(s);
  const Drawing after = parse(tape_to_dot(tape, with_registry()));
  CHECK(after.nodes.at(vname(x.id())).fillcolor == kRed);  // its gradient holds +∞
  CHECK(after.nodes.at(vname(fine.id())).fillcolor == kRed);  // its gradient is log x, with −∞
  CHECK(after.nodes.at(vname(z.id())).fillcolor == kRed);
}

TEST_CASE("tape_to_dot: more nodes than the limit throw, naming --group and fewer layers") {
  Tape tape;
  Var x = tape.leaf(testing::random_tensor({4}, 1));
  for (int i = 0; i < 20; ++i) x = exp(x) * 0.5;
  DotOptions opt;
  opt.max_nodes = 30;
  const std::string msg = testing::error_of([&] { (void)tape_to_dot(tape, opt); });
  CHECK(testing::contains(msg, "41 values to draw, more than the limit of 30"));
  CHECK(testing::contains(msg, "--group"));
  CHECK(testing::contains(msg, "fewer layers"));
  CHECK(msg.find('\n') == std::string::npos);
  opt.max_nodes = 41;
  CHECK_NOTHROW((void)tape_to_dot(tape, opt));
  opt.group = true;  // no scopes: nothing folds
  opt.max_nodes = 30;
  CHECK(testing::contains(testing::error_of([&] { (void)tape_to_dot(tape, opt); }), "fewer layers"));
}

TEST_CASE("tape_to_dot: a one-layer GPT, drawn value by value and grouped by nanoGPT's module names") {
  GPTConfig cfg;
  cfg.n_layer = 1;
  cfg.block_size = 8;
  cfg.n_embd = 16;
  cfg.n_head = 2;
  GPT model(cfg, 3);
  Tensor idx = Tensor::empty(DType::i32, {2, 8}), targets = Tensor::empty(DType::i32, {2, 8});
  Rng rng(4);
  for (int64_t i = 0; i < idx.numel(); ++i) {
    idx.data<int32_t>()[i] = static_cast<int32_t>(rng.below(65));
    targets.data<int32_t>()[i] = static_cast<int32_t>(rng.below(65));
  }
  Tape tape;
  ScopeNames scopes(tape);
  tape.set_retain_grads(true);
  Var loss = model.loss(tape, idx, targets);
  tape.backward(loss);

  // The scopes each node recorded.
  std::map<std::string, std::vector<std::string>> ops_in;
  for (size_t k = 0; k < tape.num_nodes(); ++k)
    ops_in[std::string(scopes.scope_of(tape.node(k).out))].push_back(tape.node(k).op);
  CHECK(ops_in["transformer.wte"] == std::vector<std::string>{"embedding"});
  CHECK(ops_in["transformer.wpe"] == std::vector<std::string>{"embedding"});
  CHECK(ops_in["transformer.h.0.ln_1"] == std::vector<std::string>{"layer_norm"});
  CHECK(ops_in["transformer.h.0.attn"] ==
        std::vector<std::string>{"linear", "split_heads", "split_heads", "split_heads", "attention", "merge_heads",
                                 "linear"});
  CHECK(ops_in["transformer.h.0.mlp"] == std::vector<std::string>{"mlp"});
  CHECK(ops_in["transformer.h.0"] == std::vector<std::string>{"add", "add"});
  CHECK(ops_in["transformer.ln_f"] == std::vector<std::string>{"layer_norm"});
  CHECK(ops_in["lm_head"] == std::vector<std::string>{"linear"});
  CHECK(ops_in[""] == std::vector<std::string>{"add", "cross_entropy"});

  const Drawing flat = parse(tape_to_dot(tape, with_registry()));
  check_drawing(tape, flat);
  CHECK(flat.clusters.empty());

  DotOptions opt = with_registry();
  opt.group = true;
  opt.scopes = &scopes;
  const std::string grouped_dot = tape_to_dot(tape, opt);
  const Drawing grouped = parse(grouped_dot);
  // Boxes: wte, wpe, ln_1, attn, ln_2, mlp, ln_f, lm_head; values: the three adds, the loss and the targets.
  CHECK(grouped.nodes.size() == 13);
  for (const char* scope : {"transformer", "transformer.h.0"})
    CHECK(std::count(grouped.clusters.begin(), grouped.clusters.end(), fmt::format("<b>{}</b>", scope)) == 1);
  size_t shown = 0;
  bool attn = false;
  for (const auto& [name, node] : grouped.nodes) {
    shown += bytes_in(node.tooltip);
    if (testing::contains(node.label, "<b>transformer.h.0.attn</b>")) {
      attn = true;
      CHECK(testing::contains(node.label, "split_heads ×3"));
      CHECK(testing::contains(node.tooltip, "attention VJP: " + builtin_registry().find("attention")->vjp));
      CHECK(testing::contains(node.tooltip, "attention JVP: " + builtin_registry().find("attention")->jvp));
    }
  }
  CHECK(attn);
  CHECK(shown == tape_bytes(tape));
  // The tied head: the token embedding's box feeds lm_head.
  CHECK(testing::contains(grouped_dot, "label=\"(65, 16)\""));
  for (const auto& [tail, head] : grouped.edges) CHECK(tail != head);
}

TEST_CASE("TapeScope names nest with '.', live until clear(), and only label values") {
  Tape tape;
  ScopeNames scopes(tape);
  Var x = tape.leaf(testing::random_tensor({3}, 1));
  Var a, b, c;
  {
    TapeScope outer(tape, "h.0");
    a = exp(x);
    {
      TapeScope inner(tape, "attn");
      b = exp(a);
    }
    {
      TapeScope again(tape, "attn");  // the same name again: the same scope
      c = exp(b);
    }
  }
  Var d = exp(c);
  CHECK(scopes.scope_of(x.id()).empty());
  CHECK(scopes.scope_of(a.id()) == "h.0");
  CHECK(scopes.scope_of(b.id()) == "h.0.attn");
  CHECK(scopes.scope_of(c.id()) == "h.0.attn");
  CHECK(scopes.scope_of(d.id()).empty());
  CHECK(testing::contains(testing::error_of([&] { TapeScope bad(tape, ""); }), "needs a name"));
  CHECK(testing::contains(testing::error_of([&] { (void)scopes.scope_of(99); }), "value #99 does not exist"));
  tape.clear();
  Var e = tape.leaf(testing::random_tensor({3}, 1));
  CHECK(scopes.scope_of(e.id()).empty());
  {
    TapeScope open(tape, "step");
    tape.clear();  // the open scope's name outlives the clear
    Var f = tape.leaf(testing::random_tensor({3}, 1));
    CHECK(scopes.scope_of(f.id()) == "step");
  }
}

TEST_CASE("set_retain_grads keeps every intermediate's gradient; backward_output names the loss") {
  for (bool keep : {false, true}) {
    Tape tape;
    tape.set_retain_grads(keep);
    Var x = tape.leaf(testing::random_tensor({4}, 1));
    Var y = exp(x);
    Var z = y * y;
    Var loss = sum(z);
    CHECK_FALSE(tape.backward_output().has_value());
    tape.backward(loss);
    REQUIRE(tape.backward_output().has_value());
    CHECK(*tape.backward_output() == loss.id());
    CHECK(y.grad().defined() == keep);
    CHECK(z.grad().defined() == keep);
    CHECK(x.grad().defined());
    if (keep) {  // d loss / dy = 2y
      for (int64_t i = 0; i < 4; ++i) CHECK(y.grad().item(i) == doctest::Approx(2 * y.value().item(i)));
    }
    CHECK(tape.is_leaf(x.id()));
    CHECK_FALSE(tape.is_leaf(y.id()));
    CHECK_FALSE(tape.is_param(x.id()));
    tape.clear();
    CHECK_FALSE(tape.backward_output().has_value());
  }
}

TEST_CASE("render_dot: Graphviz's message on bad DOT, in one line") {
  if (!find_dot_program()) FAIL("Graphviz's dot program is not on PATH: install Debian's package graphviz");
  const std::string svg = render_dot("digraph { a -> b }", "svg");
  CHECK(testing::contains(svg, "<svg"));
  const std::string msg = testing::error_of([] { (void)render_dot("digraph { a -> ", "svg"); });
  CHECK(testing::contains(msg, "render_dot: dot -Tsvg failed (exit code 1)"));
  CHECK(msg.find('\n') == std::string::npos);
}
