// The OpenBLAS core check: which kernels count as weak for which CPU.
#include <doctest/doctest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "ops/products/blas_info.hpp"

using namespace tapegrad;

namespace {

CpuFeatures intel_avx512() {  // an Intel Xeon, family 6 model 207 (Emerald Rapids): OpenBLAS 0.3.21 gives Prescott
  CpuFeatures c;
  c.x86_64 = true;
  c.vendor = "GenuineIntel";
  c.family = 6;
  c.model = 207;
  c.avx = c.avx2 = c.fma = true;
  c.avx512f = c.avx512bw = c.avx512dq = c.avx512vl = c.avx512bf16 = true;
  return c;
}

CpuFeatures intel_avx2() {  // no AVX-512: a desktop Alder Lake
  CpuFeatures c = intel_avx512();
  c.model = 151;
  c.avx512f = c.avx512bw = c.avx512dq = c.avx512vl = c.avx512bf16 = false;
  return c;
}

CpuFeatures amd_avx2() {  // Zen 3
  CpuFeatures c = intel_avx2();
  c.vendor = "AuthenticAMD";
  c.family = 25;
  c.model = 1;
  return c;
}

CpuFeatures amd_avx512() {  // Zen 4
  CpuFeatures c = intel_avx512();
  c.vendor = "AuthenticAMD";
  c.family = 25;
  c.model = 17;
  return c;
}

CpuFeatures amd_zen5() {  // full-width AVX-512 units
  CpuFeatures c = amd_avx512();
  c.family = 26;
  c.model = 2;
  return c;
}

std::optional<std::string> better(const CpuFeatures& cpu, const char* core,
                                  std::optional<std::string_view> env = std::nullopt) {
  return better_blas_core(cpu, core, env);
}

}  // namespace

TEST_CASE("a core below what the CPU runs names the best core for it") {
  CHECK(better(intel_avx512(), "Prescott") == "SkylakeX");
  CHECK(better(intel_avx512(), "Sandybridge") == "SkylakeX");
  CHECK(better(intel_avx512(), "Haswell") == "SkylakeX");
  CHECK(better(intel_avx2(), "Prescott") == "Haswell");
  CHECK(better(amd_avx512(), "Prescott") == "Haswell");
  CHECK(better(amd_avx2(), "Nehalem") == "Haswell");
  CHECK(better(amd_zen5(), "Prescott") == "SkylakeX");
  CHECK(better(amd_zen5(), "Haswell") == "SkylakeX");  // steps 1.5x slower than on SkylakeX or Cooperlake
  CHECK(better(amd_zen5(), "Zen") == "SkylakeX");
  CpuFeatures avx_only = intel_avx2();
  avx_only.avx2 = avx_only.fma = false;
  CHECK(better(avx_only, "Core2") == "Sandybridge");
  CHECK(better(intel_avx512(), "NoSuchCore") == "SkylakeX");
}

TEST_CASE("a core at the CPU's tier is left alone; on AMD before Zen 5 any AVX2-or-better core is") {
  CHECK(better(intel_avx512(), "SkylakeX") == std::nullopt);
  CHECK(better(intel_avx512(), "Cooperlake") == std::nullopt);
  CHECK(better(intel_avx512(), "sapphirerapids") == std::nullopt);  // names compare case-insensitively
  CHECK(better(amd_avx2(), "Zen") == std::nullopt);
  CHECK(better(amd_avx512(), "Haswell") == std::nullopt);
  CHECK(better(amd_avx512(), "Cooperlake") == std::nullopt);
  CHECK(better(amd_avx512(), "ZEN") == std::nullopt);
  CHECK(better(intel_avx2(), "Haswell") == std::nullopt);
  CHECK(better(amd_zen5(), "Cooperlake") == std::nullopt);
  CHECK(better(amd_zen5(), "SkylakeX") == std::nullopt);
}

TEST_CASE("AVX-512 counts only with F, BW, DQ and VL") {
  CpuFeatures knights = intel_avx512();  // AVX-512F without BW, DQ, VL (Knights Landing)
  knights.avx512bw = knights.avx512dq = knights.avx512vl = false;
  CHECK(better(knights, "Haswell") == std::nullopt);
  CHECK(better(knights, "Prescott") == "Haswell");
}

TEST_CASE("nothing is advised on another architecture or when the user set OPENBLAS_CORETYPE") {
  CHECK(better(CpuFeatures{}, "Prescott") == std::nullopt);
  CpuFeatures arm;
  arm.vendor = "ARM";
  CHECK(better(arm, "NEOVERSEN1") == std::nullopt);
  CHECK(better(intel_avx512(), "Prescott", "Prescott") == std::nullopt);
  CHECK(better(amd_avx512(), "Prescott", "Prescott") == std::nullopt);
}

TEST_CASE("cpuid agrees with itself") {
  const CpuFeatures cpu = cpu_features();
#if defined(__x86_64__)
  CHECK(cpu.x86_64);
  CHECK(cpu.vendor.size() == 12);
  CHECK(cpu.family >= 6);
  if (cpu.avx2) CHECK(cpu.avx);
  if (cpu.avx512bw) CHECK(cpu.avx512f);
  __builtin_cpu_init();  // the compiler's runtime check reads cpuid and XCR0 too
  CHECK(cpu.avx2 == (__builtin_cpu_supports("avx2") != 0));
  CHECK(cpu.avx512f == (__builtin_cpu_supports("avx512f") != 0));
#else
  CHECK_FALSE(cpu.x86_64);
  CHECK_FALSE(cpu.avx);
#endif
}

