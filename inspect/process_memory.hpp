// The memory this process may use and uses: what is available to it (the system's, its cgroup's, a cap from the
// environment), a refusal in one line of work that needs more, its resident memory, and bytes as text.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tapegrad {

// Bytes this process may still take: MemAvailable of /proc/meminfo, or the cgroup's memory.max less its
// memory.current where that is smaller; nothing where neither can be read. TAPEGRAD_MEMORY_LIMIT in the environment
// (bytes, or a number with K, M or G: binary units) caps it further, for a machine shared with other work; a value
// that is not such a size throws an Error naming the variable.
std::optional<double> memory_available();

// Refuses, in one line, work that needs more memory than memory_available(): "WHAT needs about 8.8 GiB of memory,
// more than the 6.1 GiB available; ADVICE". Every command calls it with its estimate before it allocates.
void require_memory(double bytes, std::string_view what, std::string_view advice);
// For a command's header: "about 812.3 MiB estimated, 20.1 GiB available" ("available unknown" where it is).
std::string memory_outlook(double bytes);

// The process's resident memory now (VmRSS) and at its peak so far (VmHWM), from /proc/self/status; 0 if unknown.
double resident_bytes();
double peak_resident_bytes();

// "812 bytes", "3.2 KiB", "812.3 MiB", "5.8 GiB"
std::string bytes_text(double bytes);

}  // namespace tapegrad
