#include "inspect/tape_dot.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "inspect/heat_map.hpp"
#include "ops/registry.hpp"

namespace tapegrad {

namespace {

// ---- text ----

// Text inside an HTML-like label.
std::string html(std::string_view s) {
  std::string r;
  r.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': r += "&amp;"; break;
      case '<': r += "&lt;"; break;
      case '>': r += "&gt;"; break;
      case '"': r += "&quot;"; break;
      default: r += c;
    }
  }
  return r;
}

// A quoted DOT string; a line break becomes the escape \n, which tooltips and plain labels turn back into one.
std::string quoted(std::string_view s) {
  std::string r = "\"";
  for (char c : s) {
    if (c == '\n') {
      r += "\\n";
      continue;
    }
    if (c == '"' || c == '\\') r += '\\';
    r += c;
  }
  return r + '"';
}

std::string number(double x) { return fmt::format("{:.3g}", x); }

std::string bytes_text(size_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double x = static_cast<double>(bytes) / 1024;
  for (const char* unit : {"KiB", "MiB", "GiB"}) {
    if (x < 1024 || std::string_view(unit) == "GiB") return fmt::format("{:.1f} {}", x, unit);
    x /= 1024;
  }
  return {};
}

std::string flops_text(double f) {
  static constexpr const char* kPrefix[] = {"", "k", "M", "G", "T", "P"};
  size_t i = 0;
  for (; f >= 1000 && i + 1 < std::size(kPrefix); ++i) f /= 1000;
  return fmt::format("{:.3g} {}FLOP", f, kPrefix[i]);
}

// The width of UTF-8 text in characters: its code points (ȳ and Σ are one each).
size_t width(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// `text` broken at spaces into lines of at most `columns` characters; a longer word stands on a line of its own. A
// clause (up to a word ending in ';') that fits on a line does not start on one line and end on the next.
std::vector<std::string> wrap(std::string_view text, size_t columns) {
  std::vector<std::string> words;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find(' ', at), text.size());
    if (end > at) words.emplace_back(text.substr(at, end - at));
    at = end + 1;
  }
  std::vector<std::string> lines;
  std::string line;
  for (size_t i = 0; i < words.size(); ++i) {
    size_t needed = width(words[i]);  // this word, or the whole clause it starts
    if (i == 0 || words[i - 1].back() == ';') {
      size_t clause = needed;
      for (size_t j = i; words[j].back() != ';' && j + 1 < words.size(); ++j) clause += 1 + width(words[j + 1]);
      if (clause <= columns) needed = clause;
    }
    if (!line.empty() && width(line) + 1 + needed > columns) {
      lines.push_back(std::move(line));
      line.clear();
    }
    if (!line.empty()) line += ' ';
    line += words[i];
  }
  if (!line.empty()) lines.push_back(std::move(line));
  return lines;
}

// "transformer.h.0" for "transformer.h.0.attn"; "" for a name without a dot.
std::string_view parent_scope(std::string_view s) {
  const size_t dot = s.rfind('.');
  return dot == std::string_view::npos ? std::string_view() : s.substr(0, dot);
}

// ---- numbers ----

// Norm, min and max over the finite elements, and how many are NaN or ±∞.
struct Summary {
  double norm = 0, min = 0, max = 0;
  int64_t finite = 0, nan = 0, pos_inf = 0, neg_inf = 0;
  bool ints = false;
  bool bad() const { return nan + pos_inf + neg_inf > 0; }
};

Summary summarize(const Tensor& t) {
  Summary s;
  auto see = [&](double x) {
    if (s.finite++ == 0) s.min = s.max = x;
    s.min = std::min(s.min, x);
    s.max = std::max(s.max, x);
  };
  if (t.dtype() == DType::i32) {
    s.ints = true;
    const int32_t* p = t.data<int32_t>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i) see(p[i]);
    return s;
  }
  dispatch_float("tape_to_dot", t.dtype(), [&]<class T>(T) {
    const T* p = t.data<T>();
    double squares = 0;
    for (int64_t i = 0, n = t.numel(); i < n; ++i) {
      const double x = static_cast<double>(p[i]);
      if (std::isnan(x)) {
        ++s.nan;
      } else if (std::isinf(x)) {
        ++(x > 0 ? s.pos_inf : s.neg_inf);
      } else {
        squares += x * x;
        see(x);
      }
    }
    s.norm = std::sqrt(squares);
  });
  return s;
}

