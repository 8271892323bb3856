// A tensor as a heat map in a Graphviz HTML label (inspect/tape_dot.hpp draws one for a value or gradient too large
// to print in full): each matrix of its last two axes (a vector: one row), one small cell per element, the matrices
// of its leading axes side by side in their order, one blank cell apart; coloured on a diverging scale symmetric
// about 0, blue at −m, white at 0, red at +m, with m the largest |x|.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "../engine/tensor.hpp"

namespace tapegrad {

struct HeatMap {
  std::string table;           // <TABLE …> with one <TD BGCOLOR=…> per element
  int64_t rows = 0, cols = 0;  // of one matrix: its last two axes
  int64_t slices = 1;          // the matrices side by side: the product of the leading axes
  double scale = 0;            // m: the largest |x|, the end of the colour scale
};

// Whether a tensor of this shape fits a heat map: its matrices (the last two axes; a vector is one row) have at
// most `max_side` rows and, side by side one blank cell apart, make at most 2·max_side cells.
bool heat_map_fits(const Shape& shape, int64_t max_side);

// The heat map of a float tensor whose matrices have at most `max_side` rows, side by side at most 2·max_side cells
// wide, and whose elements are all finite; nothing otherwise (a NaN or ±∞ has no colour; a larger one, too many
// cells for a label).
std::optional<HeatMap> heat_map(const Tensor& t, int64_t max_side);

// The colour of x on the scale [−m, m] as "#rrggbb": blue (#2166ac) at −m, white at 0, red (#b2182b) at +m.
std::string heat_colour(double x, double m);

}  // namespace tapegrad
