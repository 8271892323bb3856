#include "inspect/process_memory.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <string_view>

#include "engine/tensor.hpp"  // fail()

namespace tapegrad {

void require_memory(double bytes, std::string_view what, std::string_view advice) {
  const std::optional<double> available = memory_available();
  if (available && bytes > *available)
    fail("{} needs about {} of memory, more than the {} available; {}", what, bytes_text(bytes), bytes_text(*available),
         advice);
}

std::string memory_outlook(double bytes) {
  const std::optional<double> available = memory_available();
  return fmt::format("about {} estimated, {}", bytes_text(bytes),
                     available ? bytes_text(*available) + " available" : "available unknown");
}

namespace {

// A small file under /proc or /sys, whole; empty where it cannot be read.
std::string read_small_file(const char* path) {
  std::string text;
  if (std::FILE* file = std::fopen(path, "r")) {
    char buffer[4096];
    for (size_t got; (got = std::fread(buffer, 1, sizeof buffer, file)) > 0;) text.append(buffer, got);
    std::fclose(file);
  }
  return text;
}

// The number after key where key begins a line of text ("MemAvailable:    81234 kB" gives 81234), or at the text's
// start where key is empty; nullopt where there is none, or no number there ("max").
std::optional<double> number_after(std::string_view text, std::string_view key) {
  size_t at = text.find(key);
  while (at != std::string_view::npos && at > 0 && text[at - 1] != '\n') at = text.find(key, at + 1);
  if (at == std::string_view::npos) return std::nullopt;
  at += key.size();
  while (at < text.size() && (text[at] == ' ' || text[at] == '\t')) ++at;
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data() + at, text.data() + text.size(), value);
  if (ec != std::errc()) return std::nullopt;
  return value;
}

// TAPEGRAD_MEMORY_LIMIT's value: "4294967296", "512M", "4G".
double user_memory_limit(std::string_view text) {
  double number = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
  const std::string_view unit(end, static_cast<size_t>(text.data() + text.size() - end));
  double scale = 0;
  if (unit.empty()) scale = 1;
  else if (unit == "K" || unit == "k") scale = 1024.0;
  else if (unit == "M") scale = 1024.0 * 1024;
  else if (unit == "G") scale = 1024.0 * 1024 * 1024;
  if (ec != std::errc() || scale == 0 || !(number >= 0) || !std::isfinite(number))
    fail("TAPEGRAD_MEMORY_LIMIT={}: expected a size in bytes, or a number followed by K, M or G", text);
  return number * scale;
}

}  // namespace

std::optional<double> memory_available() {
  std::optional<double> available;
  if (const auto kb = number_after(read_small_file("/proc/meminfo"), "MemAvailable:")) available = *kb * 1024;
  const auto limit = number_after(read_small_file("/sys/fs/cgroup/memory.max"), ""),
             used = number_after(read_small_file("/sys/fs/cgroup/memory.current"), "");
  if (limit && used) available = available ? std::min(*available, *limit - *used) : *limit - *used;
  if (const char* cap = std::getenv("TAPEGRAD_MEMORY_LIMIT"); cap && *cap) {
    const double bytes = user_memory_limit(cap);
    available = available ? std::min(*available, bytes) : bytes;
  }
  return available;
}

static double status_bytes(const std::string& key) {  // "VmHWM:    81234 kB"
  return number_after(read_small_file("/proc/self/status"), key + ":").value_or(0) * 1024;
}

double resident_bytes() { return status_bytes("VmRSS"); }
double peak_resident_bytes() { return status_bytes("VmHWM"); }

std::string bytes_text(double bytes) {
  if (bytes >= 1024.0 * 1024 * 1024 * 1024) return fmt::format("{:.1f} TiB", bytes / (1024.0 * 1024 * 1024 * 1024));
  if (bytes >= 1024.0 * 1024 * 1024) return fmt::format("{:.1f} GiB", bytes / (1024.0 * 1024 * 1024));
  if (bytes >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024));
  if (bytes >= 1024.0) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  return fmt::format("{:.0f} bytes", bytes);
}

}  // namespace tapegrad
