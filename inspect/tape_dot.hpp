// A tape drawn as a Graphviz graph: one node per value (leaves, constants, parameters, op outputs) and one edge
// per input of each recorded node, in the order reverse mode walks them backwards.
//
//   DotOptions opt;
//   opt.registry = &builtin_registry();                      // formulas and FLOPs (ops/ops.hpp)
//   opt.scopes = &scopes;  opt.allocations = &log;            // ScopeNames, AllocationLog attached before recording
//   write_file_atomic("tape.dot", tape_to_dot(tape, opt));    // then: dot -Tsvg tape.dot -o tape.svg
//
// A node shows its op (leaf, param or constant for a leaf, with its name from DotOptions::names), its dtype and
// shape, for an op the arena bytes it keeps for backward (Node::bytes_kept: its output and what its VJP and JVP
// saved, which is all the tape knows of them) and its VJP from its sheet, and its value and, after backward, its
// gradient where one is held: in full for a few elements (DotOptions::full_values), else their norm, min and max;
// a NaN or ±∞ in either colours it red. An intermediate's gradient is held after backward only when asked for
// (Tape::set_retain_grads, Tape::retain_grad). Its tooltip (the SVG shows it on hover) holds the op's VJP and JVP
// from its sheet and its file:line. Leaves are ellipses, ops boxes; the
// value backward was called on (the loss) has a double border. The caption gives the node count, the bytes the
// tape keeps and the FLOPs of the ops with a registered cost, forward and backward.
//
// group: the values of each innermost scope (TapeScope, as DotOptions::scopes recorded them) fold into one box,
// inside a cluster per enclosing scope (the '.'-prefixes of the names: transformer ⊃ transformer.h ⊃
// transformer.h.0 ⊃ transformer.h.0.attn). A leaf made outside every scope (a model's parameters) folds into the
// box of the first node that uses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "allocation_log.hpp"
#include "graphviz.hpp"
#include "scope_names.hpp"
#include "../engine/tape.hpp"

namespace tapegrad {

class Registry;

struct DotOptions {
  const Registry* registry = nullptr;  // where VJPs, JVPs and cost functions are found; nullptr: neither is shown
  bool group = false;                  // fold scopes into boxes (above), as `scopes` names them
  // Observers that watched the recording: the scope of each value (needed by group), and what each node
  // allocated (listed on its node). nullptr: not shown.
  const ScopeNames* scopes = nullptr;
  const AllocationLog* allocations = nullptr;
  std::string title;  // the caption's first line
  // Graphviz takes minutes on tens of thousands of nodes: more than this many boxes to draw throw an Error.
  size_t max_nodes = 2000;
  std::unordered_map<uint32_t, std::string> names;  // value id (Var::id) → name shown on its node
  // A value or gradient of at most this many elements is drawn in full, one line per row of its last axis (a row
  // of more than 8 numbers wraps); a larger one as its norm, min and max. 0: every tensor as norm, min and max.
  int64_t full_values = 16;
  // A larger one, all finite, whose matrices (its last two axes) have at most this many rows and side by side make
  // at most twice as many columns, is drawn as a heat map below its norm, min and max (inspect/heat_map.hpp); 0: none.
  int64_t heat_map_side = 64;
  // Each op's VJP from its sheet as lines of its label (wrapped near 48 characters), so that a PNG keeps it as the
  // SVG's tooltip does; false: in the tooltip only. A folded scope's box lists its ops' formulas in the tooltip only.
  bool formulas = true;
  // Whose calls the drawing's hints name: C++'s (Tape::set_retain_grads keeps an intermediate gradient) or
  // Python's (tape.retain_grad(v)), as the tape was recorded from one or the other.
  enum class Caller { cpp, python };
  Caller caller = Caller::cpp;
};

// The DOT text of everything recorded on `tape` since its last clear().
std::string tape_to_dot(const Tape& tape, const DotOptions& options = {});

// The same drawing as records, for a caller that lays it out itself: each box tape_to_dot writes, in its order,
// with its DOT name, shape, colours, label lines and tooltip, and each edge. Grouped, the clusters are not listed.
struct TapeGraph {
  struct Node {
    std::string name;                // "v3" (a value), "s2" (a folded scope)
    std::string shape;               // "box" (an op), "ellipse" (a leaf), "box3d" (a folded scope)
    std::string fill, border;        // colours, "#rrggbb"; a NaN or ±∞ makes them red
    bool bad = false;                // a NaN or ±∞ in its value or gradient
    bool loss = false;               // the value backward was called on
    std::vector<std::string> lines;  // its label, one line each, in Graphviz's HTML-like text (<b>, <font>, <i>; a
                                     // heat map is a line that is a <TABLE>)
    std::string tooltip;
  };
  struct Edge {
    std::string from, to;  // node names
    std::string label;     // the shape of the value that flows
    std::string tooltip;
  };
  std::vector<Node> nodes;
  std::vector<Edge> edges;
  std::string caption;  // HTML-like, lines split by <br/>
};
TapeGraph tape_graph(const Tape& tape, const DotOptions& options = {});

}  // namespace tapegrad
