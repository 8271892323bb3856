// Claims written as formulas (checker/formulas/claim.hpp): the source posts' claims in docs/claims/ (the wrong
// ones fail with their diagnosis, the right ones pass); each diagnosis kind on slips in ops it was not written for
// (tests/claims/slips.txt); and the expression language itself: values, errors with their column.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "checker/formulas/claim.hpp"
#include "checker/formulas/expression.hpp"
#include "ops/ops.hpp"
#include "test_util.hpp"

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

std::vector<ClaimText> claims_in(const std::string& relative) {
  const std::string path = std::string(TAPEGRAD_SOURCE_DIR) + "/" + relative;
  std::ifstream in(path);
  REQUIRE_MESSAGE(in, "cannot read " << path);
  std::ostringstream s;
  s << in.rdbuf();
  return parse_claims(s.str(), relative);
}

GradcheckReport check_named(const std::vector<ClaimText>& claims, std::string_view name) {
  for (const auto& c : claims)
    if (c.name == name) return check_claim(c);
  FAIL("no claim named " << name);
  return {};
}

// The expression error of a formula over inputs of these shapes, or "" when it evaluates.
ExpressionError error_of(std::string_view text, const std::map<std::string, Shape>& shapes) {
  try {
    Formula::parse(text, "f").check(shapes);
  } catch (const ExpressionError& e) {
    return e;
  }
  return ExpressionError("", "", 0, "no error");
}

// A formula that must be refused, the 0-based column its error points at, and what the message says.
struct ErrorCase {
  const char* text;
  size_t column;
  const char* says;
};

// Each case's error says what it should at its column, with the caret under that column on the line after the
// text.
void check_errors(const std::vector<ErrorCase>& cases, const std::map<std::string, Shape>& shapes) {
  for (const auto& c : cases) {
    CAPTURE(c.text);
    const ExpressionError e = error_of(c.text, shapes);
    CHECK(e.message.find(c.says) != std::string::npos);
    CHECK(e.offset == c.column);
    const std::string what = e.what();
    CHECK(what.find(std::string("\n  ") + c.text + "\n  " + std::string(c.column, ' ') + "^") != std::string::npos);
  }
}

// The claims of a set with the kind each one's "# expect: KIND" line freezes (right: the claim holds), each checked:
// {expected kind, the report}.
std::vector<std::pair<std::string, GradcheckReport>> expected_and_checked(const std::string& relative) {
  std::ifstream in(std::string(TAPEGRAD_SOURCE_DIR) + "/" + relative);
  REQUIRE_MESSAGE(in, "cannot read " << relative);
  std::map<std::string, std::string> expect;
  std::string line, kind;
  while (std::getline(in, line)) {
    if (line.rfind("# expect: ", 0) == 0) kind = line.substr(10);
    else if (line.rfind("claim ", 0) == 0) expect[line.substr(6)] = kind;
  }
  std::vector<std::pair<std::string, GradcheckReport>> out;
  for (const ClaimText& c : claims_in(relative)) out.emplace_back(expect.at(c.name), check_claim(c));
  REQUIRE(out.size() == expect.size());
  return out;
}

// A held-out set checked: every right claim holds, every slip fails and none is "no known kind". Returns how many
// slips it has and how many are named with the kind frozen for them.
std::pair<int, int> slips_and_named(const std::string& relative) {
  int slips = 0, named = 0;
  for (const auto& checked : expected_and_checked(relative)) {
    const std::string& expected = checked.first;  // named, not bound: CAPTURE is a lambda Clang 14 refuses them in
    const GradcheckReport& report = checked.second;
    CAPTURE(report.str());
    CHECK(report.passed() == (expected == "right"));
    if (expected == "right") continue;
    ++slips;
    named += report.has(Finding(expected.c_str())) ? 1 : 0;
    CHECK_FALSE(report.has(Finding::unexplained));
  }
  return {slips, named};
}

}  // namespace

TEST_CASE("the posts' claims in docs/claims: the two wrong ones fail with their diagnosis, the right ones hold") {
  const auto homogeneity = claims_in("docs/claims/beta-homogeneity.txt");
  const GradcheckReport beta = check_named(homogeneity, "beta_homogeneity_jvp");
  MESSAGE(beta.str());
  CHECK_FALSE(beta.passed());
  CHECK(beta.has(Finding::jvp_only, "x"));
  CHECK(beta.has(Finding::radial, "x"));

  const GradcheckReport prose =
      check_named(claims_in("docs/claims/attention-bias-prose-ds.txt"), "attention_bias_prose_ds");
  MESSAGE(prose.str());
  CHECK_FALSE(prose.passed());
  CHECK(prose.has(Finding::vjp_only, "b"));
  CHECK(prose.has(Finding::one_input, "b"));
  CHECK(prose.has(Finding::nonlinear, "b"));  // dA ⊙ dA: degree 2 in the cotangent

  for (const char* file : {"docs/claims/beta-derivative.txt", "docs/claims/attention-bias-code-ds.txt",
                           "docs/claims/attention-gradient.txt", "docs/claims/linear-attention.txt",
                           "docs/claims/attention-shared-bias.txt"}) {
    for (const auto& c : claims_in(file)) {
      CAPTURE(file);
      CAPTURE(c.name);
      const GradcheckReport r = check_claim(c);
      CHECK_MESSAGE(r.passed(), r.str());
    }
  }
}

