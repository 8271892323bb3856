// Nodes checked at the precision they run (checker/precision.hpp): every registered op passes at f32 and at
// bf16; a node with a slip in its float32 code alone passes in float64, fails at f32 and bf16 and is named; a node
// whose float32 code sends a sum through a product is named a rounding defect at bf16, not a slip; and
// docs/gradchecking.md shows these reports as they are printed. The bf16 tests are skipped (doctest's skip, with
// the reason printed) where this CPU or build cannot run bf16 products.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <type_traits>

#include "ops/products/blas.hpp"
#include "checker/precision.hpp"
#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using tapegrad::testing::random_tensor;

namespace {

// Where bf16 products cannot run: true, and why on stderr (once), for doctest::skip.
bool without_bf16() {
  static const bool skip = [] {
    const std::string why = bf16_unavailable_reason();
    if (!why.empty()) std::fprintf(stderr, "skipping the checks at bf16: %s\n", why.c_str());
    return !why.empty();
  }();
  return skip;
}

// y = a·b for a (m, k), b (k, n): ā += ȳ·bᵀ, b̄ += aᵀ·ȳ, ẏ = ȧ·b + a·ḃ, with a slip in the float32 code alone: its
// ā is 1.5·ȳ·bᵀ. No float64 check can see it.
Var float32_slip_matmul(Var a, Var b) {
  Tape& tape = a.tape();
  const int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  Tensor y = tape.empty(a.dtype(), {m, n});
  const Tensor av = a.value(), bv = b.value();
  dispatch_float("float32_slip_matmul", a.dtype(), [&]<class T>(T) {
    gemm<T>(m, n, k, 1, as_is(av.data<T>(), k), as_is(bv.data<T>(), n), 0, y.data<T>(), n);
  });
  return tape.record(
      "float32_slip_matmul", {a, b}, y,
      [=](const Tensor& g, std::span<Tensor> gin) {
        dispatch_float("float32_slip_matmul", g.dtype(), [&]<class T>(T) {
          T factor = 1;
          if constexpr (std::is_same_v<T, float>) factor = 1.5f;  // the slip
          if (gin[0].defined())
            gemm<T>(m, k, n, factor, as_is(g.data<T>(), n), transposed(bv.data<T>(), n), 1, gin[0].data<T>(), k);
          if (gin[1].defined())
            gemm<T>(k, n, m, 1, transposed(av.data<T>(), k), as_is(g.data<T>(), n), 1, gin[1].data<T>(), n);
        });
      },
      [=](std::span<const Tensor> tin, Tensor& tout) {
        dispatch_float("float32_slip_matmul", tout.dtype(), [&]<class T>(T) {
          if (tin[0].defined())
            gemm<T>(m, n, k, 1, as_is(tin[0].data<T>(), k), as_is(bv.data<T>(), n), 1, tout.data<T>(), n);
          if (tin[1].defined())
            gemm<T>(m, n, k, 1, as_is(av.data<T>(), k), as_is(tin[1].data<T>(), n), 1, tout.data<T>(), n);
        });
      });
}

// Row sums y_r = Σ_c x_rc of x (rows, cols): x̄_rc += ȳ_r, ẏ_r = Σ_c ẋ_rc. The float32 code takes each through a
// product with a vector of ones (y = x·1, x̄ += ȳ·1ᵀ, ẏ = ẋ·1), where float64 adds them up: right in float32, and
// at bf16 each product rounds x, ȳ or ẋ to 8 bits.
Var row_sums_through_products(Var x) {
  Tape& tape = x.tape();
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  auto sums = [rows, cols]<class T>(const T* v, T* out) {  // out_r += Σ_c v_rc
    if constexpr (std::is_same_v<T, float>) {
      const std::vector<float> ones(static_cast<size_t>(cols), 1.0f);
      gemm<float>(rows, 1, cols, 1, as_is(v, cols), as_is(ones.data(), 1), 1, out, 1);
    } else {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) out[r] += v[r * cols + c];
    }
  };
  Tensor y = tape.zeros(x.dtype(), {rows});
  const Tensor xv = x.value();
  dispatch_float("row_sums", x.dtype(), [&]<class T>(T) { sums(xv.data<T>(), y.data<T>()); });
  return tape.record(
      "row_sums", {x}, y,
      [=](const Tensor& g, std::span<Tensor> gin) {
        dispatch_float("row_sums", g.dtype(), [&]<class T>(T) {
          T* out = gin[0].data<T>();
          if constexpr (std::is_same_v<T, float>) {
            const std::vector<float> ones(static_cast<size_t>(cols), 1.0f);
            gemm<float>(rows, cols, 1, 1, as_is(g.data<float>(), 1), as_is(ones.data(), cols), 1, out, cols);
          } else {
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t c = 0; c < cols; ++c) out[r * cols + c] += g.data<T>()[r];
          }
        });
      },
      [=](std::span<const Tensor> tin, Tensor& tout) {
        dispatch_float("row_sums", tout.dtype(), [&]<class T>(T) { sums(tin[0].data<T>(), tout.data<T>()); });
      });
}

