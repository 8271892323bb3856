// The kind of finding "edge": at an edge of the op's domain (a fully masked row, a constant row, an exact tie, a zero
// row, values that overflow a naive exp at the dtype, tiny values, a mask that leaves a query no key) the op gives
// NaN or ∞ where its reference is finite, a gradient that is not exactly 0 where ȳ is 0, or a gradient away from the
// reference's. It is made by the edge probes of the Python module (python/tapegrad/_edges.py, gradcheck(...,
// edges=True)) and of the command line (checker/edges.cpp: gradcheck --edges, claim --edges), each finding with the
// edge, the element, both values and one line that reproduces it; no pass over a failing Jacobian finds it (the
// check at a random point passes).
#include "checker/finding_sheet.hpp"

namespace tapegrad {

FindingSheet edge_finding() {
  return {
      .kind = Finding::edge,
      .title = "at an edge",
      .meaning =
          "at an edge of the op's domain (a masked, constant, tied, zero, overflowing or tiny row; a query "
          "with no key) y or x̄ is NaN or ∞ where the reference is finite, x̄ is not 0 at ȳ = 0, or x̄ is "
          "away from the reference's",
      .found_by =
          "the edge probes: `python/tapegrad/_edges.py` (gradcheck(..., edges=True)) for a torch op, "
          "`checker/edges.cpp` (`tapegrad gradcheck --edges`, `tapegrad claim --edges`) for a C++ op or a claim",
      .section = "docs/gradchecking.md#at-an-edge",
  };
}

}  // namespace tapegrad