// A softmax over x's columns (y's rows are x's columns): without its row term the error is a per-row term along
// y's last axis and x's first, named as one along a single axis is.
TEST_CASE("a per-row term whose rows lie along one axis of y and another of x is named") {
  const std::string head = "input x: 4, 6\nforward softmax(transpose(x))\n";
  const GradcheckReport right =
      check_claim(parse_claims(head + "vjp x = transpose(y * (g - sum(y * g, -1)))\n", "f.txt").at(0));
  CHECK_MESSAGE(right.passed(), right.str());
  const GradcheckReport slip = check_claim(parse_claims(head + "vjp x = transpose(y * g)\n", "f.txt").at(0));
  MESSAGE(slip.str());
  CHECK_FALSE(slip.passed());
  const Diagnosis* d = slip.find(Finding::per_row_term, "x");
  REQUIRE(d != nullptr);
  CHECK(d->message.find("the slices of y along axis 1 and of x along axis 0") != std::string::npos);
}

// The same softmax with its row term summed along y's first axis, (1, 4), where its last belongs, (6, 1): the sum
// moved to an axis of another size still broadcasts, and moving it back is the edit that puts the rule right.
TEST_CASE("a row term summed along an axis of another size is a wrong axis") {
  const std::string head = "input x: 4, 6\nforward softmax(transpose(x))\n";
  const GradcheckReport slip =
      check_claim(parse_claims(head + "vjp x = transpose(y * (g - sum(y * g, -2)))\n", "f.txt").at(0));
  MESSAGE(slip.str());
  CHECK_FALSE(slip.passed());
  const Diagnosis* d = slip.find(Finding::wrong_axis, "x");
  REQUIRE(d != nullptr);
  CHECK(d->message.find("reduces over axis -1, not -2") != std::string::npos);
}

// A log-sum-exp over rows whose VJP takes its softmax over the columns, (4, 6), where the rows belong, and one over
// columns whose VJP takes it over the rows: moving the softmax to the other axis is the edit that puts each right.
TEST_CASE("a softmax taken along the wrong axis inside a rule is a wrong axis") {
  const std::string rows = "input x: 4, 6\nforward log(sum(exp(x), -1))\n";
  const GradcheckReport right = check_claim(parse_claims(rows + "vjp x = g * softmax(x)\n", "f.txt").at(0));
  CHECK_MESSAGE(right.passed(), right.str());
  const GradcheckReport slip =
      check_claim(parse_claims(rows + "vjp x = g * transpose(softmax(transpose(x)))\n", "f.txt").at(0));
  MESSAGE(slip.str());
  const Diagnosis* d = slip.find(Finding::wrong_axis, "x");
  REQUIRE(d != nullptr);
  CHECK(d->message.find("takes its softmax along axis -1, not -2") != std::string::npos);
  const std::string columns = "input x: 4, 6\nforward log(sum(exp(x), 0))\n";
  const GradcheckReport column_right =
      check_claim(parse_claims(columns + "vjp x = g * transpose(softmax(transpose(x)))\n", "f.txt").at(0));
  CHECK_MESSAGE(column_right.passed(), column_right.str());
  const GradcheckReport column_slip = check_claim(parse_claims(columns + "vjp x = g * softmax(x)\n", "f.txt").at(0));
  const Diagnosis* e = column_slip.find(Finding::wrong_axis, "x");
  REQUIRE_MESSAGE(e != nullptr, column_slip.str());
  CHECK(e->message.find("takes its softmax along axis -2, not -1") != std::string::npos);
}

// tests/claims/axis_heldout.txt, written apart from the edit search: thirteen ops reducing along an axis other than
// the last, each with its right VJP and slips marked "# expect: KIND". Every right one holds, every slip fails, and
// every reduction moved to another axis (of another size) is named a wrong axis.
TEST_CASE("tests/claims/axis_heldout.txt: every reduction along the wrong axis is named") {
  int wrong_axis = 0;
  for (const auto& checked : expected_and_checked("tests/claims/axis_heldout.txt")) {
    const std::string& e = checked.first;
    const GradcheckReport& r = checked.second;
    CHECK_MESSAGE(r.passed() == (e == "right"), r.str());
    if (e == "wrong_axis") {
      CHECK_MESSAGE(r.has(Finding::wrong_axis), r.str());
      ++wrong_axis;
    }
  }
  CHECK(wrong_axis >= 19);
}