std::string summary_text(std::string_view what, const Summary& s) {
  std::vector<std::string> parts;
  if (s.ints && s.finite > 0) parts.push_back(fmt::format("min {}, max {}", s.min, s.max));
  else if (s.finite > 0)
    parts.push_back(fmt::format("norm {}, min {}, max {}", number(s.norm), number(s.min), number(s.max)));
  if (s.nan > 0) parts.push_back(fmt::format("{} NaN", s.nan));
  if (s.pos_inf > 0) parts.push_back(fmt::format("{} +inf", s.pos_inf));
  if (s.neg_inf > 0) parts.push_back(fmt::format("{} -inf", s.neg_inf));
  if (parts.empty()) parts.push_back("empty");
  std::string r = fmt::format("{}: {}", what, parts.front());
  for (size_t i = 1; i < parts.size(); ++i) r += (s.finite > 0 && i == 1 ? " over the finite ones; " : ", ") + parts[i];
  return r;
}

// The elements of a tensor, one string per row of its last axis ("[0.126, -1.3, 0.64]"), a row of more than
// kRowNumbers numbers continued on the next string; a tensor of one element is its number alone.
constexpr int64_t kRowNumbers = 8;

std::vector<std::string> rows_text(const Tensor& t) {
  std::vector<std::string> numbers;
  if (t.dtype() == DType::i32) {
    for (int64_t i = 0, n = t.numel(); i < n; ++i) numbers.push_back(fmt::format("{}", t.data<int32_t>()[i]));
  } else {
    dispatch_float("tape_to_dot", t.dtype(), [&]<class T>(T) {
      for (int64_t i = 0, n = t.numel(); i < n; ++i) numbers.push_back(number(static_cast<double>(t.data<T>()[i])));
    });
  }
  if (numbers.size() == 1) return numbers;
  const size_t row = t.shape().rank() == 0 ? 1 : static_cast<size_t>(t.shape()[t.shape().rank() - 1]);
  std::vector<std::string> lines;
  for (size_t r = 0; r + row <= numbers.size() && row > 0; r += row)
    for (size_t i = 0; i < row; i += kRowNumbers) {
      std::string line = i == 0 ? "[" : " ";
      for (size_t j = i; j < std::min(row, i + static_cast<size_t>(kRowNumbers)); ++j)
        line += numbers[r + j] + (j + 1 == row ? "]" : ", ");
      lines.push_back(std::move(line));
    }
  return lines;
}

// ---- the drawing ----

constexpr const char* kGradColour = "#b34700";
constexpr const char* kFormulaColour = "#1f3f73";
constexpr size_t kFormulaColumns = 48;  // a VJP's lines on its node are wrapped at spaces to this many characters

struct Style {
  const char* shape;
  const char* fill;
  const char* border;
};
constexpr Style kOpStyle{"box", "#dae8fc", "#6c8ebf"};
constexpr Style kLeafStyle{"ellipse", "#fff2cc", "#d6b656"};
constexpr Style kParamStyle{"ellipse", "#d5e8d4", "#82b366"};
constexpr Style kConstantStyle{"ellipse", "#f5f5f5", "#999999"};
constexpr Style kScopeStyle{"box3d", "#e1d5e7", "#9673a6"};
constexpr Style kBadStyle{"", "#f8cecc", "#b85450"};

// A drawn node: one value, or (grouped) the values of one innermost scope.
struct Box {
  std::string scope;  // a folded box: its scope; a single value: the scope it sits in
  bool folded = false;
  std::vector<uint32_t> values;
};

class Drawer {
 public:
  Drawer(const Tape& tape, const DotOptions& opt) : tape_(tape), opt_(opt) {
    const size_t n = tape.num_values();
    if (!opt.group && n > opt.max_nodes) {
      if (opt.caller == DotOptions::Caller::python)
        fail(
            "graph: {} values to draw, more than the limit of {}: draw a smaller tape, or raise the limit with "
            "tapegrad.graph(tape, path, max_nodes=N) (Graphviz takes minutes on tens of thousands)",
            n, opt.max_nodes);
      fail("graph: {} values to draw, more than the limit of {}: use --group (DotOptions::group) or fewer layers", n,
           opt.max_nodes);
    }
    producer_.assign(n, -1);
    for (size_t k = 0; k < tape.num_nodes(); ++k) producer_[tape.node(k).out] = static_cast<int64_t>(k);
    loss_ = tape.backward_output();
    make_boxes();
    if (boxes_.size() > opt.max_nodes)
      fail("graph: {} boxes to draw even grouped by scope, more than the limit of {}: use fewer layers", boxes_.size(),
           opt.max_nodes);
    summaries_.resize(n);
    for (uint32_t id = 0; id < n; ++id) {
      summaries_[id].first = summarize(tape.value_at(id));
      const Tensor g = tape.grad_at(id);
      if (loss_ && g.defined()) summaries_[id].second = summarize(g);
    }
  }

