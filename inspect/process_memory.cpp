#include "inspect/process_memory.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
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

std::optional<double> read_number(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    return std::stod(text);
  } catch (const std::exception&) {
    return std::nullopt;
  }
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
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    double kb = 0;
    std::string unit;
    if (!(meminfo >> kb >> unit)) break;
    if (key == "MemAvailable:") {
      available = kb * 1024;
      break;
    }
  }
  const auto limit = read_number("/sys/fs/cgroup/memory.max"), used = read_number("/sys/fs/cgroup/memory.current");
  if (limit && used) available = available ? std::min(*available, *limit - *used) : *limit - *used;
  if (const char* cap = std::getenv("TAPEGRAD_MEMORY_LIMIT"); cap && *cap) {
    const double bytes = user_memory_limit(cap);
    available = available ? std::min(*available, bytes) : bytes;
  }
  return available;
}

static double status_bytes(const std::string& key) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind(key + ":", 0) == 0) {
      try {
        return std::stod(line.substr(key.size() + 1)) * 1024;  // "VmHWM:    81234 kB"
      } catch (const std::exception&) {
        return 0;
      }
    }
  return 0;
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