// An element-wise derivative written wrong inside a composite (σ′ as σ, tanh′ as tanh, log′ left out), named a term
// with a wrong factor by the edit search's derivative edits. tests/claims/derivative_build.txt is the set they were
// built on: every expectation holds. tests/claims/derivative_heldout.txt was written apart and frozen before them:
// every right claim holds and every slip fails; 4 of its 5 derivative slips are named so (before: 0), and its
// transposed term is named since a product's span keeps its parentheses (before: no known kind). The fifth, σ′
// written σ in σ(‖x‖), is a factor of each row's own, which the Jacobian names a per-row factor before any edit runs.
TEST_CASE("tests/claims/derivative_*.txt: an element-wise derivative slip inside a composite is named") {
  for (const auto& checked : expected_and_checked("tests/claims/derivative_build.txt")) {
    const std::string& expected = checked.first;
    const GradcheckReport& report = checked.second;
    CAPTURE(report.str());
    CHECK(report.passed() == (expected == "right"));
    if (expected != "right") CHECK(report.has(Finding(expected.c_str())));
  }
  const auto [slips, named] = slips_and_named("tests/claims/derivative_heldout.txt");
  CHECK(slips == 6);
  CHECK(named >= 5);
}

// tests/claims/parenthesised_heldout.txt, written after a product's span came to keep its parentheses: a slip in a
// part that begins or ends with a parenthesised operand. Before that change the transposed inline dS was no known
// kind; now 2 of its 3 slips are named as frozen, the third a transposed Jacobian (the Jacobian names it first).
TEST_CASE("tests/claims/parenthesised_heldout.txt: an edit wraps a part with parentheses whole") {
  const auto [slips, named] = slips_and_named("tests/claims/parenthesised_heldout.txt");
  CHECK(slips == 3);
  CHECK(named >= 2);
}

// The learner's chapter (docs/learn.md §4): layer norm's VJP as formulas holds; without its last term, the one
// through ρ, it is a per-row term of x's VJP, and w and b stay right.
TEST_CASE("docs/claims/layer-norm.txt: the VJP holds, the one without its term through ρ is a per-row term") {
  const auto claims = claims_in("docs/claims/layer-norm.txt");
  const GradcheckReport right = check_named(claims, "layer_norm_vjp");
  CHECK_MESSAGE(right.passed(), right.str());
  const GradcheckReport slip = check_named(claims, "layer_norm_dropped_row_term");
  MESSAGE(slip.str());
  CHECK_FALSE(slip.passed());
  CHECK(slip.has(Finding::per_row_term, "x"));
  CHECK(slip.has(Finding::vjp_only, "x"));
  CHECK(slip.has(Finding::one_input, "x"));
  CHECK_FALSE(slip.has(Finding::unexplained));
  // Each failing row prints what its two numbers are: the rule against central differences, or for the adjoint
  // identity, its two analytic sides.
  const std::string text = slip.str();
  const auto row = [&](const std::string& start) {
    const size_t at = text.find(start);
    REQUIRE(at != std::string::npos);
    return text.substr(at, text.find('\n', at) - at);
  };
  CHECK(row("  x        vjp").find("FAIL  (analytic ") != std::string::npos);
  CHECK(row("  x        vjp").find(", numeric ") != std::string::npos);
  const std::string adjoint = row("  x        adjoint");
  CHECK(adjoint.find("FAIL  (⟨J t, u⟩ ") != std::string::npos);
  CHECK(adjoint.find(", ⟨t, Jᵀu⟩ ") != std::string::npos);
  CHECK(adjoint.find("numeric") == std::string::npos);
}

// Layer norm's x̄ with + before its term through ρ: a rank-one error per row along x̂ and w ⊙ x̂, which the
// per-row fit names α_r·u_r·v_rᵀ at some shapes and misses at others (σ written without ε at (3, 5)). The edit
// search names the flipped sign at every shape, whether ρ carries layer norm's ε or σ is written without it.
TEST_CASE("layer norm's flipped row term is a sign of a term at every shape") {
  const std::pair<int, int> shapes[] = {{3, 5}, {4, 6}, {2, 4}, {5, 3}, {6, 8}, {3, 7}};
  for (const auto& shape : shapes) {
    const int n = shape.first, c = shape.second;  // named, not bound: CAPTURE is a lambda
    const std::string head = fmt::format(
        "input x: {0}, {1}\ninput w: {1}\ninput b: {1}\nlet gh = w * g\n"
        "forward layer_norm(x, w, b)\nlet xc = x - mean(x, -1)\n",
        n, c);
    const std::string with_rho = head +
                                 "let rho = exp(-0.5 * log(mean(xc * xc, -1) + 0.00001))\nlet xh = xc * rho\n"
                                 "vjp x = rho * (gh - mean(gh, -1) + xh * mean(xh * gh, -1))\n";
    const std::string with_sd = head +
                                fmt::format("let sd = norm(xc, -1) / {:.17g}\nlet xh = xc / sd\n", std::sqrt(c)) +
                                "vjp x = (gh - mean(gh, -1) + xh * mean(gh * xh, -1)) / sd\n";
    for (const std::string& text : {with_rho, with_sd}) {
      CAPTURE(n);
      CAPTURE(c);
      CAPTURE(text);
      const GradcheckReport r = check_claim(parse_claims(text, "f.txt").at(0));
      CHECK_FALSE(r.passed());
      CHECK(r.has(Finding::term_sign, "x"));
      CHECK_FALSE(r.has(Finding::per_row_term, "x"));
      CHECK_FALSE(r.has(Finding::unexplained, "x"));
    }
  }
  // A per-row term of vectors the checker names stays one, with no edit searched: the mean of centring added where
  // it is subtracted is α·1·1ᵀ per row.
  const GradcheckReport centred = check_claim(
      parse_claims("input x: 4, 5\nforward 3 * (x - mean(x, -1))\nvjp x = 3 * (g + mean(g, -1))\n", "f.txt").at(0));
  CHECK(centred.has(Finding::per_row_term, "x"));
  CHECK_FALSE(centred.has(Finding::term_sign, "x"));
}

