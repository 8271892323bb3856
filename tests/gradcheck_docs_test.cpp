// Docs that cannot drift: every path the docs give in backquotes exists, every link to a file of the repository
// resolves and every #anchor names a heading, every code fragment a table quotes from a file and every fragment of
// code running text quotes beside a source file occurs in that file (a "…" in a fragment stands for any text; spaces
// are not compared), every function or type a backquoted span of running text names is a word of the code, and no
// doc gives a line number. The docs are docs/*.md and README.md.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "checker/finding_sheet.hpp"
#include "test_paths.hpp"

namespace fs = std::filesystem;

namespace {

const fs::path kRoot(TAPEGRAD_SOURCE_DIR);

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<fs::path> docs() {
  std::vector<fs::path> files{kRoot / "README.md"};
  for (const auto& e : fs::directory_iterator(kRoot / "docs"))
    if (e.path().extension() == ".md") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// The backquoted spans of a line, outside ``` blocks.
std::vector<std::string> code_spans(const std::string& line) {
  std::vector<std::string> spans;
  for (size_t a = line.find('`'); a != std::string::npos;) {
    const size_t b = line.find('`', a + 1);
    if (b == std::string::npos) break;
    spans.push_back(line.substr(a + 1, b - a - 1));
    a = line.find('`', b + 1);
  }
  return spans;
}

bool is_repo_path(const std::string& s) {
  static const std::regex path(R"((ops|engine|models|tools|examples|tests|cmake|fuzz|docs|python)/[A-Za-z0-9_./+-]*)");
  return std::regex_match(s, path);
}

std::string without_spaces(const std::string& s) {
  std::string t;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c))) t += c;
  return t;
}

// Whether the fragment occurs in the text: its pieces between "…" in order, spaces ignored.
bool occurs(const std::string& fragment, const std::string& text_without_spaces) {
  const std::string ellipsis = "…";
  size_t at = 0, start = 0;
  for (;;) {
    const size_t end = fragment.find(ellipsis, start);
    const std::string piece = without_spaces(fragment.substr(start, end == std::string::npos ? end : end - start));
    if (!piece.empty()) {
      const size_t found = text_without_spaces.find(piece, at);
      if (found == std::string::npos) return false;
      at = found + piece.size();
    }
    if (end == std::string::npos) return true;
    start = end + ellipsis.size();
  }
}

// GitHub's anchor of a heading: lower case, spaces to '-', punctuation dropped (letters of any script kept).
std::string anchor_of(const std::string& heading) {
  std::string a;
  for (unsigned char c : heading) {
    if (c >= 0x80 || std::isalnum(c) || c == '-' || c == '_') a += static_cast<char>(std::tolower(c));
    else if (c == ' ') a += '-';
  }
  return a;
}

// The lines of a Markdown file outside its ``` fences, each with its number (from 1).
struct ProseLine {
  int n;
  std::string text;
};
std::vector<ProseLine> prose_lines(const fs::path& md) {
  std::vector<ProseLine> prose;
  bool fenced = false;
  int n = 0;
  for (std::string& line : lines_of(read(md))) {
    ++n;
    if (line.starts_with("```")) fenced = !fenced;
    if (!fenced) prose.push_back({n, std::move(line)});
  }
  return prose;
}

std::set<std::string> anchors(const fs::path& md) {
  std::set<std::string> found;
  for (const ProseLine& prose : prose_lines(md)) {
    const std::string& line = prose.text;
    if (!line.starts_with("#")) continue;
    const size_t text = line.find_first_not_of('#');
    if (text == std::string::npos || line[text] != ' ') continue;
    found.insert(anchor_of(line.substr(text + 1)));
  }
  return found;
}

}  // namespace