  // The boxes and arrows dot() writes, as records: a bad box's colours are kBadStyle's, as attributes() gives them.
  TapeGraph graph() const {
    TapeGraph g;
    for (size_t b = 0; b < boxes_.size(); ++b) {
      Drawn d = drawn(b);
      g.nodes.push_back({std::move(d.name), d.style.shape, d.bad ? kBadStyle.fill : d.style.fill,
                         d.bad ? kBadStyle.border : d.style.border, d.bad, d.loss, std::move(d.lines),
                         std::move(d.tip)});
    }
    g.edges = arrows();
    g.caption = caption();
    return g;
  }

  std::string dot() const {
    std::string out;
    out += "digraph tape {\n";
    out +=
        "  graph [rankdir=TB, nodesep=0.25, ranksep=0.4, fontname=\"Helvetica,Arial,sans-serif\", fontsize=10, "
        "labelloc=b, label=<" +
        caption() + ">];\n";
    out += "  node [fontname=\"Helvetica,Arial,sans-serif\", fontsize=10, style=\"filled\", margin=\"0.12,0.05\"];\n";
    out +=
        "  edge [fontname=\"Helvetica,Arial,sans-serif\", fontsize=8, color=\"#555555\", fontcolor=\"#555555\", "
        "arrowsize=0.6];\n";
    if (opt_.group) {
      int cluster = 0;
      clusters(out, "", cluster, 1);
    } else {
      for (size_t b = 0; b < boxes_.size(); ++b) out += "  " + node(b) + "\n";
    }
    edges(out);
    out += "}\n";
    return out;
  }

 private:
  std::string_view scope_of(uint32_t id) const { return opt_.scopes ? opt_.scopes->scope_of(id) : std::string_view(); }

  // ---- which values go in which box ----

  void make_boxes() {
    const uint32_t n = static_cast<uint32_t>(tape_.num_values());
    box_of_.assign(n, -1);
    if (!opt_.group) {
      boxes_.resize(n);
      for (uint32_t id = 0; id < n; ++id) {
        boxes_[id].values = {id};
        box_of_[id] = id;
      }
      return;
    }
    std::set<std::string, std::less<>> scopes;
    for (uint32_t id = 0; id < n; ++id)
      if (auto s = scope_of(id); !s.empty()) scopes.emplace(s);
    // An innermost scope: no other scope's name continues it with a '.'.
    auto innermost = [&](std::string_view s) {
      auto next = scopes.upper_bound(s);
      for (; next != scopes.end() && next->starts_with(s); ++next)
        if (next->size() > s.size() && (*next)[s.size()] == '.') return false;
      return true;
    };
    std::map<std::string, size_t, std::less<>> folded;
    std::vector<uint32_t> outside;  // leaves outside every scope: placed by their first use
    for (uint32_t id = 0; id < n; ++id) {
      const std::string_view s = scope_of(id);
      if (!s.empty() && innermost(s)) {
        auto [it, added] = folded.try_emplace(std::string(s), boxes_.size());
        if (added) boxes_.push_back(Box{std::string(s), true, {}});
        add(it->second, id);
      } else if (s.empty() && tape_.is_leaf(id)) {
        outside.push_back(id);
      } else {
        boxes_.push_back(Box{std::string(s), false, {}});
        add(boxes_.size() - 1, id);
      }
    }
    for (size_t k = 0; k < tape_.num_nodes(); ++k) {
      const Node& nd = tape_.node(k);
      const int64_t user = box_of_[nd.out];
      for (uint32_t in : nd.inputs)
        if (box_of_[in] < 0 && tape_.is_leaf(in) && scope_of(in).empty() && boxes_[user].folded)
          add(static_cast<size_t>(user), in);
    }
    for (uint32_t id : outside)
      if (box_of_[id] < 0) {
        boxes_.push_back(Box{"", false, {}});
        add(boxes_.size() - 1, id);
      }
    used_outside_.assign(n, false);
    for (size_t k = 0; k < tape_.num_nodes(); ++k)
      for (uint32_t in : tape_.node(k).inputs)
        if (box_of_[in] != box_of_[tape_.node(k).out]) used_outside_[in] = true;
  }