TEST_CASE("every file of docs/claims is run by a test") {
  // A claims file the docs point to must not go stale unchecked: its path is named here or in tests/CMakeLists.txt.
  const std::string root = TAPEGRAD_SOURCE_DIR;
  std::string tests;
  for (const char* f : {"/tests/gradcheck_claims_test.cpp", "/tests/CMakeLists.txt"}) {
    std::ifstream in(root + f);
    std::ostringstream s;
    s << in.rdbuf();
    tests += s.str();
  }
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(root + "/docs/claims")) {
    if (e.path().extension() != ".txt") continue;
    const std::string name = "docs/claims/" + e.path().filename().string();
    CAPTURE(name);
    CHECK(tests.find(name) != std::string::npos);
    ++files;
  }
  CHECK(files >= 8);
}

// Second-order slips as claims: each named by the kind a first-order slip of its shape gets, plus which block
// of the Hessian it sits in.
TEST_CASE("each diagnosis kind names second-order slips (claims with an hvp line)") {
  const auto slips = claims_in("tests/claims/second_order_slips.txt");
  const std::string dadb = "∂a\u0304/∂b", dbda = "∂b\u0304/∂a", dxdx = "∂x\u0304/∂x";  // ā: a + combining macron
  struct Expect {
    const char* claim;
    Finding kind;
    std::string input;
  };
  const Expect table[] = {
      {"hvp_sign_tanh", Finding::sign, dxdx},
      {"hvp_scale_log_softmax", Finding::scale, dxdx},
      {"hvp_row_softmax", Finding::per_row_term, dxdx},
      {"hvp_cross_matmul", Finding::hessian_block, ""},
      {"hvp_cross_matmul", Finding::asymmetric, ""},
      {"hvp_cross_matmul", Finding::zero, dbda},
      {"hvp_transposed_matmul", Finding::transposed_input, dadb},
      {"hvp_first_order_tanh", Finding::first_order, "x"},
  };
  for (const auto& e : table) {
    CAPTURE(e.claim);
    const GradcheckReport r = check_named(slips, e.claim);
    CHECK_FALSE(r.passed());
    CHECK_MESSAGE(r.has(e.kind, e.input), r.str());
    CHECK_FALSE(r.has(Finding::unexplained));
  }
  const GradcheckReport scale = check_named(slips, "hvp_scale_log_softmax");
  CHECK(scale.find(Finding::scale)->message.find("c = 2") != std::string::npos);
  REQUIRE(scale.find(Finding::scale)->factor.has_value());
  CHECK(*scale.find(Finding::scale)->factor == doctest::Approx(2).epsilon(1e-4));
  CHECK(scale.find(Finding::scale)->message.find("second-order rule") != std::string::npos);
  const GradcheckReport first = check_named(slips, "hvp_first_order_tanh");
  CHECK_FALSE(first.has(Finding::sign));  // nothing said of the second order while the first is wrong
}

