// tapegrad graph: the tape of a computation drawn by Graphviz (inspect/tape_dot.hpp): an op's gradcheck case, or
// one training step of a small GPT, with the gradients after backward.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/core.h>

#include "checker/gradcheck.hpp"
#include "engine/rng.hpp"
#include "inspect/tape_dot.hpp"
#include "models/files.hpp"
#include "models/gpt.hpp"
#include "models/run_memory.hpp"
#include "ops/ops.hpp"
#include "tools/commands.hpp"

namespace tapegrad::cli {

namespace {

struct GraphArgs {
  std::string op, case_name;
  bool model = false, backward = false, group = false, no_formulas = false, unfused = false;
  std::string format, out;  // format: "" until --format gives one
  size_t max_nodes = DotOptions{}.max_nodes;
  uint64_t seed = GradcheckOptions{}.seed;  // an op case's inputs are the ones tapegrad gradcheck checks
  GPTConfig gpt = [] {
    GPTConfig c;
    c.n_layer = 1;
    return c;
  }();
  int64_t batch_size = 2;
};

std::string quoted_list(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "'" : ", '") + n + "'";
  return s;
}

// --case within --op, --op's first case, or --case searched across every op.
std::pair<const OpSheet*, const GradcheckCase*> find_case(const Registry& registry, const GraphArgs& a) {
  if (!a.op.empty()) {
    const OpSheet* op = registry.find(a.op);
    if (!op) {
      std::string names;
      for (const OpSheet& o : registry.ops()) names += (names.empty() ? "" : ", ") + o.name;
      fail("graph: unknown op '{}'; the ops are {}", a.op, names);
    }
    if (op->cases.empty()) fail("graph: op '{}' has no gradcheck case to draw", a.op);
    if (a.case_name.empty()) return {op, &op->cases.front()};
    std::vector<std::string> names;
    for (const GradcheckCase& c : op->cases) {
      if (c.name == a.case_name) return {op, &c};
      names.push_back(c.name);
    }
    fail("graph: op '{}' has no case '{}'; its cases are {}", a.op, a.case_name, quoted_list(names));
  }
  std::pair<const OpSheet*, const GradcheckCase*> found{nullptr, nullptr};
  std::vector<std::string> owners, all;
  for (const OpSheet& o : registry.ops())
    for (const GradcheckCase& c : o.cases) {
      all.push_back(o.name + ": " + c.name);
      if (c.name != a.case_name) continue;
      if (!found.first) found = {&o, &c};
      owners.push_back(o.name);
    }
  if (owners.size() > 1)
    fail("graph: ops {} each have a case '{}': add --op to choose", quoted_list(owners), a.case_name);
  if (!found.first) fail("graph: no op has a case '{}'; the cases are {}", a.case_name, quoted_list(all));
  return found;
}

// With --unfused: the case's map as the primitive ops it replaces, its own (GradcheckCase::unfused) or the op's
// (OpSheet::unfused, written at the first case's options), checked to be the case's map at its inputs.
Function unfused_form(const OpSheet& op, const GradcheckCase& c, const std::vector<Tensor>& xs) {
  if (!op.unfused && !c.unfused) {
    std::string names;
    for (const OpSheet& o : builtin_registry().ops())
      if (o.unfused) names += (names.empty() ? "" : ", ") + o.name;
    fail("graph: op '{}' has no unfused form; --unfused draws one of {}", op.name, names);
  }
  Function form = unfused_form_at(op, c, xs);
  if (!form)
    fail(
        "graph: {} case '{}' has no unfused form of its own, and the op's, written at the first case's options "
        "('{}'), is not its map: draw that case, or another at the same options",
        op.name, c.name, op.cases.front().name);
  return form;
}

// The case's inputs as leaves (float64, named as the case names them) and its output; backward from the output
// with a random seed gradient ȳ (the gradient of the loss ⟨ȳ, y⟩), or 1 for a scalar.
std::string draw_case(const GraphArgs& a, Tape& tape, DotOptions& opt) {
  const auto [op, c] = find_case(builtin_registry(), a);
  const std::vector<Tensor> xs = make_inputs(c->inputs, DType::f64, a.seed);
  const Function build = a.unfused ? unfused_form(*op, *c, xs) : c->build;
  std::vector<Var> vars;
  for (size_t i = 0; i < xs.size(); ++i) {
    vars.push_back(tape.leaf(xs[i], c->inputs[i].differentiable()));
    opt.names[vars.back().id()] = c->inputs[i].name;
  }
  const Var y = build(tape, vars);
  std::string steps;  // the primitive ops recorded, in order
  for (size_t k = 0; a.unfused && k < tape.num_nodes(); ++k)
    steps += fmt::format("{}{}", k ? ", " : "", tape.node(k).op);
  std::string how = "forward only";
  if (a.backward) {
    if (!y.requires_grad())
      fail("graph: the output of {} case '{}' depends on no differentiable input: there is no backward to draw",
           op->name, c->name);
    if (y.value().numel() == 1) {
      tape.backward(y);
      how = "backward from y";
    } else {
      const std::vector<InputSpec> seed{{"ȳ", y.shape()}};
      tape.backward(y, make_inputs(seed, y.dtype(), a.seed + 1)[0]);
      how = "backward with a random seed gradient ȳ (the loss is ⟨ȳ, y⟩)";
    }
  }
  return fmt::format("{}{}, case '{}': float64 inputs drawn with seed {}; {}", op->name,
                     a.unfused ? fmt::format(" unfused ({})", steps) : "", c->name, a.seed, how);
}

// One training step of a GPT on a batch of random token ids: its loss, and with --backward its gradients.
std::string draw_model(const GraphArgs& a, Tape& tape, DotOptions& opt, std::unique_ptr<GPT>& model) {
  // The step's memory, and the drawing's (a few kilobytes of text per node, some 30 nodes a layer), before any of it
  // is allocated.
  require_memory(
      estimate_training_memory(a.gpt, a.batch_size).total() + 30.0 * 4096 * static_cast<double>(a.gpt.n_layer),
      fmt::format("graph --model (batch {}, context {}, {} layers, {} wide)", a.batch_size, a.gpt.block_size,
                  a.gpt.n_layer, a.gpt.n_embd),
      "draw a smaller model");
  model = std::make_unique<GPT>(a.gpt, a.seed);
  const GPTConfig& cfg = model->config();
  const Shape shape{a.batch_size, cfg.block_size};
  Tensor idx = Tensor::empty(DType::i32, shape), targets = Tensor::empty(DType::i32, shape);
  Rng rng(a.seed);
  for (int64_t i = 0; i < idx.numel(); ++i) {
    idx.data<int32_t>()[i] = static_cast<int32_t>(rng.below(cfg.vocab_size));
    targets.data<int32_t>()[i] = static_cast<int32_t>(rng.below(cfg.vocab_size));
  }
  // With --dropout the step draws its masks as training's first step does.
  const Var loss = model->loss(tape, idx, targets, dropout_seed(cfg, a.seed, 0));
  if (a.backward) tape.backward(loss);
  for (uint32_t id = 0; id < tape.num_values(); ++id) {
    if (!tape.is_leaf(id)) continue;
    const void* data = tape.value_at(id).raw();
    if (data == idx.raw()) opt.names[id] = "idx";
    if (data == targets.raw()) opt.names[id] = "targets";
    for (const Parameter& p : model->parameters())
      if (tape.is_param(id) && data == p.value.raw()) opt.names[id] = p.name;
  }
  return fmt::format(
      "GPT, {} layer{}, {} heads, n_embd {}, {} attention: the loss on {} random sequences of {} "
      "tokens, {}",
      cfg.n_layer, cfg.n_layer > 1 ? "s" : "", cfg.n_head, cfg.n_embd, cfg.attention, a.batch_size, cfg.block_size,
      a.backward ? "forward and backward" : "forward only");
}

// The format to write: --format, else the output's extension (.dot or .gv, .svg, .png), else svg. A --format
// that contradicts the extension, or an extension that names no format drawn here, is refused: g.png must not
// hold SVG.
std::string output_format(const GraphArgs& a) {
  const std::string ext = a.out == "-" ? "" : std::filesystem::path(a.out).extension().string();
  std::string from_ext;
  if (ext == ".dot" || ext == ".gv") from_ext = "dot";
  else if (ext == ".svg" || ext == ".png") from_ext = ext.substr(1);
  else if (!ext.empty() && a.format.empty())
    fail("graph: {}: the extension {} names no format drawn here; use .svg, .png or .dot, or give --format", a.out,
         ext);
  if (!a.format.empty() && !from_ext.empty() && a.format != from_ext)
    fail("graph: --format {} contradicts the output {}, whose extension says {}", a.format, a.out, from_ext);
  return !a.format.empty() ? a.format : !from_ext.empty() ? from_ext : "svg";
}

void run(const GraphArgs& args) {
  GraphArgs a = args;
  a.format = output_format(args);
  if (a.unfused && a.model) fail("graph: --unfused draws an op's case (--op), not the model");
  if (a.model && (!a.op.empty() || !a.case_name.empty()))
    fail("graph: --model draws a GPT and --op/--case an op's case: give one of them");
  if (!a.model && a.op.empty() && a.case_name.empty())
    fail("graph: nothing to draw: give --op NAME, --case NAME or --model");
  const std::string path = a.out.empty() ? "graph." + a.format : a.out;
  if (path != "-") refuse_replacing_run_files(path, "graph: -o");  // before the drawing's work
  const bool rendered = a.format != "dot";
  if (rendered && !find_dot_program())
    fail(
        "graph: --format {} needs Graphviz's dot program, which is not on PATH: install Debian's package graphviz "
        "(apt-get install graphviz), or use --format dot, which works without it",
        a.format);

  Tape tape;
  tape.set_retain_grads(true);      // every value's gradient is drawn
  AllocationLog allocations(tape);  // what each node keeps
  ScopeNames scopes(tape);          // and the scope each value was made in
  DotOptions opt;
  opt.allocations = &allocations;
  opt.scopes = &scopes;
  opt.registry = &builtin_registry();
  opt.group = a.group;
  opt.formulas = !a.no_formulas;
  opt.max_nodes = a.max_nodes;
  std::unique_ptr<GPT> model;  // its parameters are on the tape
  opt.title = a.model ? draw_model(a, tape, opt, model) : draw_case(a, tape, opt);

  const std::string dot = tape_to_dot(tape, opt);
  const std::string bytes = rendered ? render_dot(dot, a.format) : dot;
  if (path == "-") {
    if (std::fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size() || std::fflush(stdout) != 0)
      fail("graph: cannot write the {} to standard output", a.format);
    return;
  }
  write_file_atomic(path, bytes);
  if (output_descriptor(path) == STDOUT_FILENO) return;  // -o /dev/stdout: the stream holds the graph alone
  fmt::print("wrote {}: {} values, {} op{}\n", path, tape.num_values(), tape.num_nodes(),
             tape.num_nodes() == 1 ? "" : "s");
}

}  // namespace

