#include "checker/explain.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/core.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checker/second_order.hpp"

namespace tapegrad {

namespace {

// The section that derives the second-order rules, as a whole.
constexpr std::string_view kSecondOrderSection = "6";

// A sheet's list of section numbers, "2.1, 1.1" → {"2.1", "1.1"}.
std::vector<std::string> section_numbers(const std::string& list) {
  std::vector<std::string> numbers;
  for (size_t start = 0; start < list.size();) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string n = list.substr(start, end - start);
    n.erase(0, n.find_first_not_of(' '));
    n.erase(n.find_last_not_of(' ') + 1);
    if (!n.empty()) numbers.push_back(n);
    start = end + 1;
  }
  return numbers;
}

// "2.1, 1.1" → the headings "### 2.1 ..." (or "## 6. ...") of the derivations file, or the numbers where it cannot
// be read.
std::vector<std::string> derivation_sections(const std::string& numbers, const std::string& path, bool& read) {
  const std::vector<std::string> wanted = section_numbers(numbers);
  std::vector<std::string> found;
  std::vector<std::string> headings;
  if (!path.empty()) {
    std::ifstream in(path);
    read = static_cast<bool>(in);
    for (std::string line; std::getline(in, line);)
      if (line.starts_with("### ") || line.starts_with("## ")) headings.push_back(line.substr(line.find(' ') + 1));
  }
  for (const std::string& n : wanted) {
    auto h = std::find_if(headings.begin(), headings.end(),
                          [&](const std::string& t) { return t.starts_with(n + " ") || t.starts_with(n + ". "); });
    found.push_back(h == headings.end() ? n : *h);
  }
  return found;
}

#ifndef TAPEGRAD_SOURCE_DIR
#define TAPEGRAD_SOURCE_DIR ""
#endif

bool identifier_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// The heading ("2. Softmax's Jacobian ...") of the section of the learner's walk-through (learn_path) that runs
// `tapegrad explain OP`; "" where none does or the file cannot be read.
std::string learn_section(const std::string& op, const std::string& learn_path) {
  std::ifstream in(learn_path);
  const std::string command = "tapegrad explain " + op;
  std::string heading;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("## ")) heading = line.substr(3);
    for (size_t at = line.find(command); at != std::string::npos; at = line.find(command, at + 1)) {
      const size_t end = at + command.size();
      if (!heading.empty() && (end == line.size() || !identifier_char(line[end]))) return heading;
    }
  }
  return "";
}

// The source trees to look in: the one asked for, the one holding docs/derivations.md (the share folder's copy is
// a link into the sources in a build tree), the one the library was built from.
std::vector<std::filesystem::path> source_roots(const ExplainOptions& options) {
  namespace fs = std::filesystem;
  std::vector<fs::path> roots;
  if (!options.source_dir.empty()) roots.emplace_back(options.source_dir);
  if (!options.derivations_path.empty()) {
    std::error_code ec;
    const fs::path docs = fs::canonical(options.derivations_path, ec);
    if (!ec) roots.push_back(docs.parent_path().parent_path());
  }
  if (std::string_view(TAPEGRAD_SOURCE_DIR) != "") roots.emplace_back(TAPEGRAD_SOURCE_DIR);
  return roots;
}

// "file:line" of the first definition of `function` in `file` (from a tree's top folder), or "file" alone.
std::string function_place(const std::vector<std::filesystem::path>& roots, const std::string& file,
                           const std::string& function) {
  for (const auto& root : roots)
    if (const int line = line_of_function((root / file).string(), function); line > 0)
      return fmt::format("{}:{}", file, line);
  return file;
}

// The last line of `path` that holds `text`, 0 if none.
int last_line_with(const std::string& path, const std::string& text) {
  std::ifstream in(path);
  int found = 0, n = 0;
  for (std::string line; std::getline(in, line);)
    if (++n, line.find(text) != std::string::npos) found = n;
  return found;
}