// Each kind, on slips in ops its check was not written for (the gradchecker's own tests plant them in softmax,
// causal softmax and matmul).
TEST_CASE("each diagnosis kind names slips of its kind in other ops") {
  const auto slips = claims_in("tests/claims/slips.txt");
  struct Expect {
    const char* claim;
    Finding kind;
    const char* input;
  };
  const Expect table[] = {
      {"sign_tanh", Finding::sign, "x"},
      {"sign_log_softmax", Finding::sign, "x"},
      {"sign_row_normalize", Finding::sign, "x"},
      {"sign_attention_v", Finding::sign, "v"},
      {"scale_mean", Finding::scale, "x"},
      {"scale_attention_q", Finding::scale, "q"},
      {"scale_exp_jvp", Finding::scale, "x"},
      {"scale_log", Finding::scale, "x"},
      {"transposed_linear_x", Finding::transposed_jacobian, "x"},
      {"transposed_attention_v", Finding::transposed_jacobian, "v"},
      {"transposed_cumsum", Finding::transposed_jacobian, "x"},
      {"transposed_linear_w", Finding::transposed_input, "w"},
      {"transposed_softmax", Finding::transposed_input, "x"},
      {"transposed_row_normalize_jvp", Finding::transposed_output, "x"},
      {"mask_causal_linear_k", Finding::masked_positions, "k"},
      {"mask_causal_beta_k", Finding::masked_positions, "k"},
      {"mask_cumsum_strict", Finding::masked_positions, "x"},
      {"mask_window_attention_v", Finding::masked_positions, "v"},
      {"mask_cumsum_doubled", Finding::masked_positions, "x"},
      {"mask_padding_rows", Finding::masked_positions, "x"},
      {"row_layer_norm_mean", Finding::per_row_term, "x"},
      {"row_log_softmax", Finding::per_row_term, "x"},
      {"row_normalize_radial", Finding::per_row_term, "x"},
      {"row_centering", Finding::per_row_term, "x"},
      {"row_column_normalize", Finding::per_row_term, "x"},
      {"row_masked_centering", Finding::per_row_term, "x"},
      {"row_masked_centering_jvp", Finding::per_row_term, "x"},
      {"row_selected_centering", Finding::per_row_term, "x"},
      {"transposed_term_attention_k", Finding::transposed_term, "k"},
      {"transposed_term_gram", Finding::transposed_term, "x"},
      {"transposed_term_gram_taken", Finding::transposed_term, "x"},
      {"term_sign_layer_norm", Finding::term_sign, "x"},
      {"wrong_axis_softmax_rowsum", Finding::wrong_axis, "x"},
      {"unexplained_layer_norm", Finding::unexplained, "x"},
  };
  CHECK(std::size(table) == slips.size());
  for (const auto& e : table) {
    CAPTURE(e.claim);
    const GradcheckReport r = check_named(slips, e.claim);
    CHECK_FALSE(r.passed());
    CHECK_MESSAGE(r.has(e.kind, e.input), r.str());
    // One kind per slip: a structured finding never comes with "no known kind".
    if (e.kind != Finding::unexplained) CHECK_FALSE(r.has(Finding::unexplained));
    // The edit search names a transpose only where there is one, and a term's sign only where that is the slip.
    const bool a_transpose = e.kind == Finding::transposed_jacobian || e.kind == Finding::transposed_input ||
                             e.kind == Finding::transposed_output || e.kind == Finding::transposed_term;
    if (!a_transpose) CHECK_MESSAGE(!r.has(Finding::transposed_term), r.str());
    if (e.kind != Finding::term_sign) CHECK_MESSAGE(!r.has(Finding::term_sign), r.str());
    if (e.kind != Finding::wrong_axis) CHECK_MESSAGE(!r.has(Finding::wrong_axis), r.str());
  }
  // What the messages name: the structure of a mask, the axis of a per-row term, where an unknown error sits.
  const GradcheckReport causal = check_named(slips, "mask_causal_linear_k");
  CHECK(causal.find(Finding::masked_positions, "k")->message.find("the triangle j > i") != std::string::npos);
  const GradcheckReport strict = check_named(slips, "mask_cumsum_strict");
  CHECK(strict.find(Finding::masked_positions, "x")->message.find("the diagonal j = i") != std::string::npos);
  const GradcheckReport window = check_named(slips, "mask_window_attention_v");
  CHECK(window.find(Finding::masked_positions, "v")->message.find("the line j − i = −2") != std::string::npos);
  const GradcheckReport doubled = check_named(slips, "mask_cumsum_doubled");  // wrong values, not zeros
  CHECK(doubled.find(Finding::masked_positions, "x")->message.find("lie in the triangle j < i") != std::string::npos);
  const GradcheckReport padding = check_named(slips, "mask_padding_rows");
  CHECK(padding.find(Finding::masked_positions, "x")->message.find("the indices {4, 5} of y axis 0") !=
        std::string::npos);
  CHECK(padding.has(Finding::per_row_term, "x"));  // the padding rows lost their row term
  const GradcheckReport columns = check_named(slips, "row_column_normalize");
  CHECK(columns.find(Finding::per_row_term, "x")->message.find("along axis 0") != std::string::npos);
  const GradcheckReport centering = check_named(slips, "row_centering");
  CHECK(centering.find(Finding::per_row_term, "x")->message.find("α = 0.166667 in every row") != std::string::npos);
  // A term over a subset of each row, degenerate rows (one entry) included: the subset's indicator, its sizes.
  for (const char* name : {"row_masked_centering", "row_masked_centering_jvp", "row_selected_centering"}) {
    CAPTURE(name);
    const GradcheckReport report = check_named(slips, name);
    REQUIRE(report.find(Finding::per_row_term, "x") != nullptr);
    const std::string& subset = report.find(Finding::per_row_term, "x")->message;
    CHECK(subset.find("α_r·1_S·1_Sᵀ with α_r from 0.25 to 1") != std::string::npos);
    CHECK(subset.find("constant on 1 to 4 of its") != std::string::npos);
    CHECK(subset.find("in rows where S_r has one entry the error is that element") != std::string::npos);
  }
  // A transposed term: which value, where it is read, the formula before and after the edit.
  const GradcheckReport dk = check_named(slips, "transposed_term_attention_k");
  CHECK(
      dk.find(Finding::transposed_term, "k")->message.find("once `Omega` (2, 4, 4), made at tests/claims/slips.txt:") !=
      std::string::npos);
  CHECK(
      dk.find(Finding::transposed_term, "k")->message.find("matmul(Omega, q) → matmul(transpose(Omega), q) (1 other") !=
      std::string::npos);
  const GradcheckReport gram = check_named(slips, "transposed_term_gram");
  CHECK(gram.find(Finding::transposed_term, "x")->message.find("(1 other edit of this kind does too)") !=
        std::string::npos);
  const GradcheckReport taken = check_named(slips, "transposed_term_gram_taken");
  CHECK(taken.find(Finding::transposed_term, "x")->message.find("the transpose is taken from `transpose(g)`") !=
        std::string::npos);
  const GradcheckReport term = check_named(slips, "term_sign_layer_norm");
  CHECK(term.find(Finding::term_sign, "x")
            ->message.find("once the sign of `xh * mean(gh * xh, -1)` is flipped at tests/claims/slips.txt:") !=
        std::string::npos);
  CHECK(term.find(Finding::term_sign, "x")
            ->message.find(
                "→ (gh - mean(gh, -1) - xh * mean(gh * xh, -1)) / sd; a term of the rule has the wrong sign") !=
        std::string::npos);
  const GradcheckReport unknown = check_named(slips, "unexplained_layer_norm");
  const std::string& where = unknown.find(Finding::unexplained, "x")->message;
  CHECK(where.find("the error concentrates in rows of y") != std::string::npos);
  CHECK(where.find("the largest: y[") != std::string::npos);
}

