// Docs that cannot drift: every path the docs give in backquotes exists, every link to a file of the repository
// resolves and every #anchor names a heading, and every code fragment a table quotes from a file occurs in that
// file (a "…" in a fragment stands for any text; spaces are not compared). The docs are docs/*.md and README.md.
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
    if (c >= 0x80 || std::isalnum(c) || c == '-' || c == '_')
      a += static_cast<char>(std::tolower(c));
    else if (c == ' ')
      a += '-';
  }
  return a;
}

std::set<std::string> anchors(const fs::path& md) {
  std::set<std::string> found;
  bool fenced = false;
  for (const std::string& line : lines_of(read(md))) {
    if (line.starts_with("```")) fenced = !fenced;
    if (fenced || !line.starts_with("#")) continue;
    const size_t text = line.find_first_not_of('#');
    if (text == std::string::npos || line[text] != ' ') continue;
    found.insert(anchor_of(line.substr(text + 1)));
  }
  return found;
}

}  // namespace

TEST_CASE("docs: every backquoted path to a file of the repository exists") {
  int paths = 0;
  for (const fs::path& md : docs()) {
    bool fenced = false;
    int n = 0;
    for (const std::string& line : lines_of(read(md))) {
      ++n;
      if (line.starts_with("```")) fenced = !fenced;
      if (fenced) continue;
      for (std::string span : code_spans(line)) {
        if (!is_repo_path(span) || span.find('*') != std::string::npos) continue;
        if (const size_t colon = span.find(':'); colon != std::string::npos) span.erase(colon);
        INFO(fs::relative(md, kRoot).string() << ":" << n << ": `" << span << "`");
        CHECK(fs::exists(kRoot / span));
        ++paths;
      }
    }
  }
  CHECK(paths > 50);
}

TEST_CASE("docs: every link to a file of the repository resolves, and every #anchor names a heading") {
  const std::regex link(R"(\]\(([^)\s]+)\))");
  int links = 0;
  for (const fs::path& md : docs()) {
    bool fenced = false;
    int n = 0;
    for (const std::string& line : lines_of(read(md))) {
      ++n;
      if (line.starts_with("```")) fenced = !fenced;
      if (fenced) continue;
      for (auto m = std::sregex_iterator(line.begin(), line.end(), link); m != std::sregex_iterator(); ++m) {
        const std::string target = (*m)[1];
        if (target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:"))
          continue;
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
    int code_column = -1, n = 0;
    bool fenced = false;
    for (const std::string& line : lines_of(read(md))) {
      ++n;
      if (line.starts_with("```")) fenced = !fenced;
      if (fenced) continue;
      if (!line.starts_with("|")) {
        code_column = -1;
        continue;
      }
      std::vector<std::string> cells;
      for (size_t a = 1, b; (b = line.find('|', a)) != std::string::npos; a = b + 1) cells.push_back(line.substr(a, b - a));
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