  void add(size_t box, uint32_t id) {
    boxes_[box].values.push_back(id);
    box_of_[id] = static_cast<int64_t>(box);
  }

  // ---- clusters (grouped) ----

  // The cluster a box sits in: a folded box's enclosing scope, a single value's own scope.
  static std::string_view container(const Box& b) { return b.folded ? parent_scope(b.scope) : b.scope; }

  // Writes the boxes of scope `name` and the clusters of the scopes inside it, recursively. A scope with no boxes
  // of its own and one scope inside is not drawn as a cluster of its own.
  void clusters(std::string& out, const std::string& name, int& counter, int depth) const {
    std::set<std::string> children;
    for (const Box& b : boxes_)
      for (std::string_view c = container(b); !c.empty(); c = parent_scope(c))
        if (parent_scope(c) == name) children.emplace(c);
    std::vector<size_t> mine;
    for (size_t b = 0; b < boxes_.size(); ++b)
      if (container(boxes_[b]) == name) mine.push_back(b);
    const std::string indent(static_cast<size_t>(depth) * 2, ' ');
    const bool drawn = !name.empty() && !(mine.empty() && children.size() == 1);
    if (drawn)
      out += fmt::format(
          "{}subgraph cluster_{} {{\n{}  label=<<b>{}</b>>; tooltip={}; style=\"rounded,dashed\"; "
          "color=\"#9673a6\"; fontcolor=\"#5b3f70\"; labeljust=l;\n",
          indent, counter++, indent, html(name), quoted("scope " + name), indent);
    const std::string inner = drawn ? indent + "  " : indent;
    for (size_t b : mine) out += inner + node(b) + "\n";
    for (const std::string& c : children) clusters(out, c, counter, drawn ? depth + 1 : depth);
    if (drawn) out += indent + "}\n";
  }

  // ---- nodes ----

  static std::string node_name(const Box& b, size_t index) {
    return b.folded ? fmt::format("s{}", index) : fmt::format("v{}", b.values.front());
  }

  // What a box is drawn as: its name, its style, its label's lines and its tooltip.
  struct Drawn {
    std::string name;  // "v3" (a value), "s2" (a folded scope)
    Style style;
    bool bad = false, loss = false;
    std::vector<std::string> lines;
    std::string tip;
  };

  Drawn drawn(size_t b) const {
    const Box& box = boxes_[b];
    return box.folded ? scope_node(b) : value_node(box.values.front());
  }

  std::string node(size_t b) const {
    const Drawn d = drawn(b);
    return fmt::format("{} [{}];", d.name, attributes(d.style, d.bad, d.loss, d.lines, d.tip));
  }

  // An op's OpSheet, or nullptr.
  const OpSheet* info(const Node& nd) const { return opt_.registry ? opt_.registry->find(nd.op) : nullptr; }

  OpCost cost(const Node& nd) const {
    const OpSheet* op = info(nd);
    if (!op || !op->cost) return {};
    std::vector<Shape> in;
    for (uint32_t id : nd.inputs) in.push_back(tape_.value_at(id).shape());
    return op->cost(in, tape_.value_at(nd.out).shape());
  }

  std::string name_of(uint32_t id) const {
    auto it = opt_.names.find(id);
    return it == opt_.names.end() ? std::string() : it->second;
  }

  static std::string shape_text(const Tensor& t) { return fmt::format("{} {}", t.dtype(), t.shape()); }

  static std::string small(std::string_view text, const char* colour = nullptr) {
    return colour ? fmt::format("<font point-size=\"9\" color=\"{}\">{}</font>", colour, text)
                  : fmt::format("<font point-size=\"9\">{}</font>", text);
  }

  // Whether t is drawn as a heat map: too many elements to print, few enough rows and columns, all finite.
  bool heat_mapped(const Tensor& t, const Summary& s) const {
    return t.numel() > opt_.full_values && !s.ints && !s.bad() && heat_map_fits(t.shape(), opt_.heat_map_side);
  }