// Where the op's sheet is: its registration's place when one was taken, else the last line of its family's file
// (or of the node's own file, for ops outside tapegrad) that names it in quotes; the file alone if none does.
std::string sheet_place(const OpSheet& info, const std::vector<std::filesystem::path>& roots,
                        const SourcePlace& recorded) {
  if (info.registered_at.line() != 0) return source_text(info.registered_at);
  const std::string quoted = "\"" + info.name + "\"";
  const std::string file = "ops/" + info.family + ".cpp";
  for (const auto& root : roots)
    if (const int line = last_line_with((root / file).string(), quoted); line > 0)
      return fmt::format("{}:{}", file, line);
  if (recorded.line() != 0) {
    std::string at = source_text(recorded);
    at.erase(at.rfind(':'));
    if (const int line = last_line_with(recorded.file_name(), quoted); line > 0) return fmt::format("{}:{}", at, line);
    return at;
  }
  return file;
}

}  // namespace

std::pair<std::string, Shape> parse_named_shape(std::string_view option, std::string_view text) {
  const auto eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0)
    fail("{}: expected NAME=D,D,... (an input's name and its dimensions), got '{}'", option, text);
  std::vector<int64_t> dims;
  std::string_view rest = text.substr(eq + 1);
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view d = rest.substr(0, comma);
    int64_t v = 0;
    if (d.empty() || d.size() > 9 || d.find_first_not_of("0123456789") != std::string_view::npos)
      fail("{}: '{}' in '{}' is not a dimension (a whole number below 10⁹)", option, d, text);
    for (char ch : d) v = v * 10 + (ch - '0');
    dims.push_back(v);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (comma != std::string_view::npos && rest.empty()) fail("{}: '{}' ends with a comma", option, text);
  }
  if (dims.size() > static_cast<size_t>(Shape::kMaxRank))
    fail("{}: '{}' has {} dimensions; at most {}", option, text, dims.size(), Shape::kMaxRank);
  double elements = 1;
  for (int64_t d : dims) elements *= static_cast<double>(d);
  if (elements > 1e12) fail("{}: '{}' has {:.3g} elements", option, text, elements);
  return {std::string(text.substr(0, eq)), Shape(std::span<const int64_t>(dims))};
}

int line_of_function(const std::string& path, const std::string& function) {
  std::ifstream in(path);
  const std::string call = function + "(";
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    const size_t code = line.find_first_not_of(' ');
    if (code == std::string::npos || line.compare(code, 2, "//") == 0) continue;
    const size_t comment = line.find("//");
    for (size_t at = line.find(call); at != std::string::npos && at < comment; at = line.find(call, at + 1))
      if (at == 0 || !identifier_char(line[at - 1])) return n;
  }
  return 0;
}

int64_t Explanation::alignment_padding() const {
  int64_t listed = 0;
  for (const Allocation& a : kept) listed += static_cast<int64_t>(a.bytes);
  return bytes_kept - listed;
}

std::vector<InputSpec> inputs_at_shapes(const GradcheckCase& c, std::string_view op,
                                        std::span<const std::pair<std::string, Shape>> shapes, int64_t max_elements,
                                        std::string_view command) {
  std::vector<InputSpec> specs = c.inputs;
  for (const auto& entry : shapes) {
    const std::string& name = entry.first;  // not a structured binding: Clang 14 cannot capture one in a lambda
    const Shape& shape = entry.second;
    auto it = std::find_if(specs.begin(), specs.end(), [&](const InputSpec& s) { return s.name == name; });
    if (it == specs.end()) {
      std::vector<std::string> names;
      for (const auto& s : specs) names.push_back(s.name);
      fail("{}: case '{}' of '{}' has no input '{}'; its inputs are {}", command, c.name, op, name,
           fmt::join(names, ", "));
    }
    if (shape.numel() > max_elements)
      fail("{}: input '{}' of shape {} has {} elements; at most {} for {}", command, name, shape, shape.numel(),
           max_elements, command);
    it->shape = shape;
  }
  return specs;
}

