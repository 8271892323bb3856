// An op without a forward-mode rule: it passes no_jvp(name) as the jvp of Tape::record, and forward mode through
// its node then throws NoJvp, which the gradchecker reports as "no JVP" instead of failing the op's checks.
#pragma once

#include <string>
#include <utility>

#include "tensor.hpp"

namespace tapegrad {

// Thrown by forward mode on a node recorded with no_jvp(op).
struct NoJvp : Error {
  explicit NoJvp(std::string op_name)
      : Error(fmt::format("forward mode: op '{}' has no JVP (it was recorded with no_jvp)", op_name)),
        op(std::move(op_name)) {}
  std::string op;
};

// The jvp argument of Tape::record for an op that has no forward-mode rule (it takes the tangents and the output
// tangent, whatever their spans' constness).
inline auto no_jvp(const char* op) {
  return [op](auto&&, auto&&) { throw NoJvp(op); };
}

}  // namespace tapegrad
