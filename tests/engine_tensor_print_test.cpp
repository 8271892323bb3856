// Seeded random tensors (Tensor::randn, Tensor::uniform) and printing (Tensor::str, operator<<, fmt).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "engine/tape.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}
double std_of(const std::vector<double>& v) {
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}
size_t count(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + part.size())) ++n;
  return n;
}

}  // namespace

TEST_CASE("randn draws Rng::normal per element, row-major; the same seed gives the same tensor") {
  const Tensor a = Tensor::randn(DType::f64, {3, 4}, 7);
  Rng rng(7);
  for (int64_t i = 0; i < a.numel(); ++i) CHECK(a.item(i) == rng.normal());
  CHECK(Tensor::randn(DType::f64, {3, 4}, 7).to_vector() == a.to_vector());
  CHECK(Tensor::randn(DType::f64, {3, 4}, 8).to_vector() != a.to_vector());
  // float32: the same draws, rounded.
  const Tensor f = Tensor::randn(DType::f32, {3, 4}, 7);
  CHECK(f.dtype() == DType::f32);
  for (int64_t i = 0; i < f.numel(); ++i) CHECK(f.item(i) == static_cast<double>(static_cast<float>(a.item(i))));
  // mean + std·N(0, 1)
  const Tensor s = Tensor::randn(DType::f64, {3, 4}, 7, 2.0, 0.5);
  for (int64_t i = 0; i < s.numel(); ++i) CHECK(s.item(i) == doctest::Approx(2.0 + 0.5 * a.item(i)));
}

TEST_CASE("randn and uniform have the stated distributions (20000 draws of a fixed seed)") {
  const auto n = Tensor::randn(DType::f64, {20000}, 1).to_vector();
  CHECK(std::fabs(mean_of(n)) < 0.03);
  CHECK(std::fabs(std_of(n) - 1) < 0.03);
  const auto u = Tensor::uniform(DType::f64, {20000}, 2, -1.0, 3.0).to_vector();
  CHECK(*std::min_element(u.begin(), u.end()) >= -1.0);
  CHECK(*std::max_element(u.begin(), u.end()) < 3.0);
  CHECK(std::fabs(mean_of(u) - 1.0) < 0.05);
  CHECK(std::fabs(std_of(u) - 4 / std::sqrt(12.0)) < 0.03);  // the std of U[a, b) is (b − a)/√12
  const auto unit = Tensor::uniform(DType::f32, {1000}, 3).to_vector();
  CHECK(*std::min_element(unit.begin(), unit.end()) >= 0.0);
  CHECK(*std::max_element(unit.begin(), unit.end()) <= 1.0);
}

TEST_CASE("a tensor from an Rng continues its sequence; from a seed it restarts") {
  Rng rng(5);
  const Tensor first = Tensor::randn(DType::f64, {4}, rng);
  const Tensor second = Tensor::randn(DType::f64, {4}, rng);
  CHECK(first.to_vector() == Tensor::randn(DType::f64, {4}, 5).to_vector());
  CHECK(second.to_vector() != first.to_vector());
  CHECK(Tensor::randn(DType::f64, {8}, 5).to_vector() ==
        std::vector<double>{first.item(0), first.item(1), first.item(2), first.item(3), second.item(0), second.item(1),
                            second.item(2), second.item(3)});
}

TEST_CASE("randn and uniform refuse int32 and bad parameters, naming themselves") {
  check_message(error_of([] { Tensor::randn(DType::i32, {2}, 1); }), "randn", {"int32", "(2)"});
  check_message(error_of([] { Tensor::uniform(DType::i32, {2}, 1); }), "uniform", {"int32"});
  check_message(error_of([] { Tensor::randn(DType::f32, {2}, 1, 0.0, -1.0); }), "randn", {"std -1"});
  check_message(error_of([] { Tensor::uniform(DType::f32, {2}, 1, 2.0, 1.0); }), "uniform", {"[2, 1)", "lo ≤ hi"});
}

TEST_CASE("a tensor prints its dtype, shape and values, nested as the shape") {
  const Tensor t = tensor_of({2, 3}, {1, 0.5, -2, 3, 4, 2.5}, DType::f32);
  CHECK(t.str() ==
        "Tensor float32 (2, 3)\n"
        "[[  1, 0.5,  -2],\n"
        " [  3,   4, 2.5]]");
  CHECK(tensor_of({}, {3.25}, DType::f64).str() == "Tensor float64 () 3.25");
  CHECK(Tensor::from<int32_t>({3}, {7, -12, 0}).str() == "Tensor int32 (3)\n[  7, -12,   0]");
  CHECK(Tensor().str() == "Tensor (undefined)");
  CHECK(Tensor::zeros(DType::f32, {0}).str() == "Tensor float32 (0)\n[]");
  // rank 3: a blank line between the (2, 2) blocks
  CHECK(tensor_of({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8}, DType::f64).str() ==
        "Tensor float64 (2, 2, 2)\n"
        "[[[1, 2],\n"
        "  [3, 4]],\n"
        "\n"
        " [[5, 6],\n"
        "  [7, 8]]]");
}

TEST_CASE("a tensor of more than 1000 elements shows the first and last 3 entries of each long axis") {
  std::vector<double> v(40 * 50);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  const std::string s = tensor_of({40, 50}, v, DType::f64).str();
  CAPTURE(s);
  CHECK(s.rfind("Tensor float64 (40, 50)\n[[   0,    1,    2, ...,   47,   48,   49],\n", 0) == 0);
  CHECK(s.find("[1950, 1951, 1952, ..., 1997, 1998, 1999]]") != std::string::npos);
  CHECK(count(s, "\n") == 7);                   // 8 lines: the header, 3 rows, "...", 3 rows
  CHECK(count(s, "...") == 7);                  // one per row shown, and the rows' own gap
  CHECK(s.find("   3,") == std::string::npos);  // elided: no middle element of a row
  // 1000 elements or fewer: all shown
  std::vector<double> w(1000, 1.0);
  CHECK(tensor_of({10, 100}, w, DType::f32).str().find("...") == std::string::npos);
}

TEST_CASE("operator<< and fmt print what str() does; a Var prints its id and value") {
  const Tensor t = tensor_of({2}, {1.5, -3}, DType::f32);
  std::ostringstream os;
  os << t;
  CHECK(os.str() == t.str());
  CHECK(fmt::format("{}", t) == t.str());

  Tape tape;
  Var x = tape.leaf(t);
  CHECK(fmt::format("{}", x) == "Var #0 " + t.str());
  std::ostringstream vs;
  vs << x;
  CHECK(vs.str() == fmt::format("{}", x));
  CHECK(fmt::format("{}", Var{}) == "Var (undefined)");
  tape.clear();
  CHECK(fmt::format("{}", x) == "Var #0 (from before Tape::clear())");
}