TEST_CASE("docs: every backquoted path to a file of the repository exists, with no line number") {
  int paths = 0;
  for (const fs::path& md : docs()) {
    for (const ProseLine& prose : prose_lines(md)) {
      const int n = prose.n;
      const std::string& line = prose.text;
      for (std::string span : code_spans(line)) {
        if (!is_repo_path(span) || span.find('*') != std::string::npos) continue;
        INFO(fs::relative(md, kRoot).string() << ":" << n << ": `" << span << "`");
        // A line number goes stale with the next edit above it: the docs name files, functions and quoted code.
        const size_t colon = span.find(':');
        CHECK_MESSAGE((colon == std::string::npos || span.find_first_not_of("0123456789-", colon + 1) == colon + 1),
                      "a line number: name the function or quote the code instead");
        if (colon != std::string::npos) span.erase(colon);
        CHECK(fs::exists(kRoot / span));
        ++paths;
      }
    }
  }
  CHECK(paths > 50);
}

namespace {

// Every identifier in the project's code and build files (engine, ops, models, tools, tests, examples, fuzz, cmake,
// python, CMakeLists.txt): the words a doc may name.
std::set<std::string> code_words() {
  std::set<std::string> words;
  const std::regex word(R"([A-Za-z_][A-Za-z0-9_]*)");
  auto add = [&](const fs::path& file) {
    const std::string text = read(file);
    for (auto m = std::sregex_iterator(text.begin(), text.end(), word); m != std::sregex_iterator(); ++m)
      words.insert(m->str());
  };
  add(kRoot / "CMakeLists.txt");
  for (const char* dir :
       {"engine", "ops", "inspect", "checker", "models", "tools", "tests", "examples", "fuzz", "cmake", "python"}) {
    if (!fs::exists(kRoot / dir)) continue;
    for (const auto& e : fs::recursive_directory_iterator(kRoot / dir)) {
      const std::string ext = e.path().extension().string();
      if (e.is_regular_file() && (ext == ".cpp" || ext == ".hpp" || ext == ".py" || ext == ".sh" || ext == ".cmake" ||
                                  e.path().filename() == "CMakeLists.txt"))
        add(e.path());
    }
  }
  return words;
}

}  // namespace

TEST_CASE("docs: every function or type that running text names in backquotes exists in the code") {
  // A name called or qualified in a span (`pointwise(name, x, f, df)`, `Tape::hvp`, `std::vector<OpSheet>`): its last
  // part must be a word of the code, so that renaming a function fails here instead of leaving the docs behind.
  // The standard library's names (std::…) are not the project's.
  const std::set<std::string> words = code_words();
  const std::regex named(
      R"(([A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)\s*[(<{]|\b([A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*))");
  int names = 0;
  for (const fs::path& md : docs()) {
    for (const ProseLine& prose : prose_lines(md)) {
      for (const std::string& span : code_spans(prose.text)) {
        for (auto m = std::sregex_iterator(span.begin(), span.end(), named); m != std::sregex_iterator(); ++m) {
          const std::string name = (*m)[1].matched ? (*m)[1].str() : (*m)[2].str();
          if (name.starts_with("std::")) continue;
          const size_t colons = name.rfind("::");
          const std::string last = colons == std::string::npos ? name : name.substr(colons + 2);
          INFO(fs::relative(md, kRoot).string() << ":" << prose.n << ": `" << span << "` names " << name);
          CHECK(words.count(last) == 1);
          ++names;
        }
      }
    }
  }
  CHECK(names > 100);
}

TEST_CASE("docs: the table of kinds in docs/gradchecking.md is the one the sheets make (gradcheck --kinds)") {
  const std::string text = read(kRoot / "docs" / "gradchecking.md");
  const std::string mark = "<!-- the table `tapegrad gradcheck --kinds` prints -->\n";
  const size_t at = text.find(mark);
  REQUIRE_MESSAGE(at != std::string::npos, "docs/gradchecking.md has no line " << mark);
  const size_t start = at + mark.size();
  const size_t end = text.find("\n\n", start);
  REQUIRE(end != std::string::npos);
  CHECK(text.substr(start, end + 1 - start) == tapegrad::finding_kinds_table());
}

TEST_CASE("docs: every kind of finding's sheet names a section of the docs that exists") {
  for (const tapegrad::FindingSheet& sheet : tapegrad::builtin_findings()) {
    const std::string section(sheet.section);
    CAPTURE(section);
    const size_t hash = section.find('#');
    REQUIRE(hash != std::string::npos);
    const fs::path file = kRoot / section.substr(0, hash);
    REQUIRE(fs::exists(file));
    CHECK(anchors(file).count(section.substr(hash + 1)) == 1);
  }
}

