// A small tensor expression language: a formula written as text, evaluated on a tape with the engine's own ops.
//
//   expression  sum of terms:      a + b, a - b
//   term        product of unary:  a * b, a / b          (NumPy broadcasting, as the arithmetic ops)
//   unary       -u, or a primary
//   primary     a number (2, 0.5, 1e-3), a name (a tensor given by the caller), a call f(e, ...), (e)
//
// The calls are the engine's ops by their registry names where they take tensors only, plus a few reductions:
//   exp log tanh sigmoid relu gelu gelu_erf elu neg softmax log_softmax row_normalize    f(e)
//   add sub mul div matmul                                              f(a, b)
//   linear(x, W[, b])  layer_norm(x, w, b)
//   sum(e[, axis])  mean(e[, axis])   over all elements, or over one axis keeping it (size 1)
//   sum(e, axis=a)  mean(e, axis=a)   over axis a, dropping it, as NumPy's (the gradient of a broadcast input)
//   norm(e, axis)                     ‖e‖₂ over one axis, keeping it: exp(½·log Σ e²)
//   transpose(e[, a, b])              axes a and b swapped (the last two by default)
//   where(cond, a, b)                 a where cond ≠ 0, else b (cond is read as a mask: no gradient through it)
//   tril(e[, k])                      e where j ≤ i + k over its last two axes (i, j), else 0 (a causal mask)
//   squeeze(e, axis)  unsqueeze(e, axis)   an axis of size 1 taken away (squeeze(sum(e, 1), 1) is
//                                     sum(e, axis=1)) or put in (negative: from the end of the result), as torch's
// `inf` is the number ∞ (where(mask, -inf, s): a mask as attention writes it); where writes a number only where its
// side holds, so −inf stays out of the other positions.
// Axes are whole numbers written in the call (negative from the end). A number with a tensor is a constant of that
// tensor's dtype: x * 2 records scale, 1 - x records a constant and sub.
//
// A formula is parsed and its shapes checked before anything is evaluated: an unknown name, a wrong number of
// arguments, shapes an op rejects, all throw ExpressionError, whose message shows the text with a caret under the
// column at fault; operands of + - * / whose shapes do not broadcast name both operands and their shapes. docs/claims/README.md has the grammar with examples; `tapegrad claim` checks derivatives
// written in it (checker/formulas/claim.hpp).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../engine/tape.hpp"

namespace tapegrad {

// `s` with its control bytes (below 0x20, and 0x7f) written \xNN, for messages that quote what the user wrote: a
// control byte would act on the terminal, and a NUL would end the message where it is read as a C string.
std::string escape_controls(std::string_view s);

// An error in a formula, at a column of its text. what() is three lines: "label: message", the text, a caret.
struct ExpressionError : Error {
  ExpressionError(std::string label, std::string text, size_t offset, std::string message);
  std::string label;    // what the formula is: "--forward", "vjp x", "claims.txt:12"
  std::string text;     // the formula
  size_t offset;        // byte offset of the fault in text
  std::string message;  // the fault alone, without the text and the caret
};

struct ExpressionNode;

// A parsed formula. Copies share the parsed tree.
class Formula {
 public:
  // Throws ExpressionError for text that does not parse (or calls an unknown function with the wrong arity).
  static Formula parse(std::string_view text, std::string label = "formula");

  // The names the formula reads, each once, in order of first use.
  std::vector<std::string> names() const;
  // Its subexpressions that hold a tensor (names, calls, operators; not numbers or axes), in reading order, as
  // spans [begin, end) of text(): where an edit may apply (checker/formulas/edits.hpp). For a part that is
  // transpose(e) of one argument, `argument` is e's span. For a sum a + b or a difference a − b, `sign` is the
  // operator's offset and `term` b's span; for a negation −u, `sign` is the minus's offset and `term` u's span. For
  // sum(e, a), mean(e, a) and unsqueeze(e, a), `axis` is the span of the axis a written in the call and `term` e's.
  struct Part {
    size_t begin = 0, end = 0;
    std::optional<std::pair<size_t, size_t>> argument;
    std::optional<size_t> sign;
    std::pair<size_t, size_t> term{0, 0};
    std::optional<std::pair<size_t, size_t>> axis;
    // softmax(e) or log_softmax(e) along axis `along` of e (-1; or another, which the trace writes
    // transpose(f(transpose(e, a, -1)), a, -1)): e's place in the text and whether it is log_softmax.
    struct Softmax {
      size_t begin = 0, end = 0;
      int along = -1;
      bool log = false;
    };
    std::optional<Softmax> softmax = std::nullopt;
  };
  std::vector<Part> parts() const;
  // The shape of the result for inputs of these shapes, from a trial on zeros: throws ExpressionError at the name
  // not given, or at the call or operator whose op rejects its operands' shapes.
  Shape check(const std::map<std::string, Shape>& shapes) const;
  // The result recorded on the tape of the given Vars (all on one tape). Throws ExpressionError as check().
  Var evaluate(const std::map<std::string, Var>& values) const;

  const std::string& text() const { return text_; }
  const std::string& label() const { return label_; }

 private:
  std::string text_, label_;
  std::shared_ptr<const ExpressionNode> root_;
};

// A formula as text, evaluated on the named Vars: formula("y * (g - sum(y * g, -1))", {{"y", y}, {"g", g}}).
Var formula(std::string_view text, const std::map<std::string, Var>& values);

}  // namespace tapegrad
