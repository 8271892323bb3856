// The expression language's parsed form (internal to checker/): the tree the parser builds
// (expression_parse.cpp) and the evaluator walks (expression.cpp), and the table of calls.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "expression.hpp"

namespace tapegrad {

struct ExpressionNode {
  enum class Kind { number, name, call, binary, negate } kind = Kind::number;
  size_t offset = 0;          // where the node starts (a binary node: its operator)
  size_t begin = 0, end = 0;  // the subexpression's text, [begin, end) (inside any parentheses around it)
  double number = 0;          // number
  std::string name;           // name, call
  char op = 0;                // binary: + - * /
  std::vector<std::shared_ptr<const ExpressionNode>> args;  // call, binary (2), negate (1)
  bool axis_keyword = false;  // call: sum(e, axis=a) or mean(e, axis=a), whose axis is dropped, not kept
  int height = 1;             // levels from this node down to its deepest leaf (the evaluator recurses this deep)
};

namespace expression_detail {

using NodePtr = std::shared_ptr<const ExpressionNode>;
using Kind = ExpressionNode::Kind;

// A call's arity; the arguments at `axes` are whole numbers written in the call.
struct FunctionSpec {
  std::string_view name;
  size_t min_args, max_args;
  std::vector<size_t> axes;
};
const FunctionSpec* find_function(std::string_view name);

// A whole number written in the text: 2, -1.
std::optional<int> literal_int(const ExpressionNode& n);

// The tree of `text`; throws ExpressionError (labelled `label`) where it does not parse.
NodePtr parse_tree(std::string_view text, const std::string& label);

}  // namespace expression_detail
}  // namespace tapegrad