const std::vector<std::string> kNames{"a", "b"};
std::vector<Tensor> slip_inputs() { return {random_tensor({4, 5}, 3), random_tensor({5, 3}, 4)}; }
const Function kSlip = [](Tape&, std::span<const Var> x) { return float32_slip_matmul(x[0], x[1]); };

const PrecisionRow* row_of(const PrecisionReport& r, std::string_view input, std::string_view check) {
  for (const PrecisionRow& row : r.rows)
    if (row.input == input && row.check == check) return &row;
  return nullptr;
}

// `text` with every digit written as '#': a bf16 product's last bits depend on the CPU's bf16 unit and oneDNN's
// kernel for it, so the docs' numbers are those of one machine; the words, the rows and the kinds are every one's.
std::string digits_masked(std::string text) {
  for (char& c : text)
    if (c >= '0' && c <= '9') c = '#';
  return text;
}

// Whether docs/gradchecking.md shows `text` whole, as it is but for its digits.
bool shown_in_docs(const std::string& text) {
  std::ifstream in(std::string(TAPEGRAD_SOURCE_DIR) + "/docs/gradchecking.md");
  std::ostringstream doc;
  doc << in.rdbuf();
  return digits_masked(doc.str()).find(digits_masked(text)) != std::string::npos;
}

void every_op_passes(ProductPrecision p) {
  size_t rows = 0, cases = 0;
  for (const OpSheet& op : builtin_registry().ops())
    for (const GradcheckCase& c : op.cases) {
      const PrecisionReport r = gradcheck_at_precision(c, p, {}, op.name);
      CHECK_MESSAGE(r.passed, r.str());
      rows += r.rows.size();
      ++cases;
    }
  MESSAGE(cases << " cases, " << rows << " rows at " << precision_name(p));
  CHECK(cases >= 140);
}

// The slip: the float64 check passes; at p, ā's VJP fails and is named a scale of 1.5, the rest passes.
void slip_is_named(ProductPrecision p) {
  const std::vector<Tensor> x = slip_inputs();
  CHECK(gradcheck(kSlip, x, kNames).passed);
  const PrecisionReport r = gradcheck_at_precision(kSlip, x, kNames, p);
  INFO(r.str());
  CHECK_FALSE(r.passed);
  const PrecisionRow* a_vjp = row_of(r, "a", "vjp");
  REQUIRE(a_vjp);
  CHECK_FALSE(a_vjp->passed);
  CHECK(a_vjp->max_err > 0.1 * a_vjp->scale);  // off by half of ā, far beyond rounding
  for (const PrecisionRow& row : r.rows)
    if (&row != a_vjp) CHECK_MESSAGE(row.passed, row.line(p));
  const Diagnosis* scale = r.find(Finding::scale, "a");
  REQUIRE(scale);
  CHECK(scale->message.find("c = 1.5") != std::string::npos);
  CHECK(r.has(Finding::vjp_only, "a"));
  CHECK_FALSE(r.has(Finding::precision_defect));
}

}  // namespace

