// `--config FILE` for any subcommand: the file's `key = value` lines (CLI11's INI reader; keys are the long option
// names without dashes, `#` starts a comment) become `--key=value` arguments placed before the command line's
// own, so that a flag given on the command line overrides the file. Several --config files merge in the order
// given (a later file's key overrides an earlier one's); a key with an empty value, a line with no key ("= 5") and a
// line too short to be key = value ("q") are errors naming the line, and so is a key given twice in one file (as an
// option that takes one value given twice on the command line is: refuse_repeated_options).
#include <algorithm>
#include <map>
#include <sstream>

#include <utf8cpp/utf8.h>

#include "engine/tensor.hpp"
#include "models/files.hpp"
#include "tools/commands.hpp"

namespace tapegrad::cli {

namespace {
constexpr size_t kMaxConfigBytes = size_t{1} << 20;  // a file of options, not a data set

std::vector<std::string> g_config_files;
std::vector<std::vector<std::string>> g_config_arguments;  // each file's `--key=value` arguments, in its order

std::string_view trimmed(std::string_view s) {
  const size_t begin = s.find_first_not_of(" \t\r\f\v");
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(" \t\r\f\v") - begin + 1);
}

// CLI11's reader skips, without a word, a line shorter than 3 characters ("q", "=5") and a line whose key is empty
// ("= 5"): each would be an option the user wrote and the program ignored. Refused here, by line number, as is a key
// given twice. Lines that continue a multi-line array ("key = [1," then "2]") are the array's, not lines of their own;
// an array never closed (the file ends, or a key = value line comes, before its ']') is refused by its first line,
// where CLI11's reader would take its first value alone ("n-layer = [1," then "2" gave one layer).
void refuse_lines_without_key(const std::string& path, std::string_view text) {
  size_t number = 0, array_line = 0;
  std::string array_key;
  bool in_array = false;
  auto unclosed = [&](const std::string& before) {
    fail("config file {}: line {}: the list of '{}' opened with '[' is not closed with ']' before {}", path, array_line,
         array_key, before);
  };
  std::string section;                 // "[train]" → "train.": a key is one key within its section
  std::map<std::string, size_t> keys;  // each key and its line
  for (size_t begin = 0; begin <= text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = trimmed(text.substr(begin, end - begin));
    begin = end + 1;
    ++number;
    if (in_array) {
      if (line.find('=') != std::string_view::npos) unclosed(fmt::format("the key on line {}", number));
      in_array = line.empty() || line.back() != ']';
      continue;
    }
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = std::string(line.substr(1, line.size() - 2)) + ".";
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == 0 || (eq != std::string_view::npos && trimmed(line.substr(0, eq)).empty()))
      fail("config file {}: line {}: '{}' has no key before '='; write key = value", path, number, line.substr(0, 80));
    if (line.size() < 3)
      fail("config file {}: line {}: '{}' is not a key = value line (a key is a long option's name)", path, number,
           line);
    if (eq != std::string_view::npos) {
      const std::string_view value = trimmed(line.substr(eq + 1));
      in_array = value.size() > 1 && value.front() == '[' && value.back() != ']';
      // CLI11's reader joins a key given twice into one list ("0.1,0.2"): refused here, by its two lines.
      const std::string key = section + std::string(trimmed(line.substr(0, eq)));
      if (in_array) array_line = number, array_key = key;
      if (const auto [at, fresh] = keys.emplace(key, number); !fresh)
        fail(
            "config file {}: line {}: key '{}' is given again (first on line {}); give a key once, and several "
            "values of a list as key = [a, b]",
            path, number, key, at->second);
    }
  }
  if (in_array) unclosed("the file ends");
}
}  // namespace

const std::vector<std::string>& config_files_read() { return g_config_files; }

