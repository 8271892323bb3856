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

#include "inspect/heat_map.hpp"
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
  std::map<std::string, DotNode> nodes;                    // by DOT name
  std::vector<std::pair<std::string, std::string>> edges;  // tail, head
  std::vector<std::string> clusters;                       // cluster labels
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
    for (const json& e : g["edges"])
      d.edges.emplace_back(by_id.at(e["tail"].get<int>()), by_id.at(e["head"].get<int>()));
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
    const OpSheet* info = builtin_registry().find(n.op);
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
  CHECK(testing::contains(before.nodes.at(vname(y.id())).label,
                          "value: norm 0, min 0, max 0 over the finite ones; 1 -inf"));
  tape.backward(s);
  const Drawing after = parse(tape_to_dot(tape, with_registry()));
  CHECK(after.nodes.at(vname(x.id())).fillcolor == kRed);     // its gradient holds +∞
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

TEST_CASE("tape_to_dot: a tensor of at most full_values elements is drawn in full, a larger one as norm, min, max") {
  Tape tape;
  tape.set_retain_grads(true);
  Var x = tape.leaf(Tensor::from<double>({2, 3}, {1, 2, 3, 4, 5, 6}));
  Var wide = tape.leaf(Tensor::from<double>({10}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  Var big = tape.leaf(Tensor::full(DType::f64, {17}, 0.5));
  Var total = sum(scale(x, 2)) + sum(wide) + sum(big);
  tape.backward(total);
  const Drawing d = parse(tape_to_dot(tape, with_registry()));
  const std::string& xl = d.nodes.at(vname(x.id())).label;
  CAPTURE(xl);
  // Each row of the last axis on a line of its own, the value's norm above them; its gradient, 2 everywhere, too.
  CHECK(testing::contains(xl, fmt::format("value: norm {:.3g}", std::sqrt(91.0))));
  CHECK(testing::contains(xl, ">[1, 2, 3]<"));
  CHECK(testing::contains(xl, ">[4, 5, 6]<"));
  CHECK(testing::contains(xl, ">grad: norm "));
  CHECK(std::count(xl.begin(), xl.end(), '[') == 4);
  CHECK(testing::contains(xl, ">[2, 2, 2]<"));
  // A row of more than 8 numbers goes on over the next line.
  const std::string& wl = d.nodes.at(vname(wide.id())).label;
  CAPTURE(wl);
  CHECK(testing::contains(wl, ">[1, 2, 3, 4, 5, 6, 7, 8, <"));
  CHECK(testing::contains(wl, "> 9, 10]<"));
  // 17 elements: norm, min and max, as before.
  const std::string& bl = d.nodes.at(vname(big.id())).label;
  CHECK(testing::contains(bl, "value: norm 2.06, min 0.5, max 0.5"));
  CHECK(!testing::contains(bl, "["));
  // A single number alone, the seed of the scalar loss too.
  const std::string& tl = d.nodes.at(vname(total.id())).label;
  CHECK(testing::contains(tl, ">value: 106<"));
  CHECK(testing::contains(tl, ">grad (the seed): 1<"));
  // full_values = 0: every tensor as norm, min and max.
  DotOptions opt = with_registry();
  opt.full_values = 0;
  const Drawing summarized = parse(tape_to_dot(tape, opt));
  CHECK(testing::contains(summarized.nodes.at(vname(x.id())).label, "value: norm 9.54, min 1, max 6"));
  CHECK(testing::contains(summarized.nodes.at(vname(total.id())).label, "value: norm 106, min 106, max 106"));
}

TEST_CASE("tape_to_dot: a larger tensor of few enough rows is a heat map too, its matrices side by side") {
  CHECK(heat_colour(-2, 2) == "#2166ac");
  CHECK(heat_colour(0, 2) == "#ffffff");
  CHECK(heat_colour(2, 2) == "#b2182b");
  CHECK(heat_colour(1, 2) == "#d98c95");  // halfway to red
  CHECK(heat_colour(5, 0) == "#ffffff");  // an all-zero tensor is white
  Tape tape;
  Var scores = tape.leaf(Tensor::randn(DType::f64, {2, 3, 4, 5}, 7));
  Var wide = tape.leaf(Tensor::randn(DType::f64, {65, 2}, 8));  // 65 rows: more than heat_map_side
  Tensor with_nan = Tensor::randn(DType::f64, {4, 5}, 9);
  with_nan.data<double>()[3] = std::numeric_limits<double>::quiet_NaN();
  Var bad = tape.leaf(with_nan);
  Var total = sum(scores) + sum(wide) + sum(bad);
  tape.backward(total);
  const std::string dot = tape_to_dot(tape, with_registry());
  const Drawing d = parse(dot);
  const std::string& sl = d.nodes.at(vname(scores.id())).label;
  CAPTURE(sl);
  CHECK(testing::contains(sl, "heat map ±"));
  CHECK(testing::contains(sl, ": 6 matrices of 4 × 5"));
  const std::optional<HeatMap> map = heat_map(scores.value(), 64);
  REQUIRE(map);
  CHECK(map->slices == 6);
  CHECK(map->rows == 4);
  CHECK(map->cols == 5);
  size_t coloured = 0;  // one coloured cell per element, a blank cell between two matrices on each row
  for (size_t at = map->table.find("BGCOLOR"); at != std::string::npos; at = map->table.find("BGCOLOR", at + 1))
    ++coloured;
  CHECK(coloured == 120);
  CHECK(testing::contains(dot, map->table));
  // too many rows, or a NaN: its norm, min and max alone
  CHECK_FALSE(testing::contains(d.nodes.at(vname(wide.id())).label, "heat map"));
  const std::string& nan_label = d.nodes.at(vname(bad.id())).label;  // its gradient, all ones, has one
  CHECK(nan_label.find("heat map ±") == nan_label.rfind("heat map ±"));
  CHECK(nan_label.find("heat map ±") > nan_label.find("grad: "));
  CHECK_FALSE(heat_map(wide.value(), 64));
  CHECK_FALSE(heat_map(bad.value(), 64));
  // the legend says how to read them, and what Σ_bcast and matmul's indices are
  CHECK(testing::contains(d.caption, "heat maps: one cell per element"));
  DotOptions none = with_registry();
  none.heat_map_side = 0;
  CHECK_FALSE(testing::contains(tape_to_dot(tape, none), "heat map"));
  Tape products;
  Var a = products.leaf(Tensor::randn(DType::f64, {3, 4}, 1)), b = products.leaf(Tensor::randn(DType::f64, {4, 2}, 2));
  const Drawing m = parse(tape_to_dot(
      (sum(matmul(a, b) + products.leaf(Tensor::randn(DType::f64, {2}, 3)), 0), products), with_registry()));
  CHECK(testing::contains(m.caption, "Σ_bcast: the sum over the axes along which an input was broadcast"));
  CHECK(testing::contains(m.caption, "matmul: y_β = a_α·b_γ"));
  CHECK(testing::contains(m.caption, "sum: y[o,i] = Σ_j x[o,j,i]"));
}

namespace {

// The lines of a label (as Graphviz reads it back) drawn in `colour`, without their markup.
std::vector<std::string> lines_in(const std::string& label, const std::string& colour) {
  std::vector<std::string> out;
  const std::string open = fmt::format("color=\"{}\">", colour);
  for (size_t at = label.find(open); at != std::string::npos; at = label.find(open, at + 1)) {
    const size_t begin = at + open.size();
    out.push_back(label.substr(begin, label.find('<', begin) - begin));
  }
  return out;
}

size_t characters(const std::string& s) {
  return static_cast<size_t>(
      std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

}  // namespace

TEST_CASE(
    "tape_to_dot: each op's VJP is lines of its label, wrapped near 48 characters; formulas = false leaves it "
    "to the tooltip") {
  Tape tape;
  const Var o = record_case(tape, "attention", 0, true);
  Var logits = tape.leaf(testing::random_tensor({2, 3}, 3));
  Var y = softmax(logits);
  const Drawing d = parse(tape_to_dot(tape, with_registry()));
  for (size_t k = 0; k < tape.num_nodes(); ++k) {
    const Node& n = tape.node(k);
    const std::string& label = d.nodes.at(vname(n.out)).label;
    CAPTURE(label);
    const std::vector<std::string> lines = lines_in(label, "#1f3f73");
    REQUIRE(!lines.empty());
    std::string joined;
    for (const std::string& line : lines) {
      joined += (joined.empty() ? "" : " ") + line;
      CHECK((characters(line) <= 48 || line.find(' ') == std::string::npos));
    }
    CHECK(joined == "VJP: " + builtin_registry().find(n.op)->vjp);
  }
  CHECK(lines_in(d.nodes.at(vname(0)).label, "#1f3f73").empty());           // a leaf has none
  CHECK(lines_in(d.nodes.at(vname(o.id())).label, "#1f3f73").size() >= 2);  // attention's VJP is wrapped
  CHECK(testing::contains(d.caption, "boxes: ops with their VJPs"));
  DotOptions opt = with_registry();
  opt.formulas = false;
  const Drawing plain = parse(tape_to_dot(tape, opt));
  for (const auto& [name, node] : plain.nodes) {
    CHECK(lines_in(node.label, "#1f3f73").empty());
    CHECK(!testing::contains(node.label, "VJP"));
  }
  CHECK(testing::contains(plain.nodes.at(vname(y.id())).tooltip, "VJP: " + builtin_registry().find("softmax")->vjp));
}

TEST_CASE("tape_to_dot: the hints name C++'s calls, or Python's for a tape recorded from Python") {
  Tape tape;
  Var x = tape.leaf(testing::random_tensor({3}, 1));
  Var e = exp(x);
  tape.backward(sum(e));
  DotOptions opt = with_registry();
  const std::string cpp = parse(tape_to_dot(tape, opt)).nodes.at(vname(e.id())).label;
  CHECK(testing::contains(cpp, "grad: not kept (Tape::set_retain_grads keeps it)"));
  opt.caller = DotOptions::Caller::python;
  const std::string dot = tape_to_dot(tape, opt);
  CHECK(testing::contains(parse(dot).nodes.at(vname(e.id())).label, "grad: not kept (tape.retain_grad(v) keeps it)"));
  CHECK(!testing::contains(dot, "Tape::"));
  opt.max_nodes = 2;
  const std::string msg = testing::error_of([&] { (void)tape_to_dot(tape, opt); });
  CHECK(testing::contains(msg, "tapegrad.graph(tape, path, max_nodes=N)"));
  CHECK(!testing::contains(msg, "--group"));
  CHECK(!testing::contains(msg, "DotOptions"));
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
  CHECK(ops_in["transformer.h.0.attn"] == std::vector<std::string>{"linear", "attention_qkv", "linear"});
  CHECK(ops_in["transformer.h.0.mlp"] == std::vector<std::string>{"mlp"});
  // The block's two residual adds happen in c_proj's linear and in the mlp (no dropout): no node of its own scope.
  CHECK(ops_in.count("transformer.h.0") == 0);
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
  // Boxes: wte, wpe, ln_1, attn, ln_2, mlp, ln_f, lm_head; values: the embeddings' add, the loss and the targets.
  CHECK(grouped.nodes.size() == 11);
  for (const char* scope : {"transformer", "transformer.h.0"})
    CHECK(std::count(grouped.clusters.begin(), grouped.clusters.end(), fmt::format("<b>{}</b>", scope)) == 1);
  size_t shown = 0;
  bool attn = false;
  for (const auto& [name, node] : grouped.nodes) {
    shown += bytes_in(node.tooltip);
    if (testing::contains(node.label, "<b>transformer.h.0.attn</b>")) {
      attn = true;
      CHECK(testing::contains(node.label, "linear ×2"));
      CHECK(testing::contains(node.tooltip, "attention_qkv VJP: " + builtin_registry().find("attention_qkv")->vjp));
      CHECK(testing::contains(node.tooltip, "attention_qkv JVP: " + builtin_registry().find("attention_qkv")->jvp));
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