TEST_CASE("a formula as text evaluates to the same values as the ops it names") {
  Tape tape;
  Var x = tape.leaf(random_tensor({3, 5}, 31));
  Var g = tape.leaf(random_tensor({3, 5}, 32));
  Var y = softmax(x);
  const Tensor by_text = formula("y * (g - sum(y * g, -1))", {{"y", y}, {"g", g}}).value();
  const Tensor by_ops = mul(y, sub(g, sum(mul(y, g), -1, true))).value();
  CHECK(max_abs_diff(by_text, by_ops) == 0);
  // Numbers: scale, constants on either side, folding, unary minus, where and tril.
  const Tensor mixed = formula("2 * x - 1 / (1 + exp(-x)) + -(3 - 1) * x / 4", {{"x", x}}).value();
  for (int64_t e = 0; e < 15; ++e) {
    const double v = x.value().item(e);
    CHECK(mixed.item(e) == doctest::Approx(2 * v - 1 / (1 + std::exp(-v)) - 0.5 * v).epsilon(1e-14));
  }
  // sigmoid, on a tensor and folded on a number: the engine's op, and 1/(1 + e⁻ˣ).
  const Tensor logistic = formula("sigmoid(x) - sigmoid(0)", {{"x", x}}).value();
  for (int64_t e = 0; e < 15; ++e)
    CHECK(logistic.item(e) == doctest::Approx(1 / (1 + std::exp(-x.value().item(e))) - 0.5).epsilon(1e-14));
  const Tensor masked = formula("where(relu(x), x, 0) + tril(x * 0 + 1, -1)", {{"x", x}}).value();
  for (int64_t e = 0; e < 15; ++e) {
    const double v = x.value().item(e);
    CHECK(masked.item(e) == (v > 0 ? v : 0.0) + (e % 5 < e / 5 ? 1.0 : 0.0));
  }
  // −inf as attention masks with it: where keeps it to the masked positions (no −inf·0), and softmax gives them 0.
  const Tensor causal = formula("softmax(where(tril(x * 0 + 1, 0), x, -inf))", {{"x", x}}).value();
  for (int64_t e = 0; e < 15; ++e) {
    if (e % 5 > e / 5) CHECK(causal.item(e) == 0);
    else CHECK(std::isfinite(causal.item(e)));
  }
  CHECK(causal.item(0) == 1);
  // squeeze and unsqueeze: a sum that drops its axis, an axis put back.
  CHECK(formula("squeeze(sum(x, 0), 0)", {{"x", x}}).shape() == Shape{5});
  CHECK(formula("unsqueeze(squeeze(sum(x, -1), -1), -1)", {{"x", x}}).shape() == Shape{3, 1});
  CHECK(formula("unsqueeze(x, 1)", {{"x", x}}).shape() == Shape{3, 1, 5});
  CHECK_THROWS_WITH_AS(formula("squeeze(x, 0)", {{"x", x}}), doctest::Contains("axis 0 of (3, 5) has size 3, not 1"),
                       ExpressionError);
  // The gradient flows through a formula's ops like through the ops themselves.
  Var loss = sum(formula("norm(x, -1) * mean(x, -1)", {{"x", x}}));
  tape.backward(loss);
  CHECK(x.grad().defined());
}