  // The lines of a value or gradient t: of at most DotOptions::full_values elements, its norm then its rows (a
  // single number alone); of more, its norm, min and max, and a heat map where one is drawn (a line that is a
  // <TABLE>, which attributes() puts in a row of its own).
  void tensor_lines(std::string_view what, const Tensor& t, const Summary& s, const char* colour,
                    std::vector<std::string>& lines) const {
    if (t.numel() == 0 || t.numel() > opt_.full_values) {
      const std::optional<HeatMap> map = heat_mapped(t, s) ? heat_map(t, opt_.heat_map_side) : std::nullopt;
      lines.push_back(small(html(summary_text(what, s)), colour));
      if (map) {
        lines.push_back(
            small(html(map->slices == 1 ? fmt::format("heat map ±{}", number(map->scale))
                                        : fmt::format("heat map ±{}: {} matrices of {} × {}", number(map->scale),
                                                      map->slices, map->rows, map->cols)),
                  colour));
        lines.push_back(map->table);
      }
      return;
    }
    std::vector<std::string> rows = rows_text(t);
    if (rows.size() == 1 && t.numel() == 1) {
      lines.push_back(small(html(fmt::format("{}: {}", what, rows.front())), colour));
      return;
    }
    const std::string head = s.bad()  ? summary_text(what, s)
                             : s.ints ? fmt::format("{}:", what)
                                      : fmt::format("{}: norm {}", what, number(s.norm));
    lines.push_back(small(html(head), colour));
    for (const std::string& row : rows) lines.push_back(small(html(row), colour));
  }

  // How to keep an intermediate's gradient, in the calls of whoever recorded the tape.
  const char* keep_hint() const {
    return opt_.caller == DotOptions::Caller::python ? "<i>grad: not kept (tape.retain_grad(v) keeps it)</i>"
                                                     : "<i>grad: not kept (Tape::set_retain_grads keeps it)</i>";
  }

  // The value and gradient lines of value id, and whether either holds a NaN or ±∞.
  bool numbers(uint32_t id, std::vector<std::string>& lines) const {
    const auto& [value, grad] = summaries_[id];
    tensor_lines("value", tape_.value_at(id), value, nullptr, lines);
    if (loss_) {
      if (const Tensor g = tape_.grad_at(id); g.defined()) {
        tensor_lines(*loss_ == id ? "grad (the seed)" : "grad", g, grad, kGradColour, lines);
      } else if (tape_.requires_grad_at(id)) {
        lines.push_back(
            small(tape_.is_leaf(id) ? "<i>grad: none (backward did not reach it)</i>" : keep_hint(), kGradColour));
      }
    }
    return value.bad() || grad.bad();
  }

  static std::string attributes(const Style& style, bool bad, bool loss, const std::vector<std::string>& lines,
                                const std::string& tooltip) {
    std::string label;
    const bool tables =
        std::any_of(lines.begin(), lines.end(), [](const std::string& l) { return l.starts_with("<TABLE"); });
    if (!tables) {
      for (size_t i = 0; i < lines.size(); ++i) label += (i ? "<br/>" : "") + lines[i];
    } else {  // a heat map is a table, which Graphviz takes only in a cell: the label is a table of rows
      std::string text;
      auto flush = [&] {
        if (!text.empty()) label += fmt::format("<TR><TD>{}</TD></TR>", text);
        text.clear();
      };
      for (const std::string& l : lines) {
        if (l.starts_with("<TABLE")) {
          flush();
          label += fmt::format("<TR><TD>{}</TD></TR>", l);
        } else {
          text += (text.empty() ? "" : "<br/>") + l;
        }
      }
      flush();
      label = "<TABLE BORDER=\"0\" CELLBORDER=\"0\" CELLSPACING=\"2\" CELLPADDING=\"0\">" + label + "</TABLE>";
    }
    return fmt::format("shape={}, fillcolor=\"{}\", color=\"{}\"{}{}, label=<{}>, tooltip={}", style.shape,
                       bad ? kBadStyle.fill : style.fill, bad ? kBadStyle.border : style.border,
                       bad ? ", penwidth=2" : "", loss ? ", peripheries=2" : "", label, quoted(tooltip));
  }

