#include "ops/products/blas_info.hpp"

#include <cblas.h>
#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace tapegrad {

namespace {

// Vector tiers, of a CPU and of the OpenBLAS kernels written for it.
enum class Tier { base, avx, avx2, avx512 };

bool same_name(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
  });
}

// OpenBLAS's core names (openblas_get_corename, OPENBLAS_CORETYPE) by the widest vectors their kernels use.
// Prescott, Core2, Penryn, Dunnington, Nehalem, Atom, Athlon, Opteron, Barcelona, Nano, Bobcat and names not
// listed here are the base tier.
Tier core_tier(std::string_view core) {
  for (std::string_view c : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (same_name(core, c)) return Tier::avx512;
  for (std::string_view c : {"Haswell", "Zen"})
    if (same_name(core, c)) return Tier::avx2;
  for (std::string_view c : {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller", "Excavator"})
    if (same_name(core, c)) return Tier::avx;
  return Tier::base;
}

Tier cpu_tier(const CpuFeatures& cpu) {
  if (!cpu.avx) return Tier::base;
  if (!cpu.avx2 || !cpu.fma) return Tier::avx;
  if (!cpu.avx512f || !cpu.avx512bw || !cpu.avx512dq || !cpu.avx512vl) return Tier::avx2;
  return Tier::avx512;
}

// AMD designs before Zen 5 run AVX-512 on 256-bit units.
bool amd_before_zen5(const CpuFeatures& cpu) {
  return (cpu.vendor == "AuthenticAMD" || cpu.vendor == "HygonGenuine") && cpu.family < 26;
}

std::string trimmed(std::string_view s) {
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return std::string(s);
}

// "AMD EPYC (AVX-512)": /proc/cpuinfo's model name (the vendor where there is none) and the widest vectors.
std::string cpu_description(const CpuFeatures& cpu) {
  std::string name;
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; name.empty() && std::getline(in, line);)
    if (line.rfind("model name", 0) == 0)
      if (size_t colon = line.find(':'); colon != std::string::npos) name = trimmed(line.substr(colon + 1));
  if (name.empty()) name = cpu.vendor.empty() ? "unknown CPU" : cpu.vendor;
  if (!cpu.x86_64) return name;
  static constexpr const char* kTierNames[] = {"no AVX", "AVX", "AVX2", "AVX-512"};
  return fmt::format("{} ({})", name, kTierNames[static_cast<int>(cpu_tier(cpu))]);
}

std::optional<std::string> nonempty_env(const char* name) {
  const char* value = std::getenv(name);
  if (!value || !*value) return std::nullopt;
  return std::string(value);
}

}  // namespace

CpuFeatures cpu_features() {
  CpuFeatures f;
#if defined(__x86_64__)
  f.x86_64 = true;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const unsigned max_leaf = a;
  char vendor[12];
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.vendor.assign(vendor, sizeof vendor);
  if (max_leaf < 1) return f;
  __cpuid(1, a, b, c, d);
  // Family: base + extended where the base is 15; model: extended·16 + base where the base family is 6 or 15.
  const unsigned base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
  f.family = static_cast<int>(base_family == 0xf ? base_family + ((a >> 20) & 0xff) : base_family);
  f.model =
      static_cast<int>(base_family == 0x6 || base_family == 0xf ? (((a >> 16) & 0xf) << 4) + base_model : base_model);
  const bool osxsave = (c >> 27) & 1;
  uint64_t xcr0 = 0;
  if (osxsave) {
    uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (uint64_t{hi} << 32) | lo;
  }
  const bool ymm_saved = (xcr0 & 0x6) == 0x6;    // SSE and AVX state
  const bool zmm_saved = (xcr0 & 0xe6) == 0xe6;  // and opmask, ZMM0-15 upper halves, ZMM16-31
  f.avx = ymm_saved && ((c >> 28) & 1);
  f.fma = ymm_saved && ((c >> 12) & 1);
  if (max_leaf < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned leaf7_subleaves = a;
  f.avx2 = ymm_saved && ((b >> 5) & 1);
  f.avx512f = zmm_saved && ((b >> 16) & 1);
  f.avx512dq = zmm_saved && ((b >> 17) & 1);
  f.avx512bw = zmm_saved && ((b >> 30) & 1);
  f.avx512vl = zmm_saved && ((b >> 31) & 1);
  const bool tiles_saved = (xcr0 & 0x60000) == 0x60000;            // XTILECFG and XTILEDATA
  f.amx_bf16 = tiles_saved && ((d >> 22) & 1) && ((d >> 24) & 1);  // AMX-BF16 and AMX-TILE
  if (leaf7_subleaves >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512bf16 = zmm_saved && ((a >> 5) & 1);
  }
#endif
  return f;
}

// The rule. A core below the CPU's tier leaves speed unused: Prescott's sgemm ran at 33 GFLOP/s per core on an
// Intel Xeon (family 6, model 207) that runs SkylakeX's at ~150. On Intel with AVX-512 the best core is SkylakeX
// (Cooperlake measured no faster there, 140 vs 150 GFLOP/s). On AMD up to Zen 4 (family 25) any AVX2-or-better
// core counts as right: on Zen 4 at the model's shapes Haswell ran 105-108 GFLOP/s per core, SkylakeX and
// Cooperlake ~100, Zen 94-98 (Zen 4 runs 512-bit ops on 256-bit units), so it is held to the AVX2 tier and given
// Haswell. Zen 5 (family 26) has full-width 512-bit units: the default model's training step took 19.2-20.0 ms with
// SkylakeX or Cooperlake and 28.9-29.8 ms with Haswell (2 threads), so there the AVX-512 kernels are the right ones.
std::optional<std::string> better_blas_core(const CpuFeatures& cpu, std::string_view core_in_use,
                                            std::optional<std::string_view> coretype_env) {
  if (!cpu.x86_64 || coretype_env) return std::nullopt;
  const Tier acceptable = amd_before_zen5(cpu) ? std::min(cpu_tier(cpu), Tier::avx2) : cpu_tier(cpu);
  if (core_tier(core_in_use) >= acceptable) return std::nullopt;
  switch (acceptable) {
    case Tier::avx512: return "SkylakeX";
    case Tier::avx2: return "Haswell";
    case Tier::avx: return "Sandybridge";
    case Tier::base: break;
  }
  return std::nullopt;
}

BlasInfo blas_info() {
  BlasInfo info;
  info.config = openblas_get_config();
  // The config starts with the name and the version: "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..."
  const size_t first_space = info.config.find(' ');
  info.library =
      info.config.substr(0, first_space == std::string::npos ? first_space : info.config.find(' ', first_space + 1));
  info.core = openblas_get_corename();
  info.threads = openblas_get_num_threads();
  info.coretype_env = nonempty_env("OPENBLAS_CORETYPE");
  if (!info.coretype_env)
    if (auto fake = nonempty_env("TAPEGRAD_FAKE_BLAS_CORE")) info.core = *fake;
  const CpuFeatures cpu = cpu_features();
  // Judged whoever chose the core: a user's OPENBLAS_CORETYPE is kept, but a weak one is still reported, unless
  // TAPEGRAD_BLAS_CHECK=off asks for no advice at all.
  const auto check = nonempty_env("TAPEGRAD_BLAS_CHECK");
  if (!(check && same_name(*check, "off"))) info.better_core = better_blas_core(cpu, info.core, std::nullopt);
  info.cpu = cpu_description(cpu);
  return info;
}

std::string blas_summary(const BlasInfo& info) {
  std::string s = fmt::format("{}, {} kernels", info.library, info.core);
  if (info.coretype_env) s += fmt::format(", OPENBLAS_CORETYPE={} set", *info.coretype_env);
  if (info.better_core)
    s += fmt::format("; this CPU runs {} kernels: set OPENBLAS_CORETYPE={}", *info.better_core, *info.better_core);
  return s;
}

nlohmann::json blas_json(const BlasInfo& info) {
  const auto or_null = [](const std::optional<std::string>& s) { return s ? nlohmann::json(*s) : nlohmann::json(); };
  return {{"library", info.library},
          {"config", info.config},
          {"core", info.core},
          {"threads", info.threads},
          {"coretype_env", or_null(info.coretype_env)},
          {"better_core", or_null(info.better_core)},
          {"cpu", info.cpu}};
}

void warn_if_weak_blas_core() {
  if (blas_detail::core_checked.exchange(true, std::memory_order_acq_rel)) return;
  const BlasInfo info = blas_info();
  if (!info.better_core) return;
  // Measured: 3-5x on an Intel Xeon from Prescott to SkylakeX, 2.6x on an AMD EPYC from Prescott to Haswell.
  const bool base_core = core_tier(info.core) == Tier::base;
  fmt::print(stderr,
             "tapegrad: warning: OpenBLAS runs {} kernels on this CPU ({}), which runs {} kernels {}faster: set "
             "OPENBLAS_CORETYPE={} before the program starts\n",
             info.core, info.cpu, *info.better_core, base_core ? "2.5-5x " : "", *info.better_core);
}

void blas_core_warning_given() { blas_detail::core_checked.store(true, std::memory_order_release); }

}  // namespace tapegrad