std::vector<std::string> config_file_arguments(const std::string& path, std::string_view text) {
  if (size_t nul = text.find('\0'); nul != std::string_view::npos)
    fail("config file {}: a NUL byte at byte offset {}: not a text file", path, nul);
  if (auto bad = utf8::find_invalid(text.begin(), text.end()); bad != text.end())
    fail("config file {}: invalid UTF-8 at byte offset {}", path, bad - text.begin());
  refuse_lines_without_key(path, text);
  std::vector<std::string> out;
  std::vector<CLI::ConfigItem> items;
  try {
    std::istringstream in{std::string(text)};
    items = CLI::ConfigINI().from_config(in);
  } catch (const CLI::Error& e) {
    fail("config file {}: {}", path, e.what());
  }
  for (const auto& item : items) {
    if (item.name.empty() || item.name == "++" || item.name == "--") continue;  // section markers
    if (item.name == "config") fail("config file {}: a config file cannot name another config file", path);
    std::string value;
    for (size_t i = 0; i < item.inputs.size(); ++i) value += (i ? "," : "") + item.inputs[i];
    // `name =` would become "--name=", which the parser reads as "--name" followed by the next argument.
    if (value.empty())
      fail("config file {}: key '{}' has an empty value; give it a value or remove the line", path, item.name);
    out.push_back("--" + item.name + "=" + value);
  }
  return out;
}

std::vector<std::string> arguments_with_config_file(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  // Every --config in order: a later file's keys override an earlier one's, the command line overrides them all.
  std::vector<std::string> from_files;
  for (size_t i = 0; i < args.size();) {
    std::string path;
    size_t used = 0;
    if (args[i] == "--config") {
      if (i + 1 == args.size()) fail("--config: expected a file name after it");
      path = args[i + 1];
      used = 2;
    } else if (args[i].rfind("--config=", 0) == 0) {
      path = args[i].substr(9);
      used = 1;
    } else {
      ++i;
      continue;
    }
    if (path.empty()) fail("--config: the file name is empty");
    std::string text;
    try {
      text = read_file(path, kMaxConfigBytes);
    } catch (const Error& e) {
      fail("config file: {}", e.what());
    }
    std::vector<std::string> one = config_file_arguments(path, text);
    g_config_files.push_back(path);
    g_config_arguments.push_back(one);
    from_files.insert(from_files.end(), one.begin(), one.end());
    args.erase(args.begin() + static_cast<std::ptrdiff_t>(i), args.begin() + static_cast<std::ptrdiff_t>(i + used));
  }
  if (from_files.empty()) return args;
  // After the subcommand's name (the first argument that is not an option), before everything else.
  size_t at = 0;
  while (at < args.size() && args[at].rfind("-", 0) == 0) ++at;
  at = std::min(at + 1, args.size());
  args.insert(args.begin() + static_cast<std::ptrdiff_t>(at), from_files.begin(), from_files.end());
  return args;
}

namespace {

// Whether `argument`, one a config file gave ("--key=value"), sets `option`.
bool sets(const CLI::Option& option, std::string_view argument) {
  const std::string_view key = argument.substr(2, argument.find('=') - 2);
  return option.check_lname(std::string(key));
}

// "--seed", or "-o" for an option with a short name only.
std::string option_name(const CLI::Option& option) {
  return option.get_lnames().empty() ? "-" + option.get_snames().front() : "--" + option.get_lnames().front();
}

void refuse_repeated_options_of(const CLI::App& cmd) {
  for (const CLI::Option* option : cmd.get_options()) {
    // A list (--input, --let, --vjp, --op, ...) is given once per item; positionals are refused as extras.
    if (!option->nonpositional() || option->get_expected_max() > 1) continue;
    // A key given twice in one file was refused as the file was read; several files may each give it.
    size_t from_files = 0;
    for (const auto& args : g_config_arguments)
      from_files += static_cast<size_t>(
          std::count_if(args.begin(), args.end(), [&](const std::string& a) { return sets(*option, a); }));
    // The files' values come first and the command line's override them: only the command line's are counted.
    const size_t given = option->count() - std::min(from_files, option->count());
    if (given > 1)
      fail(
          "{} is given {} times; it takes one value: give it once (the last one is not taken in place of the "
          "others)",
          option_name(*option), given);
  }
  for (const CLI::App* sub : cmd.get_subcommands()) refuse_repeated_options_of(*sub);
}

}  // namespace

void refuse_repeated_options(const CLI::App& app) { refuse_repeated_options_of(app); }

}  // namespace tapegrad::cli