  Drawn value_node(uint32_t id) const {
    const Tensor& v = tape_.value_at(id);
    const std::string name = name_of(id), scope(scope_of(id));
    const bool loss = loss_ && *loss_ == id;
    std::vector<std::string> lines;
    std::string tip;
    Style style = kOpStyle;
    if (producer_[id] >= 0) {
      const Node& nd = tape_.node(static_cast<size_t>(producer_[id]));
      lines.push_back(
          fmt::format("<b>{}</b>{}", html(nd.op), name.empty() ? std::string() : fmt::format(" {}", html(name))));
      lines.push_back(small(html(shape_text(v))));
      // What the bytes are, where an AllocationLog watched the recording (DotOptions::allocations): named tensors.
      const auto kept =
          opt_.allocations ? opt_.allocations->of(static_cast<size_t>(producer_[id])) : std::span<const Allocation>();
      std::string kept_names;
      for (const Allocation& a : kept)
        if (a.what && std::string_view(a.what) != "output") kept_names += fmt::format(" + {}", a.what);
      lines.push_back(small(html(fmt::format("keeps {} (output{})", bytes_text(nd.bytes_kept),
                                             kept.empty() ? std::string(" + saved tensors") : kept_names))));
      const OpCost c = cost(nd);
      if (c.forward + c.backward > 0)
        lines.push_back(small(fmt::format("{} forward, {} backward", flops_text(c.forward), flops_text(c.backward))));
      if (const OpSheet* op = info(nd); op && opt_.formulas && !op->vjp.empty())
        for (const std::string& line : wrap("VJP: " + op->vjp, kFormulaColumns))
          lines.push_back(small(html(line), kFormulaColour));
      tip = fmt::format("#{} {}{}\n", id, nd.op, scope.empty() ? "" : " in scope " + scope);
      if (const OpSheet* op = info(nd)) tip += fmt::format("VJP: {}\nJVP: {}\n", op->vjp, op->jvp);
      else if (opt_.registry) tip += fmt::format("'{}' is not in the registry: no formulas\n", nd.op);
      tip += fmt::format("recorded at {}\nkeeps {} bytes: its output and what its VJP and JVP saved",
                         source_text(nd.where), nd.bytes_kept);
      for (const Allocation& a : kept)
        tip += fmt::format("\n  {} {} {}: {} bytes", a.what ? a.what : "(unnamed)", a.dtype, a.shape.str(), a.bytes);
      if (c.forward + c.backward > 0) tip += fmt::format("\nFLOPs: {} forward, {} backward", c.forward, c.backward);
    } else {
      const bool param = tape_.is_param(id), grad = tape_.requires_grad_at(id);
      const char* kind = param ? "param" : grad ? "leaf" : "constant";
      style = param ? kParamStyle : grad ? kLeafStyle : kConstantStyle;
      lines.push_back(fmt::format("<b>{}</b>{}", kind, name.empty() ? std::string() : fmt::format(" {}", html(name))));
      lines.push_back(small(html(shape_text(v))));
      tip = fmt::format("#{} {}{}: {}{}", id, kind, name.empty() ? "" : " " + name,
                        param  ? "a parameter; backward adds its gradient into the caller's tensor"
                        : grad ? "an input that requires a gradient"
                               : "needs no gradient",
                        scope.empty() ? "" : "\nscope " + scope);
    }
    const bool bad = numbers(id, lines);
    if (loss) lines.push_back("<b>loss: backward starts here</b>");
    return {fmt::format("v{}", id), style, bad, loss, std::move(lines), std::move(tip)};
  }