Explanation explain(const Registry& registry, std::string_view op, const ExplainOptions& options) {
  const OpSheet* info = registry.find(op);
  if (!info) {
    std::vector<std::string> names;
    for (const auto& o : registry.ops()) names.push_back(o.name);
    fail("explain: no op '{}'; the registered ops are {}", op, fmt::join(names, ", "));
  }
  if (info->cases.empty()) fail("explain: op '{}' has no gradcheck case to run", op);
  const GradcheckCase* c = &info->cases.front();
  if (!options.case_name.empty()) {
    auto it = std::find_if(info->cases.begin(), info->cases.end(),
                           [&](const GradcheckCase& x) { return x.name == options.case_name; });
    if (it == info->cases.end()) {
      std::vector<std::string> names;
      for (const auto& x : info->cases) names.push_back("'" + x.name + "'");
      fail("explain: op '{}' has no case '{}'; its cases are {}", op, options.case_name, fmt::join(names, ", "));
    }
    c = &*it;
  }
  // explain runs the case in float64 with finite differences per element: keep it to a screenful of work
  const std::vector<InputSpec> specs = inputs_at_shapes(*c, info->name, options.shapes, int64_t{1} << 20, "explain");

  Explanation e;
  e.op = info->name;
  e.family = info->family;
  e.forward = info->forward;
  e.vjp = info->vjp;
  e.jvp = info->jvp;
  e.second_order = info->second_order;
  bool read = false;
  e.sections = derivation_sections(info->derivation, options.derivations_path, read);
  e.derived_in = info->derived_in;
  const std::string section = !info->second_order_derivation.empty()     ? info->second_order_derivation
                              : info->second_order == kNoSecondOrderTerm ? "6.1"
                                                                         : std::string(kSecondOrderSection);
  e.second_order_section = derivation_sections(section, options.derivations_path, read).front();
  if (read) e.derivations_file = options.derivations_path;
  if (!options.derivations_path.empty())  // the learner's pages beside derivations.md: the first that walks it
    for (const char* page : {"learn.md", "reverse-mode.md"}) {
      const std::string learn = (std::filesystem::path(options.derivations_path).parent_path() / page).string();
      e.learn_section = learn_section(info->name, learn);
      if (e.learn_section.empty()) continue;
      e.learn_file = learn;
      break;
    }
  const std::vector<std::filesystem::path> roots = source_roots(options);
  for (const FormulaPlace& f : info->formulas_at)
    e.formulas_at.push_back({f.what, function_place(roots, f.file, f.function), f.function});
  e.case_name = c->name;
  e.shapes_given = !options.shapes.empty();
  for (const auto& s : specs) e.inputs.emplace_back(s.name, s.shape);

  // The node in float32, as it trains: what it keeps, and its cost at these shapes.
  {
    Tape tape;
    AllocationLog log(tape);
    std::vector<Tensor> xs = make_inputs(specs, DType::f32, options.gradcheck.seed);
    std::vector<Var> vars;
    for (size_t i = 0; i < xs.size(); ++i) vars.push_back(tape.leaf(xs[i], specs[i].differentiable()));
    c->build(tape, vars);
    for (size_t i = 0; i < tape.num_nodes(); ++i) {
      const Node& n = tape.node(i);
      if (n.op != info->name) continue;
      if (e.nodes++ == 0) {
        e.recorded_at = source_text(n.where);
        e.registered_at = sheet_place(*info, roots, n.where);
      }
      e.bytes_kept += static_cast<int64_t>(n.bytes_kept);
      const Scratch::Reservation r = scratch_reserved_by(tape, i);
      e.scratch_first_order = std::max(e.scratch_first_order, static_cast<int64_t>(r.first_order));
      e.scratch_second_order = std::max(e.scratch_second_order, static_cast<int64_t>(r.second_order));
      for (const Allocation& a : log.of(i)) e.kept.push_back(a);
      e.output = tape.value_at(n.out).shape();
      if (info->cost) {
        std::vector<Shape> in;
        for (uint32_t id : n.inputs) in.push_back(tape.value_at(id).shape());
        const OpCost k = info->cost(in, e.output);
        if (!e.cost) e.cost = OpCost{};
        e.cost->forward += k.forward;
        e.cost->backward += k.backward;
        e.cost->jvp += k.jvp;
      }
    }
    if (e.nodes == 0) fail("explain: case '{}' of '{}' records no '{}' node", c->name, op, op);
  }
  GradcheckCase at_shapes = *c;  // the registered case, at the shapes asked for
  at_shapes.inputs = specs;
  e.check = gradcheck(at_shapes, options.gradcheck, info->name);
  e.check_second_order = gradcheck_second_order(at_shapes, options.gradcheck, info->name);
  return e;
}

