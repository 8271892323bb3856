// Training curves as files: a CSV log, and a plain SVG line chart (no plotting library). Both are written
// atomically, so a viewer that reloads them during training never sees half a file.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tapegrad {

struct LossRow {
  int64_t step = 0;
  double lr = 0;
  double train_loss = 0;
  std::optional<double> val_loss;  // set only at the steps where validation ran
  double ms_per_step = 0;
};

// Columns step,lr,train_loss,val_loss,ms_per_step; val_loss is empty in the rows between evaluations.
// Numbers are written in their shortest form that reads back exactly.
void write_loss_csv(const std::string& path, std::span<const LossRow> rows);

struct PlotSeries {
  std::string label;
  std::vector<std::pair<double, double>> points;  // (step, value); non-finite values are skipped
};

// A line chart: one polyline per series in its own colour (points marked when a series is sparse), axes with
// ticks at round numbers, axis labels, the title on top and a legend on the right.
void write_loss_svg(const std::string& path, std::string_view title, std::span<const PlotSeries> series,
                    std::string_view x_label = "step", std::string_view y_label = "loss");

// The SVG text that write_loss_svg writes.
std::string loss_svg(std::string_view title, std::span<const PlotSeries> series, std::string_view x_label = "step",
                     std::string_view y_label = "loss");

}  // namespace tapegrad
