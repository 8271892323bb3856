// Two moons: an MLP learns to tell apart the points of two interleaved half circles, trained with SGD on the
// whole set at each step; it prints the loss and the accuracy as it goes and draws its decision boundary under
// the points in two_moons.svg.
//   two_moons [steps] [svg path]         defaults: 300 steps, two_moons.svg
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.hpp>

using namespace tapegrad;

// n points on each moon with Gaussian noise of standard deviation `noise` per coordinate: label 0 on the upper
// half circle of radius 1 around (0, 0), label 1 on the lower one around (1, 0.5).
void make_moons(int64_t n, double noise, uint64_t seed, std::vector<float>& xy, std::vector<int32_t>& label) {
  Rng rng(seed);
  const double pi = std::acos(-1.0);
  for (int32_t moon = 0; moon < 2; ++moon)
    for (int64_t i = 0; i < n; ++i) {
      const double t = pi * static_cast<double>(i) / static_cast<double>(n - 1);
      const double x = moon == 0 ? std::cos(t) : 1 - std::cos(t);
      const double y = moon == 0 ? std::sin(t) : 0.5 - std::sin(t);
      xy.push_back(static_cast<float>(x + noise * rng.normal()));
      xy.push_back(static_cast<float>(y + noise * rng.normal()));
      label.push_back(moon);
    }
}

// The class with the larger logit, for each row of logits (N, 2).
std::vector<int32_t> predict(const MLP& model, const std::vector<float>& xy) {
  Tape tape;
  NoGradGuard no_grad(tape);
  const int64_t n = static_cast<int64_t>(xy.size()) / 2;
  Var logits = model(tape, tape.constant(Tensor::from<float>({n, 2}, xy)));
  const Tensor z = logits.value();
  std::vector<int32_t> cls(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) cls[static_cast<size_t>(i)] = z.item(2 * i + 1) > z.item(2 * i);
  return cls;
}

double accuracy(const std::vector<int32_t>& predicted, const std::vector<int32_t>& label) {
  int64_t right = 0;
  for (size_t i = 0; i < label.size(); ++i) right += predicted[i] == label[i];
  return static_cast<double>(right) / static_cast<double>(label.size());
}

// The plane [-1.6, 2.6] × [-1.1, 1.6] coloured by the predicted class on a 80 × 50 grid, and the points on top.
void write_svg(const std::string& path, const MLP& model, const std::vector<float>& xy,
               const std::vector<int32_t>& label) {
  const double x0 = -1.6, x1 = 2.6, y0 = -1.1, y1 = 1.6, scale = 150;
  const int nx = 80, ny = 50;
  auto px = [&](double x) { return (x - x0) * scale; };
  auto py = [&](double y) { return (y1 - y) * scale; };
  std::vector<float> grid;
  for (int j = 0; j < ny; ++j)
    for (int i = 0; i < nx; ++i) {
      grid.push_back(static_cast<float>(x0 + (i + 0.5) * (x1 - x0) / nx));
      grid.push_back(static_cast<float>(y1 - (j + 0.5) * (y1 - y0) / ny));
    }
  const std::vector<int32_t> region = predict(model, grid);
  const char* fill[2][2] = {{"#f6d5b8", "#c9dcf2"}, {"#e07b28", "#2e6fb7"}};  // [point?][class]
  const double w = px(x1), h = py(y0), cw = w / nx, ch = h / ny;
  std::string svg =
      fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\">\n", w, h);
  for (int j = 0; j < ny; ++j)
    for (int i = 0; i < nx; ++i)
      svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\"/>\n", i * cw,
                         j * ch, cw + 0.3, ch + 0.3, fill[0][region[static_cast<size_t>(j * nx + i)]]);
  for (size_t k = 0; k < label.size(); ++k)
    svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\" stroke=\"white\"/>\n", px(xy[2 * k]),
                       py(xy[2 * k + 1]), fill[1][label[k]]);
  svg += "</svg>\n";
  std::ofstream(path) << svg;
}

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::stoll(argv[1]) : 300;
  const std::string svg_path = argc > 2 ? argv[2] : "two_moons.svg";

  std::vector<float> xy;
  std::vector<int32_t> label;
  make_moons(100, 0.1, 7, xy, label);
  const int64_t n = static_cast<int64_t>(label.size());
  const Tensor x = Tensor::from<float>({n, 2}, xy), y = Tensor::from<int32_t>({n}, label);

  MLP model("mlp", {2, 16, 16, 2}, 42);  // Linear 2→16, relu, Linear 16→16, relu, Linear 16→2
  SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  Tape tape;
  for (int64_t step = 1; step <= steps; ++step) {
    Var loss = cross_entropy(model(tape, tape.constant(x)), tape.constant(y));  // mean over the points
    tape.backward(loss);
    const double value = loss.value().item();
    tape.clear();
    opt.step();
    opt.zero_grad();
    if (step % 50 == 0 || step == steps)
      std::printf("step %4lld  loss %.4f  accuracy %.1f%%\n", static_cast<long long>(step), value,
                  100 * accuracy(predict(model, xy), label));
  }
  const double acc = accuracy(predict(model, xy), label);
  write_svg(svg_path, model, xy, label);
  std::printf("final accuracy %.1f%% on %lld points; decision boundary in %s\n", 100 * acc, static_cast<long long>(n),
              svg_path.c_str());
  return acc >= 0.97 ? 0 : 1;
}
