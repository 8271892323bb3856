// Sine: a small MLP (1 → 32 → 32 → 1, tanh) fits y = sin(x) on [−π, π] with AdamW and the mean squared error,
// prints the error as it goes, and draws the fit over the target in sine.svg.
//   sine [steps] [svg path]          defaults: 2000 steps, sine.svg
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.hpp>

using namespace tapegrad;

constexpr int64_t kPoints = 256;

// The model's prediction at each x: (n) → (n).
std::vector<float> predict(const MLP& model, const std::vector<float>& x) {
  Tape tape;
  NoGradGuard no_grad(tape);
  const int64_t n = static_cast<int64_t>(x.size());
  const Tensor y = model(tape, tape.constant(Tensor::from<float>({n, 1}, x))).value();
  std::vector<float> out(x.size());
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<float>(y.item(i));
  return out;
}

// The target (grey) and the fit (blue) as two polylines over x ∈ [−π, π], y ∈ [−1.2, 1.2].
void write_svg(const std::string& path, const std::vector<float>& x, const std::vector<float>& target,
               const std::vector<float>& fit) {
  const double w = 640, h = 320, pi = std::acos(-1.0);
  auto line = [&](const std::vector<float>& y, const char* colour, double width) {
    std::string points;
    for (size_t i = 0; i < x.size(); ++i)
      points += fmt::format("{:.1f},{:.1f} ", (x[i] + pi) / (2 * pi) * w, (1.2 - y[i]) / 2.4 * h);
    return fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"{}\" points=\"{}\"/>\n", colour, width,
                       points);
  };
  std::ofstream(path) << fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\">\n", w, h)
                      << fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"white\"/>\n", w, h)
                      << line(target, "#bbbbbb", 6) << line(fit, "#2e6fb7", 2)
                      << "<text x=\"10\" y=\"20\" font-family=\"sans-serif\" font-size=\"14\">sin x (grey) and "
                         "the MLP's fit (blue)</text>\n</svg>\n";
}

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::stoll(argv[1]) : 2000;
  const std::string svg_path = argc > 2 ? argv[2] : "sine.svg";

  const double pi = std::acos(-1.0);
  std::vector<float> x(kPoints), y(kPoints);
  for (int64_t i = 0; i < kPoints; ++i) {
    x[static_cast<size_t>(i)] = static_cast<float>(-pi + 2 * pi * static_cast<double>(i) / (kPoints - 1));
    y[static_cast<size_t>(i)] = std::sin(x[static_cast<size_t>(i)]);
  }
  const Tensor inputs = Tensor::from<float>({kPoints, 1}, x), targets = Tensor::from<float>({kPoints, 1}, y);

  MLP model("mlp", {1, 32, 32, 1}, 3, {.activation = Activation::tanh});
  AdamW opt(model.parameters(), {.lr = 1e-2});
  Tape tape;
  double mse = 0;
  for (int64_t step = 1; step <= steps; ++step) {
    Var loss = mse_loss(model(tape, tape.constant(inputs)), tape.constant(targets));
    tape.backward(loss);
    mse = loss.value().item();
    tape.clear();
    opt.set_lr(1e-2 * (step > steps / 2 ? 0.1 : 1.0));  // a tenth of the rate for the second half
    opt.step();
    opt.zero_grad();
    if (step % 250 == 0 || step == steps) std::printf("step %5lld  mse %.2e\n", static_cast<long long>(step), mse);
  }
  const std::vector<float> fit = predict(model, x);
  double final_mse = 0;
  for (size_t i = 0; i < x.size(); ++i) final_mse += (fit[i] - y[i]) * (fit[i] - y[i]) / kPoints;
  write_svg(svg_path, x, y, fit);
  std::printf("final mse %.2e over %lld points; plot in %s\n", final_mse, static_cast<long long>(kPoints),
              svg_path.c_str());
  return final_mse < 1e-4 ? 0 : 1;
}