// The two spellings of a sum over an axis, and NumPy's broadcasting in + - * /: the shapes a shared bias and a
// layer norm's weight have, written as they are.
TEST_CASE("sum(e, axis=a) and mean(e, axis=a) drop their axis; + - * / broadcast as NumPy's") {
  Tape tape;
  Var x = tape.leaf(random_tensor({3, 5}, 41));
  const Tensor dropped = formula("sum(x, axis=0)", {{"x", x}}).value();
  CHECK(dropped.shape() == Shape{5});
  CHECK(max_abs_diff(dropped, sum(x, 0, false).value()) == 0);
  // Each value copied before the next op grows the tape (a Var's value() refers into the tape's list of values).
  const Tensor summed = formula("sum(x, axis = -1)", {{"x", x}}).value();
  CHECK(max_abs_diff(summed, sum(x, -1, false).value()) == 0);
  CHECK(formula("mean(x, axis=1)", {{"x", x}}).shape() == Shape{3});
  const Tensor averaged = formula("mean(x, axis=1)", {{"x", x}}).value();
  CHECK(max_abs_diff(averaged, mean(x, 1, false).value()) == 0);
  CHECK(formula("sum(x, 0)", {{"x", x}}).shape() == Shape{1, 5});  // the positional axis is kept
  CHECK(max_abs_diff(formula("squeeze(sum(x, 0), 0)", {{"x", x}}).value(), dropped) == 0);

  // (T, Tk) + (B, T, Tk): the bias read once per batch element; (N, C) ⊙ (C): the weight read once per row.
  Var scores = tape.leaf(random_tensor({2, 3, 5}, 42));
  Var w = tape.leaf(random_tensor({5}, 43));
  const Tensor biased = formula("scores + x", {{"scores", scores}, {"x", x}}).value();
  REQUIRE(biased.shape() == Shape{2, 3, 5});
  const Tensor weighted = formula("x * w", {{"x", x}, {"w", w}}).value();
  REQUIRE(weighted.shape() == Shape{3, 5});
  for (int64_t e = 0; e < 30; ++e) CHECK(biased.item(e) == scores.value().item(e) + x.value().item(e % 15));
  for (int64_t e = 0; e < 15; ++e) CHECK(weighted.item(e) == x.value().item(e) * w.value().item(e % 5));

  // A bias shared by the batch, and a per-channel weight: their gradients sum the broadcast axes away.
  const auto holds = [](const char* text) {
    const auto claims = parse_claims(text, "f.txt");
    REQUIRE(claims.size() == 1);
    const GradcheckReport r = check_claim(claims[0]);
    CHECK_MESSAGE(r.passed(), r.str());
  };
  holds(
      "input s: 2, 3, 5\ninput bias: 3, 5\nforward softmax(s + bias)\n"
      "vjp bias = sum(y * (g - sum(y * g, -1)), axis=0)\n");
  holds(
      "input x: 4, 6\ninput w: 6\nforward tanh(x * w)\nvjp w = sum(g * (1 - y * y) * x, axis=0)\n"
      "vjp x = g * (1 - y * y) * w\n");
  // A mean where the sum belongs is off by one over the batch size: [scale].
  const auto mean_slip = parse_claims(
      "input s: 2, 3, 5\ninput bias: 3, 5\nforward s + bias\n"
      "vjp bias = mean(g, axis=0)\n",
      "f.txt");
  const GradcheckReport scaled = check_claim(mean_slip[0]);
  CHECK(scaled.has(Finding::scale, "bias"));

  // The kept spelling where the dropped one belongs is refused with a pointer to axis=.
  ClaimText kept;
  kept.inputs = {parse_claim_input("--input", "s: 2, 3, 5"), parse_claim_input("--input", "bias: 3, 5")};
  kept.forward = {"", "s + bias", "--forward"};
  kept.vjp = {{"bias", "sum(g, 0)", "--vjp bias"}};
  CHECK_THROWS_WITH_AS(validate_claim(kept),
                       doctest::Contains("x̄ of bias must have the shape (3, 5); this formula gives (1, 3, 5) (sum(e, "
                                         "a) and mean(e, a) keep axis a with size 1; sum(e, axis=a) and mean(e, "
                                         "axis=a) drop it)"),
                       ExpressionError);

  // The wrong-axis edit moves the axis of the dropping spelling too.
  const auto wrong_axis =
      parse_claims("input x: 4, 4\ninput b: 4\nforward x * b\nvjp b = sum(g * x, axis=1)\n", "f.txt");
  const GradcheckReport moved = check_claim(wrong_axis[0]);
  CHECK(moved.has(Finding::wrong_axis, "b"));
  CHECK(moved.str().find("sum(g * x, axis=1) → sum(g * x, axis=-2)") != std::string::npos);
}

TEST_CASE("shapes that do not broadcast, and keywords other than axis=, are errors naming what was written") {
  const std::map<std::string, Shape> shapes = {{"s", Shape{2, 4, 5}}, {"bias", Shape{4, 6}}, {"x", Shape{4, 6}}};
  const ExpressionError add = error_of("exp(s) + bias", shapes);
  CHECK(add.offset == 7);
  CHECK(add.message ==
        "`exp(s)` (2, 4, 5) + `bias` (4, 6): the shapes do not broadcast; aligned from the right, axis -1 has 5 "
        "against 6, and NumPy's rule wants the two equal or one of them 1 (a (T, Tk) bias adds to (B, T, Tk) scores, "
        "a (C) weight multiplies (N, C) rows)");
  const ExpressionError mul = error_of("mul(x, sum(s, axis=0))", shapes);
  CHECK(mul.offset == 0);
  CHECK(mul.message.find("`x` (4, 6) * `sum(s, axis=0)` (4, 5): the shapes do not broadcast; aligned from the right, "
                         "axis -1 has 6 against 5") == 0);
  CHECK(error_of("s - sum(s, axis=1)", shapes).message.find("axis -2 has 4 against 2") != std::string::npos);
  // The rank differs where a leading axis is missing: it counts as 1, and what does not fit is named.
  CHECK(error_of("s / x", shapes).message.find("`s` (2, 4, 5) / `x` (4, 6)") == 0);
  check_errors(
      {
          {"sum(x, keepdim=0)", 7, "'keepdim=' is not an argument of sum here"},
          {"norm(x, axis=1)", 8, "'axis=' is not an argument of norm here"},
          {"sum(axis=0)", 4, "axis= is the second argument of sum: sum(e, axis=a)"},
          {"mean(x, axis=y)", 13, "argument 2 of mean is an axis"},
      },
      shapes);
}