TEST_CASE("docs: every link to a file of the repository resolves, and every #anchor names a heading") {
  const std::regex link(R"(\]\(([^)\s]+)\))");
  int links = 0;
  for (const fs::path& md : docs()) {
    for (const ProseLine& prose : prose_lines(md)) {
      const int n = prose.n;
      const std::string& line = prose.text;
      for (auto m = std::sregex_iterator(line.begin(), line.end(), link); m != std::sregex_iterator(); ++m) {
        const std::string target = (*m)[1];
        if (target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:")) continue;
        const size_t hash = target.find('#');
        const std::string file = target.substr(0, hash);
        const fs::path resolved = file.empty() ? md : md.parent_path() / file;
        INFO(fs::relative(md, kRoot).string() << ":" << n << ": (" << target << ")");
        CHECK(fs::exists(resolved));
        if (hash != std::string::npos && fs::exists(resolved) && resolved.extension() == ".md")
          CHECK(anchors(resolved).count(target.substr(hash + 1)) == 1);
        ++links;
      }
    }
  }
  CHECK(links > 20);
}

TEST_CASE("docs: every code fragment a table quotes from a file occurs in that file") {
  // In a table whose header names a code column ("code", "code, `ops/attention/beta.cpp`"), each row's code cell
  // quotes the files it names and the file its header names: every other fragment of the cell must occur in one of
  // those files.
  int fragments = 0;
  for (const fs::path& md : docs()) {
    std::vector<std::string> header_files;
    int code_column = -1;
    for (const ProseLine& prose : prose_lines(md)) {
      const int n = prose.n;
      const std::string& line = prose.text;
      if (!line.starts_with("|")) {
        code_column = -1;
        continue;
      }
      std::vector<std::string> cells;
      for (size_t a = 1, b; (b = line.find('|', a)) != std::string::npos; a = b + 1)
        cells.push_back(line.substr(a, b - a));
      if (code_column < 0) {  // the header row
        header_files.clear();
        for (size_t c = 0; c < cells.size(); ++c)
          if (cells[c].find("code") != std::string::npos) {
            code_column = static_cast<int>(c);
            for (const std::string& span : code_spans(cells[c]))
              if (is_repo_path(span)) header_files.push_back(span);
          }
        if (code_column < 0) code_column = 1000;  // a table without a code column: nothing to check
        continue;
      }
      if (code_column >= static_cast<int>(cells.size()) || cells[code_column].starts_with("---")) continue;
      const std::vector<std::string> spans = code_spans(cells[code_column]);
      std::vector<std::string> files;
      for (const std::string& span : spans)
        if (is_repo_path(span) && fs::is_regular_file(kRoot / span)) files.push_back(span);
      files.insert(files.end(), header_files.begin(), header_files.end());
      if (files.empty()) continue;
      std::string text;
      for (const std::string& f : files) text += without_spaces(read(kRoot / f));
      for (const std::string& span : spans) {
        if (is_repo_path(span)) continue;
        INFO(fs::relative(md, kRoot).string() << ":" << n << ": `" << span << "` in " << files.front());
        CHECK(occurs(span, text));
        ++fragments;
      }
    }
  }
  CHECK(fragments > 30);
}

namespace {

bool is_source_file(const std::string& span) {
  if (!is_repo_path(span) || !fs::is_regular_file(kRoot / span)) return false;
  const std::string ext = fs::path(span).extension().string();
  return ext == ".cpp" || ext == ".hpp" || ext == ".py" || ext == ".cmake" || ext == ".sh" ||
         fs::path(span).filename() == "CMakeLists.txt";
}

// A span that reads as a piece of a statement rather than a name or a call: an assignment (`x = …`, `+=`, `-=`,
// `*=`, `/=`, not `==`, `<=`, `>=`, `!=`, nor a lambda's `[=]`), an index (`name[…]`) or an elided part (`…`).
// A command line is not code quoted from a file: one that starts with ./, an option or an environment variable.
bool quotes_code(const std::string& span) {
  static const std::regex statement(R"([A-Za-z0-9_)\]]\s*[-+*/]?=(?!=)|[A-Za-z0-9_]\[)");
  static const std::regex command(R"((\./|--|[A-Z_][A-Z0-9_]*=).*)");
  if (std::regex_match(span, command)) return false;
  return std::regex_search(span, statement) || span.find("…") != std::string::npos;
}

// The units of a doc's running text: a paragraph, a list item, a heading or a table row, each with its lines (their
// numbers from 1) and, for a table row, the source files its header names (a code column's "code, `file`").
struct Unit {
  std::vector<ProseLine> lines;
  std::vector<std::string> header_files;
};
std::vector<Unit> units_of(const fs::path& md) {
  static const std::regex item(R"(\s*([-*]|[0-9]+\.) .*)");
  std::vector<Unit> units;
  Unit paragraph;
  std::vector<std::string> header_files;
  bool in_table = false;
  int last = 0;
  auto close = [&] {
    if (!paragraph.lines.empty()) units.push_back(std::move(paragraph));
    paragraph = {};
  };
  for (const ProseLine& prose : prose_lines(md)) {
    const std::string& line = prose.text;
    if (prose.n != last + 1 || line.starts_with("```")) close();  // a fence between two prose lines
    last = prose.n;
    if (line.starts_with("```")) continue;
    if (line.starts_with("|")) {
      close();
      if (!in_table) {
        header_files.clear();
        for (const std::string& span : code_spans(line))
          if (is_source_file(span)) header_files.push_back(span);
      }
      in_table = true;
      units.push_back({{prose}, header_files});
      continue;
    }
    in_table = false;
    const bool blank = line.find_first_not_of(" \t") == std::string::npos;
    if (blank || line.starts_with("#") || std::regex_match(line, item)) close();
    if (!blank) paragraph.lines.push_back(prose);
    if (line.starts_with("#")) close();
  }
  close();
  return units;
}

}  // namespace

TEST_CASE("docs: every fragment of code that running text quotes beside a source file occurs in that file") {
  // A unit of text (paragraph, list item, table row) that names a source file in backquotes quotes it: each of its
  // spans that reads as a statement (quotes_code) must occur in one of the files the unit names (a table's header
  // counts for its rows), or, for a line quoted from a file the unit does not name, somewhere in the code.
  std::string all_code;
  for (const char* dir :
       {"engine", "ops", "checker", "inspect", "models", "tools", "tests", "examples", "fuzz", "cmake", "python"}) {
    if (!fs::exists(kRoot / dir)) continue;
    for (const auto& e : fs::recursive_directory_iterator(kRoot / dir))
      if (e.is_regular_file() && is_source_file(fs::relative(e.path(), kRoot).string()))
        all_code += without_spaces(read(e.path()));
  }
  int fragments = 0, in_named_file = 0;
  for (const fs::path& md : docs()) {
    for (const Unit& unit : units_of(md)) {
      std::vector<std::string> files = unit.header_files;
      for (const ProseLine& line : unit.lines)
        for (const std::string& span : code_spans(line.text))
          if (is_source_file(span)) files.push_back(span);
      if (files.empty()) continue;
      std::string text;
      for (const std::string& f : files) text += without_spaces(read(kRoot / f));
      for (const ProseLine& line : unit.lines)
        for (const std::string& span : code_spans(line.text)) {
          if (is_repo_path(span) || !quotes_code(span)) continue;
          INFO(fs::relative(md, kRoot).string()
               << ":" << line.n << ": `" << span << "`, quoted beside " << files.front());
          const bool here = occurs(span, text);
          CHECK_MESSAGE((here || occurs(span, all_code)), "a stale fragment: quote what the code now says");
          ++fragments;
          in_named_file += here;
        }
    }
  }
  CHECK(fragments > 25);
  CHECK(in_named_file > fragments / 2);  // most fragments are found in the file their text names
}
