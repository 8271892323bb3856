// Running Graphviz's `dot` program on DOT text (inspect/tape_dot.hpp writes it), and finding programs on PATH.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tapegrad {

// An executable's path: `name` itself if it holds a '/', else the first `name` on PATH that can be run.
std::optional<std::string> find_program(std::string_view name);
// The path of Graphviz's `dot` program, found on PATH.
std::optional<std::string> find_dot_program();
// What `dot -T<format>` prints for `dot_text` (svg, png, json, plain...). Throws an Error when dot is not on PATH
// or fails, with the first line of its message.
std::string render_dot(std::string_view dot_text, std::string_view format);

}  // namespace tapegrad