void add_graph_command(CLI::App& app) {
  auto args = std::make_shared<GraphArgs>();
  CLI::App* cmd = app.add_subcommand(
      "graph",
      "Draw the tape of a computation with Graphviz: an op's gradcheck case (--op, --case) or one training "
      "step of a small GPT (--model); each node shows its shape, the bytes it keeps for backward and the norm, "
      "min and max of its value and (--backward) its gradient, in full for a few elements, and each op's VJP; hovering "
      "shows its JVP and source line");
  cmd->add_option("--op", args->op, "An op of tapegrad gradcheck --list: draws its first case (or --case)");
  cmd->add_option("--case", args->case_name, "A gradcheck case by name, of --op or of whichever op has it");
  cmd->add_flag("--unfused", args->unfused,
                "Draw a fused op (attention, mlp, layer_norm, ...) as the primitive ops it replaces, the same map");
  cmd->add_flag("--model", args->model, "One training step of a GPT (the options below) on random token ids");
  cmd->add_flag("--backward", args->backward,
                "Run backward first, keeping every gradient; an op case's seed gradient is random (a scalar's is 1)");
  cmd->add_flag("--group", args->group,
                "Fold each innermost scope (the GPT's transformer.h.0.attn, mlp, ...) into one box");
  cmd->add_flag("--no-formulas", args->no_formulas,
                "Leave each op's VJP out of its node's label (it stays in the SVG's tooltip)");
  cmd->add_option("--format", args->format,
                  "dot needs nothing; svg and png run Graphviz's dot (default: from --output's extension, else svg)")
      ->check(CLI::IsMember({"dot", "svg", "png"}));
  cmd->add_option("-o,--output", args->out,
                  "The file to write (default graph.FORMAT; - for standard output); .dot/.gv, .svg or .png set the "
                  "format. An existing file in a run's directory (one holding checkpoint.safetensors) is not replaced")
      ->check(CLI::Validator(
          [](std::string& path) { return path.empty() ? std::string("an empty path names no file") : std::string(); },
          "", ""));
  cmd->add_option("--max-nodes", args->max_nodes, "Refuse to draw more nodes than this (Graphviz slows down)")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--seed", args->seed,
                  "Seed of the inputs (by default gradcheck's: the inputs it checks), the seed gradient, the model and "
                  "its batch")
      ->capture_default_str();
  add_model_options(cmd, args->gpt, true, "--model: ");
  cmd->add_option("--batch-size", args->batch_size, "--model: Sequences in the batch")
      ->capture_default_str()
      ->check(positive());
  cmd->callback([args] { run(*args); });
}

}  // namespace tapegrad::cli
