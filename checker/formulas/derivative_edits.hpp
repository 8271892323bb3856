// The edit search's edits of an element-wise derivative (internal to checker/formulas/, used by edits.cpp). A rule
// that differentiates a composite through an element-wise call y = f(u) multiplies by f′(u) somewhere; the slips a
// person makes there are f′ written as f itself (σ′ as σ: the factor 1 − σ dropped) and f′ left out. For the calls
// whose derivative is a short formula of their value v and argument u
//
//   sigmoid   σ′ = v·(1 − v)        tanh   tanh′ = 1 − v·v        log   log′ = 1/u
//
// the search tries, in a line of the backward: a part that is the call's value (the let that names it, or the call
// written again) replaced by f′; and a part of the call's shape multiplied by f′. An edit after which the rule
// agrees with central differences is a Finding::term_factor.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "expression.hpp"

namespace tapegrad::edits_detail {

// One element-wise call the rule's formulas make: its value as the formulas read it (a let's name, or the call's
// own text), the call's text, its function and its argument's text.
struct ElementwiseCall {
  std::string value;     // "a" for let a = sigmoid(s); "sigmoid(s)" for a call written in a formula
  std::string call;      // "sigmoid(s)"
  std::string function;  // "sigmoid", "tanh" or "log"
  std::string argument;  // "s"
};

// The call that a part [begin, end) of `text` is, when it is one of the functions above with one argument.
std::optional<ElementwiseCall> elementwise_call(const std::string& text, const Formula::Part& part);

// The calls of a rule: each let whose whole formula is such a call (by its name), and each call written in any of
// `formulas` (the lets, the x̄ formulas and the forward), each once.
std::vector<ElementwiseCall> elementwise_calls(const std::vector<std::pair<std::string, Formula>>& lets,
                                               const std::vector<const Formula*>& formulas);

// f′ as a formula of the call's value and argument ("a * (1 - a)"), and in words ("sigmoid′ = a·(1 − a)").
std::string derivative_formula(const ElementwiseCall& c);
std::string derivative_words(const ElementwiseCall& c);

}  // namespace tapegrad::edits_detail