namespace {

// A table cell: '|' escaped, never empty.
std::string cell(const std::string& text) {
  std::string c;
  for (char ch : text) c += ch == '|' ? std::string("\\|") : std::string(1, ch);
  return c.empty() ? "—" : c;
}

// "§2.1, §1.1; 2nd order §6.4" from a sheet's section numbers.
std::string sections_of(const OpSheet& op) {
  std::string s;
  for (const std::string& n : section_numbers(op.derivation)) s += (s.empty() ? "§" : ", §") + n;
  const std::string second = !op.second_order_derivation.empty()     ? op.second_order_derivation
                             : op.second_order == kNoSecondOrderTerm ? "6.1"
                                                                     : std::string(kSecondOrderSection);
  if (s.empty()) s = op.derived_in.empty() ? "textbook" : "`" + op.derived_in + "`";
  return s + "; 2nd order §" + second;
}

}  // namespace

std::string index_markdown(const Registry& registry) {
  std::string s = "| op | file | forward | VJP | JVP | second order | derived in |\n|---|---|---|---|---|---|---|\n";
  for (const OpSheet& op : registry.ops())
    s += fmt::format("| `{}` | `ops/{}.cpp` | {} | {} | {} | {} | {} |\n", op.name, op.family, cell(op.forward),
                     cell(op.vjp), cell(op.jvp), cell(op.second_order), sections_of(op));
  return s;
}

namespace {

std::string flops(double f) {
  if (f >= 1e9) return fmt::format("{:.3g} GFLOP", f / 1e9);
  if (f >= 1e6) return fmt::format("{:.3g} MFLOP", f / 1e6);
  if (f >= 1e3) return fmt::format("{:.3g} kFLOP", f / 1e3);
  return fmt::format("{:.0f} FLOP", f);
}

std::string bytes(int64_t b) {
  if (b >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20));
  if (b >= 1024) return fmt::format("{:.1f} KiB", static_cast<double>(b) / 1024);
  return fmt::format("{} bytes", b);
}

}  // namespace

std::string format_explanation(const Explanation& e) {
  std::string s = fmt::format("{} ({})\n", e.op, e.family);
  s += fmt::format("  forward    {}\n", e.forward.empty() ? "(not given at registration)" : e.forward);
  s += fmt::format("  VJP        {}\n", e.vjp.empty() ? "(not given at registration)" : e.vjp);
  s += fmt::format("  JVP        {}\n", e.jvp.empty() ? "(not given at registration)" : e.jvp);
  s += fmt::format("  2nd order  {}\n", e.second_order.empty() ? "(not given at registration)" : e.second_order);
  s += fmt::format("  code       {} (the node: forward, VJP and JVP); registered at {}\n", e.recorded_at,
                   e.registered_at);
  if (!e.formulas_at.empty()) {
    // One kernel a line: "  kernels    VJP  ops/attention/softmax.cpp:66 (attention_vjp)".
    auto characters = [](const std::string& text) {  // UTF-8: every byte but a continuation byte starts one
      return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) { return (c & 0xC0) != 0x80; }));
    };
    size_t width = 0;
    for (const FormulaLocation& f : e.formulas_at) width = std::max(width, characters(f.what));
    for (size_t i = 0; i < e.formulas_at.size(); ++i) {
      const FormulaLocation& f = e.formulas_at[i];
      s += fmt::format("  {} {}{}  {} ({})\n", i == 0 ? "kernels   " : "          ", f.what,
                       std::string(width - characters(f.what), ' '), f.at, f.function);
    }
  }
  if (!e.derived_in.empty()) s += fmt::format("  derivation {} (the comment at its top)\n", e.derived_in);
  else if (e.sections.empty())
    s += fmt::format("  derivation a textbook rule (no section in {})\n", e.derivations_file);
  for (size_t i = 0; i < e.sections.size(); ++i)
    s += fmt::format("  {} {} § {}\n", i == 0 ? "derivation" : "          ", e.derivations_file, e.sections[i]);
  s += fmt::format("  2nd order  {} § {}\n", e.derivations_file, e.second_order_section);
  if (!e.learn_section.empty()) s += fmt::format("  learn      {} § {}\n", e.learn_file, e.learn_section);
  std::string in;
  for (const auto& [name, shape] : e.inputs) in += fmt::format("{}{} {}", in.empty() ? "" : ", ", name, shape.str());
  s += fmt::format("\nat case '{}'{}: inputs {} → output {}\n", e.case_name,
                   e.shapes_given ? " (its map, at the shapes given)" : "", in, e.output.str());
  s += fmt::format("  keeps      {} in float32 for backward ({} node{}: the output and what its VJP and JVP reuse)\n",
                   bytes(e.bytes_kept), e.nodes, e.nodes == 1 ? "" : "s");
  for (const Allocation& a : e.kept)
    s += fmt::format("             {:<28} {} {:<16} {}\n", a.what ? a.what : "(unnamed)", a.dtype, a.shape.str(),
                     bytes(static_cast<int64_t>(a.bytes)));
  if (const int64_t padding = e.alignment_padding(); padding != 0)
    s += fmt::format("             {:<28} {:<24} {}\n", "alignment padding", "(64-byte arena blocks)", bytes(padding));
  if (e.scratch_first_order != 0 || e.scratch_second_order != 0)
    s += fmt::format(
        "  scratch    {} while its forward, VJP or JVP runs, {} while its second-order rule runs (the "
        "tape's one scratch, shared by all its nodes: not kept)\n",
        bytes(e.scratch_first_order), bytes(e.scratch_second_order));
  if (e.cost)
    s += fmt::format("  FLOPs      forward {}, VJP {}, JVP {}\n", flops(e.cost->forward), flops(e.cost->backward),
                     flops(e.cost->jvp));
  else s += "  FLOPs      not counted (the op registers no cost function)\n";
  s += "\ngradcheck, float64, there and then:\n";
  s += e.check.str();
  s += "\nsecond order (H·t by Tape::hvp against differences of the gradient; ⟨w, H v⟩ = ⟨v, H w⟩):\n";
  s += e.check_second_order.str();
  return s;
}