TEST_CASE("every registered op passes at f32: its VJPs and JVPs in float32 within what rounding explains") {
  every_op_passes(ProductPrecision::f32);
}

TEST_CASE("every registered op passes at bf16, every product rounding its operands" * doctest::skip(without_bf16())) {
  every_op_passes(ProductPrecision::bf16);
}

TEST_CASE("a slip in a node's float32 code alone passes in float64, fails at f32 and is named") {
  slip_is_named(ProductPrecision::f32);
}

TEST_CASE("a slip in a node's float32 code alone fails at bf16 and is named" * doctest::skip(without_bf16())) {
  slip_is_named(ProductPrecision::bf16);
  PrecisionReport r = gradcheck_at_precision(kSlip, slip_inputs(), kNames, ProductPrecision::bf16);
  r.op = "float32_slip_matmul", r.case_name = "a (4, 5) @ b (5, 3)";
  CHECK_MESSAGE(shown_in_docs(r.str()), r.str());
}

TEST_CASE("a sum sent through a product in float32 is a rounding defect at bf16, not a slip" *
          doctest::skip(without_bf16())) {
  const Function f = [](Tape&, std::span<const Var> x) { return row_sums_through_products(x[0]); };
  const std::vector<Tensor> x{random_tensor({3, 40}, 5)};
  const std::vector<std::string> names{"x"};
  CHECK(gradcheck_at_precision(f, x, names, ProductPrecision::f32).passed);
  PrecisionReport r = gradcheck_at_precision(f, x, names, ProductPrecision::bf16);
  r.op = "row_sums", r.case_name = "x (3, 40)";
  INFO(r.str());
  CHECK_FALSE(r.passed);
  const Diagnosis* d = r.find(Finding::precision_defect, "x");
  REQUIRE(d);
  CHECK(d->message.find("the error shrinks with the precision (bf16 → f32: ") == 0);
  for (const Diagnosis& each : r.diagnoses) CHECK_MESSAGE(each.kind == Finding::precision_defect, each.str());
  CHECK_MESSAGE(shown_in_docs(r.str()), r.str());
}

TEST_CASE("a registered op's report at bf16 is the docs' example" * doctest::skip(without_bf16())) {
  const OpSheet* op = builtin_registry().find("matmul");
  REQUIRE(op);
  const PrecisionReport r = gradcheck_at_precision(op->cases.front(), ProductPrecision::bf16, {}, op->name);
  CHECK(r.passed);
  CHECK_MESSAGE(shown_in_docs(r.str()), r.str());
}

TEST_CASE("at bf16 where bf16 products cannot run, the check refuses in one line naming what is missing") {
  // TAPEGRAD_FAKE_NO_BF16=1 makes this CPU answer as one without bf16 units (ops/products/products.hpp).
  const char* before = std::getenv("TAPEGRAD_FAKE_NO_BF16");
  const std::string saved = before ? before : "";
  setenv("TAPEGRAD_FAKE_NO_BF16", "1", 1);
  const std::string why = bf16_unavailable_reason();
  CHECK(why.find("has neither AVX512_BF16 nor AMX-BF16") != std::string::npos);
  CHECK_ERROR_HAS(gradcheck_at_precision(kSlip, slip_inputs(), kNames, ProductPrecision::bf16),
                  "gradcheck at bf16: ", why);
  if (before) setenv("TAPEGRAD_FAKE_NO_BF16", saved.c_str(), 1);
  else unsetenv("TAPEGRAD_FAKE_NO_BF16");
}