TEST_CASE("the core OpenBLAS picked on this machine is right for its CPU") {
  if (std::getenv("TAPEGRAD_FAKE_BLAS_CORE")) return;  // a test of the hook, not of this machine
  const BlasInfo info = blas_info();
  INFO(blas_summary(info));
  // With OPENBLAS_CORETYPE set by whoever runs the tests the core is theirs, not OpenBLAS's pick: it is judged by
  // the same rule (and warned about when weak). ctest cli_blas_core_quiet runs the program without the variable
  // and finds OpenBLAS's own pick right.
  REQUIRE_FALSE(std::getenv("TAPEGRAD_BLAS_CHECK"));
  if (info.coretype_env) CHECK(info.better_core == better_blas_core(cpu_features(), info.core, std::nullopt));
  else CHECK(info.better_core == std::nullopt);
  CHECK(info.library.rfind("OpenBLAS ", 0) == 0);
  CHECK(info.config.rfind(info.library, 0) == 0);
  CHECK(!info.core.empty());
  CHECK(!info.cpu.empty());
  CHECK(blas_summary(info).find(info.core + " kernels") != std::string::npos);
}

TEST_CASE("TAPEGRAD_FAKE_BLAS_CORE stands in for the core in use unless OPENBLAS_CORETYPE is set") {
  const char* previous = std::getenv("TAPEGRAD_FAKE_BLAS_CORE");
  const std::optional<std::string> saved = previous ? std::optional<std::string>(previous) : std::nullopt;
  setenv("TAPEGRAD_FAKE_BLAS_CORE", "Prescott", 1);
  const BlasInfo info = blas_info();
  if (saved) setenv("TAPEGRAD_FAKE_BLAS_CORE", saved->c_str(), 1);
  else unsetenv("TAPEGRAD_FAKE_BLAS_CORE");
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  if (coretype && *coretype) {
    CHECK(info.coretype_env == coretype);
    return;
  }
  CHECK(info.core == "Prescott");
  const CpuFeatures cpu = cpu_features();
  CHECK(info.better_core == better_blas_core(cpu, "Prescott", std::nullopt));
  if (cpu.avx) CHECK(info.better_core.has_value());
}

TEST_CASE("TAPEGRAD_BLAS_CHECK=off asks for no advice, whatever the core") {
  const char* fake = std::getenv("TAPEGRAD_FAKE_BLAS_CORE");
  const std::optional<std::string> saved = fake ? std::optional<std::string>(fake) : std::nullopt;
  setenv("TAPEGRAD_FAKE_BLAS_CORE", "Prescott", 1);
  setenv("TAPEGRAD_BLAS_CHECK", "off", 1);
  const BlasInfo off = blas_info();
  unsetenv("TAPEGRAD_BLAS_CHECK");
  const BlasInfo on = blas_info();
  if (saved) setenv("TAPEGRAD_FAKE_BLAS_CORE", saved->c_str(), 1);
  else unsetenv("TAPEGRAD_FAKE_BLAS_CORE");
  CHECK(off.better_core == std::nullopt);
  CHECK(off.core == on.core);
  if (!on.coretype_env && cpu_features().avx) CHECK(on.better_core.has_value());  // the fake Prescott is weak
}

TEST_CASE("the summary and the JSON say what runs and what to set") {
  BlasInfo info;
  info.library = "OpenBLAS 0.3.21";
  info.config = "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY Prescott MAX_THREADS=64";
  info.core = "Prescott";
  info.threads = 1;
  info.cpu = "Intel(R) Xeon(R) (AVX-512)";
  CHECK(blas_summary(info) == "OpenBLAS 0.3.21, Prescott kernels");
  info.better_core = "SkylakeX";
  CHECK(blas_summary(info) ==
        "OpenBLAS 0.3.21, Prescott kernels; this CPU runs SkylakeX kernels: set OPENBLAS_CORETYPE=SkylakeX");
  info.threads = 4;
  info.coretype_env = "Prescott";
  CHECK(blas_summary(info) ==
        "OpenBLAS 0.3.21, Prescott kernels, OPENBLAS_CORETYPE=Prescott set; "
        "this CPU runs SkylakeX kernels: set OPENBLAS_CORETYPE=SkylakeX");
  nlohmann::json j = blas_json(info);
  CHECK(j["core"] == "Prescott");
  CHECK(j["threads"] == 4);
  CHECK(j["coretype_env"] == "Prescott");
  CHECK(j["better_core"] == "SkylakeX");
  info.coretype_env.reset();
  info.better_core.reset();
  j = blas_json(info);
  CHECK(j["coretype_env"].is_null());
  CHECK(j["better_core"].is_null());
  CHECK(j["library"] == "OpenBLAS 0.3.21");
  CHECK(j["cpu"] == "Intel(R) Xeon(R) (AVX-512)");
}
