#include "models/plot.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "models/files.hpp"

namespace tapegrad {

void write_loss_csv(const std::string& path, std::span<const LossRow> rows) {
  std::string csv = "step,lr,train_loss,val_loss,ms_per_step\n";
  auto number = [](double v) { return std::isfinite(v) ? fmt::format("{}", v) : std::string(); };  // empty: none
  for (const LossRow& r : rows)
    csv += fmt::format("{},{},{},{},{}\n", r.step, number(r.lr), number(r.train_loss),
                       r.val_loss ? number(*r.val_loss) : std::string(), number(r.ms_per_step));
  write_file_atomic(path, csv);
}

namespace {

// Canvas and plot area, in SVG user units (pixels).
constexpr double kWidth = 840, kHeight = 500;
constexpr double kLeft = 76, kRight = kWidth - 190, kTop = 50, kBottom = kHeight - 58;
// Series with at most this many points get a marker on each point.
constexpr size_t kMarkerLimit = 40;
constexpr std::array<const char*, 10> kColours = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                                  "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

// An axis over [lo, hi], first widened by `margin` × (hi − lo) on each side so that extreme points do not sit
// on the frame, then to multiples of a round tick spacing: 1, 2 or 5 × 10^k, with at most `target` intervals.
struct Axis {
  double lo, hi, step;
  int decimals;  // enough to tell neighbouring ticks apart

  Axis(double data_lo, double data_hi, int target, double margin) {
    if (!(data_lo <= data_hi)) data_lo = 0, data_hi = 1;  // no finite data
    if (data_hi - data_lo <= 1e-12 * std::max(1.0, std::abs(data_lo))) {
      double pad = std::max(0.5, 0.05 * std::abs(data_lo));
      data_lo -= pad, data_hi += pad;
    }
    double pad = margin * (data_hi - data_lo);
    data_lo -= pad, data_hi += pad;
    double raw = (data_hi - data_lo) / target;
    double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
    double ratio = raw / magnitude;
    step = (ratio <= 1 ? 1 : ratio <= 2 ? 2 : ratio <= 5 ? 5 : 10) * magnitude;
    lo = std::floor(data_lo / step + 1e-9) * step;
    hi = std::ceil(data_hi / step - 1e-9) * step;
    decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  }
  int ticks() const { return static_cast<int>(std::lround((hi - lo) / step)) + 1; }
  double tick(int i) const { return lo + i * step; }
  std::string label(double v) const { return fmt::format("{:.{}f}", v + 0.0, decimals); }
  // Position of v on a screen interval [a, b] that maps lo → a and hi → b.
  double map(double v, double a, double b) const { return a + (v - lo) / (hi - lo) * (b - a); }
};

}  // namespace

std::string loss_svg(std::string_view title, std::span<const PlotSeries> series, std::string_view x_label,
                     std::string_view y_label) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  double x_lo = inf, x_hi = -inf, y_lo = inf, y_hi = -inf;
  for (const auto& s : series)
    for (auto [x, y] : s.points)
      if (std::isfinite(x) && std::isfinite(y)) {
        x_lo = std::min(x_lo, x), x_hi = std::max(x_hi, x);
        y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
      }
  Axis ax(x_lo, x_hi, 8, 0.0), ay(y_lo, y_hi, 6, 0.03);
  auto px = [&](double x) { return ax.map(x, kLeft, kRight); };
  auto py = [&](double y) { return ay.map(y, kBottom, kTop); };

  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
      kWidth, kHeight);
  svg += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"white\"/>\n", kWidth, kHeight);
  svg += fmt::format(
      "<text x=\"{:.1f}\" y=\"30\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">{}</text>\n",
      (kLeft + kRight) / 2, xml_escape(title));

  // Grid, ticks and tick labels.
  svg += "<g stroke=\"#e6e6e6\" stroke-width=\"1\">\n";
  for (int i = 0; i < ax.ticks(); ++i)
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\"/>\n", px(ax.tick(i)), kTop, kBottom);
  for (int i = 0; i < ay.ticks(); ++i)
    svg += fmt::format("<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\"/>\n", py(ay.tick(i)), kLeft, kRight);
  svg += "</g>\n<g stroke=\"#333333\" stroke-width=\"1\">\n";
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\"/>\n", kLeft, kBottom, kRight);
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>\n", kLeft, kTop, kBottom);
  for (int i = 0; i < ax.ticks(); ++i)
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\"/>\n", px(ax.tick(i)), kBottom,
                       kBottom + 5);
  for (int i = 0; i < ay.ticks(); ++i)
    svg +=
        fmt::format("<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\"/>\n", py(ay.tick(i)), kLeft - 5, kLeft);
  svg += "</g>\n<g fill=\"#333333\">\n";
  for (int i = 0; i < ax.ticks(); ++i)
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", px(ax.tick(i)), kBottom + 19,
                       ax.label(ax.tick(i)));
  for (int i = 0; i < ay.ticks(); ++i)
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" dy=\"0.35em\" text-anchor=\"end\">{}</text>\n", kLeft - 8,
                       py(ay.tick(i)), ay.label(ay.tick(i)));
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" font-size=\"13\">{}</text>\n",
                     (kLeft + kRight) / 2, kBottom + 42, xml_escape(x_label));
  svg += fmt::format(
      "<text transform=\"translate(20 {:.1f}) rotate(-90)\" text-anchor=\"middle\" "
      "font-size=\"13\">{}</text>\n</g>\n",
      (kTop + kBottom) / 2, xml_escape(y_label));

  // One polyline per series, then its legend entry.
  for (size_t k = 0; k < series.size(); ++k) {
    const PlotSeries& s = series[k];
    const char* colour = kColours[k % kColours.size()];
    std::string points;
    size_t n = 0;
    for (auto [x, y] : s.points)
      if (std::isfinite(x) && std::isfinite(y)) points += fmt::format("{}{:.1f},{:.1f}", n++ ? " " : "", px(x), py(y));
    bool markers = n <= kMarkerLimit;
    svg += fmt::format("<g stroke=\"{0}\" fill=\"{0}\">\n", colour);
    svg +=
        fmt::format("<polyline fill=\"none\" stroke-width=\"1.8\" stroke-linejoin=\"round\" points=\"{}\"/>\n", points);
    if (markers)
      for (auto [x, y] : s.points)
        if (std::isfinite(x) && std::isfinite(y))
          svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\"/>\n", px(x), py(y));
    double ly = kTop + 12 + 22 * static_cast<double>(k);
    svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke-width=\"2.5\"/>\n", kRight + 18,
                       ly, kRight + 44, ly);
    if (markers) svg += fmt::format("<circle cx=\"{}\" cy=\"{:.1f}\" r=\"3\"/>\n", kRight + 31, ly);
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" dy=\"0.35em\" stroke=\"none\" fill=\"#222222\">{}</text>\n</g>\n",
                       kRight + 52, ly, xml_escape(s.label));
  }
  svg += "</svg>\n";
  return svg;
}

void write_loss_svg(const std::string& path, std::string_view title, std::span<const PlotSeries> series,
                    std::string_view x_label, std::string_view y_label) {
  write_file_atomic(path, loss_svg(title, series, x_label, y_label));
}

}  // namespace tapegrad