  // A folded scope: its ops, the leaves that went with it, what it keeps, its FLOPs, and its output's numbers.
  Drawn scope_node(size_t b) const {
    const Box& box = boxes_[b];
    std::vector<std::pair<std::string, int>> ops;  // in order of first appearance, with counts
    int params = 0, constants = 0, leaves = 0;
    int64_t param_numbers = 0;
    size_t kept = 0;
    OpCost flops;
    bool bad = false, loss = false;
    std::string first_bad;
    std::string tip = fmt::format("scope {}\n", box.scope);
    std::set<std::string> formulas;  // "op VJP: ...\nop JVP: ..." of each op in the box, once
    std::vector<uint32_t> outputs;   // values used outside the box, or the loss
    for (uint32_t id : box.values) {
      const auto& [value, grad] = summaries_[id];
      const bool bad_here = value.bad() || grad.bad();
      loss = loss || (loss_ && *loss_ == id);
      if (producer_[id] < 0) {
        if (tape_.is_param(id)) {
          ++params;
          param_numbers += tape_.value_at(id).numel();
        } else if (tape_.requires_grad_at(id)) {
          ++leaves;
        } else {
          ++constants;
        }
      } else {
        const Node& nd = tape_.node(static_cast<size_t>(producer_[id]));
        auto it = std::find_if(ops.begin(), ops.end(), [&](const auto& o) { return o.first == nd.op; });
        if (it == ops.end()) ops.emplace_back(nd.op, 1);
        else ++it->second;
        kept += nd.bytes_kept;
        const OpCost c = cost(nd);
        flops.forward += c.forward;
        flops.backward += c.backward;
        tip += fmt::format("#{} {} {} at {} ({} bytes)\n", id, nd.op, shape_text(tape_.value_at(id)),
                           source_text(nd.where), nd.bytes_kept);
        if (const OpSheet* op = info(nd))
          formulas.insert(fmt::format("{} VJP: {}\n{} JVP: {}\n", nd.op, op->vjp, nd.op, op->jvp));
      }
      if (bad_here && !bad) first_bad = fmt::format("#{}", id);
      bad = bad || bad_here;
    }
    for (uint32_t id : box.values)
      if ((loss_ && *loss_ == id) || used_outside_[id]) outputs.push_back(id);
    if (outputs.empty()) outputs.push_back(box.values.back());
    for (const std::string& f : formulas) tip += f;
    tip += fmt::format("keeps {} bytes in all", kept);

    std::vector<std::string> lines{fmt::format("<b>{}</b>", html(box.scope))};
    std::string list;
    size_t width = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      std::string item = ops[i].second > 1 ? fmt::format("{} ×{}", ops[i].first, ops[i].second) : ops[i].first;
      if (i > 0) {
        list += width + item.size() > 44 ? ",<br/>" : ", ";
        width = width + item.size() > 44 ? 0 : width + 2;
      }
      list += html(item);
      width += item.size();
    }
    if (!list.empty()) lines.push_back(small(list));
    std::vector<std::string> with;
    if (params > 0)
      with.push_back(fmt::format("{} param{} ({} numbers)", params, params > 1 ? "s" : "", param_numbers));
    if (leaves > 0) with.push_back(fmt::format("{} input{}", leaves, leaves > 1 ? "s" : ""));
    if (constants > 0) with.push_back(fmt::format("{} constant{}", constants, constants > 1 ? "s" : ""));
    std::string with_text;
    for (const std::string& w : with) with_text += (with_text.empty() ? "with " : ", ") + w;
    if (!with_text.empty()) lines.push_back(small(with_text));
    if (kept > 0) lines.push_back(small(fmt::format("keeps {} (outputs + saved tensors)", bytes_text(kept))));
    if (flops.forward + flops.backward > 0)
      lines.push_back(
          small(fmt::format("{} forward, {} backward", flops_text(flops.forward), flops_text(flops.backward))));
    const uint32_t shown = outputs.back();
    lines.push_back(small(html(fmt::format("out #{}: {}", shown, shape_text(tape_.value_at(shown))))));
    numbers(shown, lines);
    if (bad) lines.push_back(small(html(fmt::format("a NaN or an infinity inside, first in {}", first_bad))));
    if (loss) lines.push_back("<b>loss: backward starts here</b>");
    return {fmt::format("s{}", b), kScopeStyle, bad, loss, std::move(lines), std::move(tip)};
  }

  // ---- edges and caption ----

  // Ungrouped, one edge per input of each node; grouped, one per value and box it flows into.
  std::vector<TapeGraph::Edge> arrows() const {
    std::vector<TapeGraph::Edge> out;
    std::set<std::pair<uint32_t, int64_t>> drawn;
    for (size_t k = 0; k < tape_.num_nodes(); ++k) {
      const Node& nd = tape_.node(k);
      const int64_t to = box_of_[nd.out];
      for (size_t i = 0; i < nd.inputs.size(); ++i) {
        const uint32_t in = nd.inputs[i];
        const int64_t from = box_of_[in];
        if (opt_.group && (from == to || !drawn.emplace(in, to).second)) continue;
        const Tensor& v = tape_.value_at(in);
        out.push_back({node_name(boxes_[static_cast<size_t>(from)], static_cast<size_t>(from)),
                       node_name(boxes_[static_cast<size_t>(to)], static_cast<size_t>(to)),
                       fmt::format("{}", v.shape()),
                       fmt::format("#{} {} → input {} of #{} {}", in, shape_text(v), i, nd.out, nd.op)});
      }
    }
    return out;
  }

  void edges(std::string& out) const {
    for (const TapeGraph::Edge& e : arrows())
      out += fmt::format("  {} -> {} [label={}, tooltip={}];\n", e.from, e.to, quoted(e.label), quoted(e.tooltip));
  }

  std::string caption() const {
    size_t kept = 0;
    OpCost flops;
    for (size_t k = 0; k < tape_.num_nodes(); ++k) {
      kept += tape_.node(k).bytes_kept;
      const OpCost c = cost(tape_.node(k));
      flops.forward += c.forward;
      flops.backward += c.backward;
    }
    const size_t values = tape_.num_values(), ops = tape_.num_nodes();
    std::vector<std::string> lines;
    if (!opt_.title.empty()) lines.push_back(fmt::format("<b>{}</b>", html(opt_.title)));
    lines.push_back(fmt::format("{} nodes: {} leaves and constants, {} op{}{}", values, values - ops, ops,
                                ops == 1 ? "" : "s",
                                opt_.group ? fmt::format("; {} boxes, grouped by scope", boxes_.size()) : ""));
    lines.push_back(fmt::format("the tape keeps {} ({} bytes: its outputs and saved tensors)", bytes_text(kept), kept));
    if (opt_.registry && flops.forward + flops.backward > 0)
      lines.push_back(fmt::format("{} = {} forward + {} backward (ops with a registered cost)",
                                  flops_text(flops.forward + flops.backward), flops_text(flops.forward),
                                  flops_text(flops.backward)));
    else if (opt_.registry) lines.push_back("FLOPs: none of these ops has a registered cost");
    if (loss_)
      lines.push_back(html(
          fmt::format("backward ran from #{} {}: arrows are the forward; VJPs ran them in reverse", *loss_,
                      producer_[*loss_] >= 0 ? tape_.node(static_cast<size_t>(producer_[*loss_])).op : "(a leaf)")));
    else lines.push_back("forward only: backward has not run");
    lines.push_back(
        small(fmt::format("ellipses: leaves (yellow inputs, green params, grey constants); boxes: ops{}; "
                          "red: a NaN or an infinity; hover for {}",
                          opt_.formulas && opt_.registry ? " with their VJPs" : "",
                          opt_.formulas && opt_.registry ? "the JVP and the source line" : "formulas")));
    // The symbols of the VJPs drawn that their own line does not define: Σ_bcast, and an op's indices (matmul's
    // α, β, γ, sum's x̄[o,j,i]), which its forward defines.
    if (opt_.formulas && opt_.registry) {
      std::set<std::string> indexed;
      bool broadcast = false;
      for (size_t k = 0; k < tape_.num_nodes(); ++k)
        if (const OpSheet* op = info(tape_.node(k))) {
          broadcast = broadcast || op->vjp.find("Σ_bcast") != std::string::npos;
          for (const char* index : {"_α", "_β", "_γ", "[", "_i", "_j", "_k"})
            if (op->vjp.find(index) != std::string::npos) indexed.insert(op->name);
        }
      if (broadcast)
        lines.push_back(small(html("Σ_bcast: the sum over the axes along which an input was broadcast to the output")));
      for (const std::string& name : indexed)
        for (const std::string& line : wrap(fmt::format("{}: {}", name, opt_.registry->find(name)->forward), 120))
          lines.push_back(small(html(line)));
    }
    bool maps = false;
    for (uint32_t id = 0; id < static_cast<uint32_t>(tape_.num_values()) && !maps; ++id)
      maps = heat_mapped(tape_.value_at(id), summaries_[id].first) ||
             (loss_ && tape_.grad_at(id).defined() && heat_mapped(tape_.grad_at(id), summaries_[id].second));
    if (maps)
      lines.push_back(small(html(fmt::format(
          "heat maps: one cell per element, each matrix of the last two axes, those of the leading axes side by side; "
          "{} at −m, white at 0, {} at +m, m the largest |x| (its ±m)",
          "blue", "red"))));
    std::string label;
    for (size_t i = 0; i < lines.size(); ++i) label += (i ? "<br/>" : "") + lines[i];
    return label;
  }

  const Tape& tape_;
  const DotOptions& opt_;
  std::vector<int64_t> producer_;  // value id → index of the node that made it, −1 for a leaf
  std::vector<int64_t> box_of_;    // value id → box
  std::vector<Box> boxes_;
  std::vector<bool> used_outside_;                      // value id → an input of a node in another box (grouped)
  std::vector<std::pair<Summary, Summary>> summaries_;  // value id → value, gradient
  std::optional<uint32_t> loss_;
};

}  // namespace

std::string tape_to_dot(const Tape& tape, const DotOptions& options) { return Drawer(tape, options).dot(); }

TapeGraph tape_graph(const Tape& tape, const DotOptions& options) { return Drawer(tape, options).graph(); }

}  // namespace tapegrad