nlohmann::json explanation_json(const Explanation& e) {
  nlohmann::json inputs = nlohmann::json::array();
  for (const auto& [name, shape] : e.inputs) inputs.push_back({{"name", name}, {"shape", shape.str()}});
  auto report_json = [](const GradcheckReport& r) {
    nlohmann::json checks = nlohmann::json::array();
    for (const auto& c : r.checks)
      checks.push_back({{"input", c.input},
                        {"check", c.check},
                        {"max_abs_err", c.max_abs_err},
                        {"max_rel_err", c.max_rel_err},
                        {"passed", c.passed},
                        {"skipped", c.skipped}});
    nlohmann::json diagnoses = nlohmann::json::array();
    for (const auto& d : r.diagnoses) diagnoses.push_back(d.str());
    return nlohmann::json{{"passed", static_cast<bool>(r.passed)}, {"checks", checks}, {"diagnoses", diagnoses}};
  };
  return {
      {"op", e.op},
      {"family", e.family},
      {"forward", e.forward},
      {"vjp", e.vjp},
      {"jvp", e.jvp},
      {"second_order", e.second_order},
      {"second_order_derivation", e.second_order_section},
      {"recorded_at", e.recorded_at},
      {"registered_at", e.registered_at},
      {"formulas_at",
       [&] {
         nlohmann::json f = nlohmann::json::array();
         for (const FormulaLocation& p : e.formulas_at)
           f.push_back({{"what", p.what}, {"at", p.at}, {"function", p.function}});
         return f;
       }()},
      {"derivation", e.sections},
      {"derived_in", e.derived_in},
      {"derivations_file", e.derivations_file},
      {"learn_section", e.learn_section},
      {"learn_file", e.learn_file},
      {"case", e.case_name},
      {"shapes_given", e.shapes_given},
      {"inputs", inputs},
      {"output", e.output.str()},
      {"nodes", e.nodes},
      {"bytes_kept", e.bytes_kept},
      {"alignment_padding", e.alignment_padding()},
      {"scratch", {{"first_order", e.scratch_first_order}, {"second_order", e.scratch_second_order}}},
      {"kept",
       [&] {
         nlohmann::json k = nlohmann::json::array();
         for (const Allocation& a : e.kept)
           k.push_back({{"what", a.what ? a.what : ""}, {"shape", a.shape.str()}, {"bytes", a.bytes}});
         return k;
       }()},
      {"flops", e.cost ? nlohmann::json{{"forward", e.cost->forward}, {"vjp", e.cost->backward}, {"jvp", e.cost->jvp}}
                       : nlohmann::json(nullptr)},
      {"gradcheck", report_json(e.check)},
      {"gradcheck_second_order", report_json(e.check_second_order)}};
}

}  // namespace tapegrad
