// Edge probes of an op written in C++ or of a claim (`tapegrad gradcheck --edges`, `tapegrad claim --edges`): where
// backwards break though the check at a random point passes. The op's forward and VJP run in float64 at inputs built
// from the checked ones, along the axis the op reduces over (the last axis whose elements share an output, found by
// moving one element at a time, a little and far, up and down: a max moves with an element only once it is the max;
// the last axis where none does), in one row of each differentiable input:
//   masked_rows    the row all −∞ (where one −∞ is in the op's domain: y stays finite), and one_left: all but its
//                  first element
//   constant_rows  the row constant;  ties: the row's two largest and two smallest made equal
//   zeros          the row 0, and the whole input 0
//   large          the row ±710, past float64's exp overflow;  tiny: ±1e-200, whose square underflows
//   length_one     the axis cut to its first element in every input of that length there, counted from the end as
//                  broadcasting aligns axes (a sample variance's n − 1); where the op refuses that, a note
// What is held there, at a random ȳ (0 where y is not finite) and at ȳ = 0:
//   - no NaN in y where the op is finite next to the edge (the row 10⁻³ of the way back to the checked one, −∞ made
//     −10⁴): its limit is finite; at a length of 1, no NaN in y at all (its inputs hold none);
//   - x̄ exactly 0 at ȳ = 0 (an output that does not reach the loss sends back 0, not 0·∞), and no NaN in x̄;
//   - no ∞ in x̄ where the derivative is finite (one-sided differences in float64 at two steps do not grow);
//   - x̄ along the probed row against central differences of the forward (each group of equal elements moved
//     together, the other elements along one random direction), skipped where one-sided differences disagree (a
//     kink, where any subgradient is right).
// Each finding (kind `edge`, checker/findings/edge.cpp) names the edge, the element, both values and one line that
// reproduces it ("x[1, :] = -inf"). The Python module probes a torch op with the same edges
// (python/tapegrad/_edges.py), at its own dtype and against its reference.
#pragma once

#include <array>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../engine/functions.hpp"
#include "gradcheck.hpp"

namespace tapegrad {

inline constexpr std::array<std::string_view, 8> kEdges = {"masked_rows", "one_left", "constant_rows", "ties",
                                                           "zeros",       "large",    "tiny",          "length_one"};
// Edges an op defines as undefined, and what it gives there ("nan", "inf" or "undefined"): not probed; the report
// says so in a note.
using UndefinedEdges = std::map<std::string, std::string>;
// "masked_rows=nan" entries read; throws Error naming an edge not in kEdges or a value other than the three.
UndefinedEdges parse_undefined_edges(std::span<const std::string> entries);

// Runs the probes on f at its float64 inputs and adds to the report a row "edges" per differentiable input probed
// (ok, or the first finding's element with the value at the edge and the one it is held to), a diagnosis of kind
// `edge` for each edge that breaks (the first kMaxEdgeFindings), and a note of what was probed; then concludes it.
inline constexpr size_t kMaxEdgeFindings = 4;
void probe_edges(GradcheckReport& report, const Function& f, std::span<const Tensor> inputs,
                 std::span<const std::string> names, uint64_t seed, const UndefinedEdges& undefined = {});

}  // namespace tapegrad
