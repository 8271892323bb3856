// Sharpness as a model trains: an MLP on two moons, trained by plain gradient descent on the whole set at a
// learning rate η; every few steps the largest eigenvalue λ_max of the loss's Hessian over the parameters, by
// power iteration on exact Hessian-vector products (models/sharpness.hpp). Gradient descent is stable on a
// quadratic only while λ_max < 2/η; the run shows λ_max rising to that line as the loss falls (and, once past it,
// pushed back under it). It prints the figures and writes sharpness.csv and sharpness.svg: the loss beside λ_max
// and 2/η. Exit 0 when λ_max came within 20% of 2/η from below its start.
//   sharpness [steps] [learning rate] [directory]      defaults: 600 steps, η = 0.5, the current directory
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.hpp>

using namespace tapegrad;

// n points on each moon with Gaussian noise per coordinate: label 0 on the upper half circle of radius 1 around
// (0, 0), label 1 on the lower one around (1, 0.5).
void make_moons(int64_t n, double noise, uint64_t seed, std::vector<float>& xy, std::vector<int32_t>& label) {
  Rng rng(seed);
  const double pi = std::acos(-1.0);
  for (int32_t moon = 0; moon < 2; ++moon)
    for (int64_t i = 0; i < n; ++i) {
      const double t = pi * static_cast<double>(i) / static_cast<double>(n - 1);
      xy.push_back(static_cast<float>((moon == 0 ? std::cos(t) : 1 - std::cos(t)) + noise * rng.normal()));
      xy.push_back(static_cast<float>((moon == 0 ? std::sin(t) : 0.5 - std::sin(t)) + noise * rng.normal()));
      label.push_back(moon);
    }
}

// Two charts side by side in one SVG: each chart is models/plot.hpp's, nested at its offset.
std::string side_by_side(const std::string& left, const std::string& right, int width, int height) {
  auto at = [](const std::string& svg, int x) {
    return "<g transform=\"translate(" + std::to_string(x) + ",0)\">\n" + svg + "</g>\n";
  };
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(2 * width) + "\" height=\"" +
         std::to_string(height) + "\">\n" + at(left, 0) + at(right, width) + "</svg>\n";
}

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::stoll(argv[1]) : 600;
  const double lr = argc > 2 ? std::stod(argv[2]) : 0.5;
  const std::string dir = argc > 3 ? std::string(argv[3]) + "/" : "";
  const int64_t every = std::max<int64_t>(1, steps / 40);

  std::vector<float> xy;
  std::vector<int32_t> label;
  make_moons(100, 0.1, 7, xy, label);
  const int64_t n = static_cast<int64_t>(label.size());
  const Tensor x = Tensor::from<float>({n, 2}, xy), y = Tensor::from<int32_t>({n}, label);

  MLP model("mlp", {2, 16, 16, 2}, 42, {.activation = Activation::tanh});
  SGD opt(model.parameters(), {.lr = lr});  // plain gradient descent: no momentum, the whole set each step
  const LossFunction loss = [&](Tape& tape) { return cross_entropy(model(tape, tape.constant(x)), tape.constant(y)); };

  PlotSeries losses{"training loss", {}}, lambda{"λ_max", {}}, edge{"2/η", {}};
  std::string csv = "step,loss,sharpness,two_over_lr,iterations\n";
  std::printf("%6s  %8s  %8s  %6s   (2/η = %.3g)\n", "step", "loss", "λ_max", "HVPs", 2 / lr);
  double first_lambda = 0, peak_lambda = 0;
  Tape tape;
  for (int64_t step = 0; step <= steps; ++step) {
    if (step % every == 0 || step == steps) {
      const Sharpness s = sharpness(model, loss, {.iterations = 50, .tolerance = 1e-4});
      if (step == 0) first_lambda = s.largest;
      peak_lambda = std::max(peak_lambda, s.largest);
      std::printf("%6lld  %8.4f  %8.3f  %6d\n", static_cast<long long>(step), s.loss, s.largest, s.iterations);
      lambda.points.emplace_back(static_cast<double>(step), s.largest);
      edge.points.emplace_back(static_cast<double>(step), 2 / lr);
      csv += std::to_string(step) + "," + std::to_string(s.loss) + "," + std::to_string(s.largest) + "," +
             std::to_string(2 / lr) + "," + std::to_string(s.iterations) + "\n";
    }
    if (step == steps) break;
    Var l = loss(tape);
    tape.backward(l);
    losses.points.emplace_back(static_cast<double>(step), l.value().item());
    tape.clear();
    opt.step();
    opt.zero_grad();
  }
  write_file_atomic(dir + "sharpness.csv", csv);
  const PlotSeries curvature[] = {lambda, edge};
  write_file_atomic(dir + "sharpness.svg",
                    side_by_side(loss_svg("training loss (gradient descent, whole set)", std::span(&losses, 1)),
                                 loss_svg("largest Hessian eigenvalue", curvature, "step", "λ_max"), 840, 500));
  std::printf("λ_max rose from %.3f to a peak of %.3f (2/η = %.3g); wrote %ssharpness.csv and %ssharpness.svg\n",
              first_lambda, peak_lambda, 2 / lr, dir.c_str(), dir.c_str());
  return peak_lambda > first_lambda && peak_lambda >= 0.8 * 2 / lr ? 0 : 1;
}
