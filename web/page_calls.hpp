// What the module's calls from the pages share (web/bindings.cpp, web/op_graph.cpp): an answer as JSON text, with
// {error} for what was thrown, and the --seed and --shape arguments as a page's forms pass them.
#pragma once

#include <cstdint>
#include <exception>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/tensor.hpp"

namespace tapegrad::web {

// f()'s JSON as text, or {"error": what} for anything it throws (an Error, an ExpressionError with its caret lines,
// a JSON error, a bad_alloc).
template <class F>
std::string answer(F&& f) {
  try {
    return f().dump();
  } catch (const std::exception& e) {
    return nlohmann::json{{"error", e.what()}}.dump();
  }
}

// A seed from a page (a JavaScript number): a whole number from 0 to 2^53 - 1, the integers a double holds exactly.
inline uint64_t seed_from_page(double seed) {
  if (!(seed >= 0) || seed > 9007199254740991.0 || seed != static_cast<double>(static_cast<uint64_t>(seed)))
    throw Error(fmt::format("--seed: '{}' is not a whole number from 0 to 2^53 - 1", seed));
  return static_cast<uint64_t>(seed);
}

// --shape arguments from a page: [["x", [2, 4]], ...] as (name, shape) pairs, each size at most `largest`.
inline std::vector<std::pair<std::string, Shape>> shapes_from_page(
    const std::string& shapes_json, int64_t largest = std::numeric_limits<int64_t>::max()) {
  std::vector<std::pair<std::string, Shape>> shapes;
  for (const nlohmann::json& s : nlohmann::json::parse(shapes_json)) {
    const std::vector<int64_t> dims = s.at(1).get<std::vector<int64_t>>();
    for (int64_t d : dims)
      if (d < 1 || d > largest)
        throw Error(fmt::format("--shape {}: each size must be from 1 to {}", s.at(0).get<std::string>(), largest));
    shapes.emplace_back(s.at(0).get<std::string>(), Shape(dims));
  }
  return shapes;
}

}  // namespace tapegrad::web
