// The loss log as CSV and the loss chart as SVG.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "engine/tensor.hpp"
#include "models/plot.hpp"
#include "training_test_util.hpp"

using namespace tapegrad;
using tapegrad::testing::ScratchDir;
using tapegrad::testing::slurp;

namespace {

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// Checks that tags nest: every <name ...> is closed by </name> in order or self-closes with "/>".
bool tags_balanced(const std::string& s) {
  std::vector<std::string> open;
  for (size_t p = s.find('<'); p != std::string::npos; p = s.find('<', p + 1)) {
    size_t end = s.find('>', p);
    if (end == std::string::npos) return false;
    std::string tag = s.substr(p + 1, end - p - 1);
    if (tag.empty() || tag[0] == '?' || tag[0] == '!') continue;
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return false;
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(tag.substr(0, tag.find(' ')));
    }
  }
  return open.empty();
}

std::vector<PlotSeries> loss_curves() {
  PlotSeries train{"train", {}}, val{"val & <test>", {}};
  for (int s = 0; s <= 2000; s += 10) train.points.push_back({s, 4.2 * std::exp(-s / 500.0) + 1.4});
  for (int s = 0; s <= 2000; s += 250) val.points.push_back({s, 4.25 * std::exp(-s / 520.0) + 1.55});
  return {train, val};
}

}  // namespace

TEST_CASE("the loss CSV has its header and one row per step, val_loss empty between evaluations") {
  ScratchDir dir;
  std::string path = dir.file("loss.csv");
  std::vector<LossRow> rows = {
      {0, 0.0, 4.174, 4.1812, 151.25},
      {1, 3e-4, 3.9, std::nullopt, 98.5},
      {2, 0.001, 3.25, std::nullopt, 97},
      {100, 0.000125, 2.5, 2.625, 101.75},
  };
  write_loss_csv(path, rows);
  CHECK(slurp(path) ==
        "step,lr,train_loss,val_loss,ms_per_step\n"
        "0,0,4.174,4.1812,151.25\n"
        "1,0.0003,3.9,,98.5\n"
        "2,0.001,3.25,,97\n"
        "100,0.000125,2.5,2.625,101.75\n");
  write_loss_csv(path, {});
  CHECK(slurp(path) == "step,lr,train_loss,val_loss,ms_per_step\n");
  CHECK(dir.entries() == std::vector<std::string>{"loss.csv"});
}

TEST_CASE("the loss SVG has one polyline per series, the labels, the title and axes") {
  ScratchDir dir;
  std::string path = dir.file("loss.svg");
  auto series = loss_curves();
  write_loss_svg(path, "GPT on Tiny Shakespeare", series);
  std::string svg = slurp(path);
  CHECK(svg == loss_svg("GPT on Tiny Shakespeare", series));
  CHECK(svg.rfind("<?xml", 0) == 0);
  CHECK(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\"") != std::string::npos);
  CHECK(svg.ends_with("</svg>\n"));
  CHECK(tags_balanced(svg));
  CHECK(count(svg, "<polyline") == 2);
  CHECK(count(svg, "<circle") == 9 + 1);  // the sparse val series is marked, in the legend too
  CHECK(svg.find(">GPT on Tiny Shakespeare</text>") != std::string::npos);
  CHECK(svg.find(">train</text>") != std::string::npos);
  CHECK(svg.find(">val &amp; &lt;test&gt;</text>") != std::string::npos);  // escaped
  CHECK(svg.find(">step</text>") != std::string::npos);
  CHECK(svg.find(">loss</text>") != std::string::npos);
  // Round ticks: steps 0..2000 every 500, losses (1.48..5.8, with a margin) 1..6 every 1.
  for (const char* tick : {">0<", ">500<", ">1000<", ">1500<", ">2000<", ">1<", ">3<", ">6<"})
    CHECK_MESSAGE(svg.find(tick) != std::string::npos, tick);
  CHECK(svg.find(">2500<") == std::string::npos);
  CHECK(svg.find(">7<") == std::string::npos);
  CHECK(svg.find(">0.5<") == std::string::npos);
  // Two different colours.
  CHECK(svg.find("stroke=\"#1f77b4\"") != std::string::npos);
  CHECK(svg.find("stroke=\"#d62728\"") != std::string::npos);
}

TEST_CASE("the SVG copes with no data, one point, flat series and non-finite values") {
  std::vector<PlotSeries> none;
  std::string empty = loss_svg("empty", none);
  CHECK(tags_balanced(empty));
  CHECK(count(empty, "<polyline") == 0);

  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<PlotSeries> odd = {{"one", {{5, 2.0}}},
                                 {"flat", {{0, 3.0}, {10, 3.0}}},
                                 {"gaps", {{0, 1.0}, {1, nan}, {2, std::numeric_limits<double>::infinity()}, {3, 2.0}}},
                                 {"nothing", {}}};
  std::string svg = loss_svg("odd", odd, "iteration", "value");
  CHECK(tags_balanced(svg));
  CHECK(count(svg, "<polyline") == 4);
  CHECK(svg.find("nan") == std::string::npos);
  CHECK(svg.find("inf") == std::string::npos);
  CHECK(svg.find(">iteration</text>") != std::string::npos);
  CHECK(svg.find(">value</text>") != std::string::npos);
}
