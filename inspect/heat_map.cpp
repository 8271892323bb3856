#include "inspect/heat_map.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace tapegrad {

std::string heat_colour(double x, double m) {
  // white → the end colour in proportion to |x|/m, per channel
  const double f = m > 0 ? std::clamp(std::abs(x) / m, 0.0, 1.0) : 0.0;
  const int end[3] = {x < 0 ? 0x21 : 0xb2, x < 0 ? 0x66 : 0x18, x < 0 ? 0xac : 0x2b};
  int rgb[3];
  for (int c = 0; c < 3; ++c) rgb[c] = static_cast<int>(std::lround(255 + (end[c] - 255) * f));
  return fmt::format("#{:02x}{:02x}{:02x}", rgb[0], rgb[1], rgb[2]);
}

namespace {

// The matrices of a shape: rows and columns of one (its last two axes), and how many side by side.
HeatMap layout(const Shape& s) {
  HeatMap h;
  h.cols = s[s.rank() - 1];
  h.rows = s.rank() >= 2 ? s[s.rank() - 2] : 1;
  h.slices = h.rows * h.cols == 0 ? 0 : s.numel() / (h.rows * h.cols);
  return h;
}

// The slices side by side, one blank cell apart.
int64_t width(const HeatMap& h) { return h.slices * h.cols + h.slices - 1; }

}  // namespace

bool heat_map_fits(const Shape& shape, int64_t max_side) {
  if (shape.rank() == 0 || shape.numel() == 0) return false;
  const HeatMap h = layout(shape);
  return h.rows <= max_side && width(h) <= 2 * max_side;
}

std::optional<HeatMap> heat_map(const Tensor& t, int64_t max_side) {
  if (!t.defined() || t.dtype() == DType::i32 || !heat_map_fits(t.shape(), max_side)) return std::nullopt;
  HeatMap h = layout(t.shape());
  const std::vector<double> x = t.to_vector();
  for (const double v : x) {
    if (!std::isfinite(v)) return std::nullopt;
    h.scale = std::max(h.scale, std::abs(v));
  }
  // Cells of 6 points, 4 where the map is long: a 64 × 128 map stays 512 points wide.
  const int cell = std::max(h.rows, width(h)) > 32 ? 4 : 6;
  const std::string size = fmt::format("WIDTH=\"{0}\" HEIGHT=\"{0}\" FIXEDSIZE=\"TRUE\"", cell);
  h.table = fmt::format(
      "<TABLE BORDER=\"0\" CELLBORDER=\"0\" CELLSPACING=\"0\" CELLPADDING=\"0\" FIXEDSIZE=\"TRUE\" WIDTH=\"{}\" "
      "HEIGHT=\"{}\">",
      width(h) * cell, h.rows * cell);
  for (int64_t r = 0; r < h.rows; ++r) {
    h.table += "<TR>";
    for (int64_t s = 0; s < h.slices; ++s) {
      if (s > 0) h.table += fmt::format("<TD {}></TD>", size);
      for (int64_t c = 0; c < h.cols; ++c)
        h.table += fmt::format("<TD BGCOLOR=\"{}\" {}></TD>",
                               heat_colour(x[static_cast<size_t>((s * h.rows + r) * h.cols + c)], h.scale), size);
    }
    h.table += "</TR>";
  }
  h.table += "</TABLE>";
  return h;
}

}  // namespace tapegrad