TEST_CASE("errors in a formula point at their column with a caret, before anything is evaluated") {
  const std::map<std::string, Shape> shapes = {{"x", Shape{4, 6}}, {"w", Shape{5, 6}}};
  const std::vector<ErrorCase> cases = {
      {"y * (x - sum(x * z, -1))", 0, "unknown name 'y'"},
      {"x * (x - sum(x * z, -1))", 17, "unknown name 'z'"},
      {"softmax(x, 1)", 0, "softmax takes 1 argument, got 2"},
      {"softmax(x", 9, "expected ',' or ')'"},
      {"sum(x, k)", 7, "is an axis"},
      {"x + ones(x)", 4, "unknown function 'ones'"},
      {"x + w", 2, "do not broadcast"},
      {"exp(x) + matmul(x, x)", 9, "matmul: inner dimensions differ"},
      {"transpose(x, 0)", 0, "transpose takes 1 or 3 arguments"},
      {"(x + 1", 6, "expected ')' to close the '(' at column 1"},
      {"x +", 3, "expected an expression"},
      {"x $ 2", 2, "unexpected '$'"},
  };
  // Nesting is bounded: an error, not a stack overflow.
  const std::string deep = std::string(100000, '(') + "x" + std::string(100000, ')');
  CHECK(error_of(deep, shapes).message.find("nests deeper than 200 levels") != std::string::npos);
  CHECK(error_of(std::string(100000, '-') + "x", shapes).message.find("nests deeper") != std::string::npos);
  check_errors(cases, shapes);
}

TEST_CASE("claims check their shapes and names before anything runs") {
  ClaimText c;
  c.inputs = {parse_claim_input("--input", "x: 4, 6")};
  c.forward = {"", "softmax(x)", "--forward"};
  c.vjp = {{"x", "sum(g, -1)", "--vjp x"}};
  try {
    validate_claim(c);
    FAIL("a VJP of the wrong shape was accepted");
  } catch (const ExpressionError& e) {
    CHECK(e.message.find("x̄ of x must have the shape (4, 6); this formula gives (4, 1)") != std::string::npos);
  }
  c.vjp = {{"w", "g", "--vjp w"}};
  CHECK_THROWS_WITH_AS(validate_claim(c), doctest::Contains("vjp names 'w', which is not an input"), Error);
  c.vjp.clear();
  c.jvp = ClaimText::Line{"", "y * (t_x - sum(y * g, -1))", "--jvp"};
  CHECK_THROWS_WITH_AS(validate_claim(c), doctest::Contains("unknown name 'g'"), ExpressionError);
  CHECK(parse_claim_input("--input", "x:2,3:positive").fill == Fill::positive);
  CHECK_THROWS_WITH_AS(parse_claim_input("--input", "x:2,3:big"), doctest::Contains("not a fill"), Error);
  CHECK_THROWS_WITH_AS(parse_claims("claim a\nimput x: 2\n", "f.txt"), doctest::Contains("f.txt:2: 'imput'"), Error);
  // A formula over several lines: indented lines continue the one above.
  const auto joined = parse_claims("claim a\ninput x: 3\nforward exp(x)\njvp y *\n    t_x\n", "f.txt");
  REQUIRE(joined.size() == 1);
  CHECK(joined[0].jvp->formula == "y * t_x");
  CHECK(check_claim(joined[0]).passed());
}

TEST_CASE("docs/gradchecking.md quotes the diagnoses of tests/claims/*.txt word for word") {
  std::ifstream in(std::string(TAPEGRAD_SOURCE_DIR) + "/docs/gradchecking.md");
  REQUIRE(in);
  std::map<std::string, std::vector<std::string>> quoted;  // the claims file a line names -> the lines
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("tests/claims/");
    if (line.starts_with("    [") && at != std::string::npos)
      quoted[line.substr(at, line.find(".txt:", at) + 4 - at)].push_back(line);
  }
  REQUIRE(quoted.count("tests/claims/slips.txt") == 1);
  REQUIRE(quoted.count("tests/claims/derivative_build.txt") == 1);
  for (const auto& [file, lines] : quoted) {
    std::set<std::string> printed;
    for (const ClaimText& c : claims_in(file))
      for (const Diagnosis& d : check_claim(c).diagnoses) printed.insert("    " + d.str());
    for (const std::string& line : lines)
      CHECK_MESSAGE(printed.count(line) == 1, "docs/gradchecking.md quotes " << line);
  }
}
