#include "kernels/cpu/cpu_features.h"

#include <atomic>
#include <cstdlib>

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace baton::kernels::cpu {
namespace {
constexpr const char* kMaxCpuIsaVariable = "BATON_MAX_CPU_ISA";

const char* max_cpu_isa_text() { return std::getenv(kMaxCpuIsaVariable); }

const MaxCpuIsa g_max_cpu_isa = [] {
  const char* text = max_cpu_isa_text();
  return text == nullptr ? MaxCpuIsa::kAmx : parse_max_cpu_isa(text).value_or(MaxCpuIsa::kAmx);
}();
std::atomic<bool> g_simd_enabled{g_max_cpu_isa >= MaxCpuIsa::kAvx2};
std::atomic<bool> g_avx512_enabled{g_max_cpu_isa >= MaxCpuIsa::kAvx512};
std::atomic<bool> g_amx_enabled{g_max_cpu_isa >= MaxCpuIsa::kAmx};
std::atomic<bool> g_avx512_bf16_preferred{cpu_prefers_avx512_bf16()};
std::atomic<bool> g_avx512_extensions_enabled{true};

bool avx512_extensions_enabled() {
  return g_avx512_extensions_enabled.load(std::memory_order_relaxed);
}
}  // namespace

std::optional<MaxCpuIsa> parse_max_cpu_isa(std::string_view value) {
  if (value == "scalar") return MaxCpuIsa::kScalar;
  if (value == "avx2") return MaxCpuIsa::kAvx2;
  if (value == "avx512") return MaxCpuIsa::kAvx512;
  if (value == "amx") return MaxCpuIsa::kAmx;
  return std::nullopt;
}

MaxCpuIsa max_cpu_isa() { return g_max_cpu_isa; }

std::string max_cpu_isa_error() {
  const char* text = max_cpu_isa_text();
  if (text == nullptr || parse_max_cpu_isa(text)) return "";
  return std::string(kMaxCpuIsaVariable) + "='" + text + "': expected scalar, avx2, avx512 or amx";
}

std::string kernel_isa_name() {
  if (!use_avx512()) return use_avx2() ? "avx2" : "scalar";
  std::string name = use_avx512_bf16() ? "avx512 with bf16 dot products" : "avx512";
  if (use_amx_bf16()) name += " and amx bf16 tiles";
  return name;
}

bool cpu_has_avx2_fma_f16c() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  }();
  return has;
#else
  return false;
#endif
}

bool use_avx2() {
  return cpu_has_avx2_fma_f16c() && g_simd_enabled.load(std::memory_order_relaxed);
}

void set_simd_enabled(bool enabled) { g_simd_enabled.store(enabled, std::memory_order_relaxed); }

bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }();
  return has;
#else
  return false;
#endif
}

bool use_avx512() {
  return use_avx2() && cpu_has_avx512() && g_avx512_enabled.load(std::memory_order_relaxed);
}

void set_avx512_enabled(bool enabled) {
  g_avx512_enabled.store(enabled, std::memory_order_relaxed);
}

void set_avx512_extensions_enabled(bool enabled) {
  g_avx512_extensions_enabled.store(enabled, std::memory_order_relaxed);
}

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = [] {
    __builtin_cpu_init();
    return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
  }();
  return has;
#else
  return false;
#endif
}

bool cpu_prefers_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return cpu_has_avx512_bf16() && __builtin_cpu_is("amd");
#else
  return false;
#endif
}

bool use_avx512_bf16() {
  return use_avx512() && avx512_extensions_enabled() && cpu_has_avx512_bf16() &&
         g_avx512_bf16_preferred.load(std::memory_order_relaxed);
}

void set_avx512_bf16_preferred(bool preferred) {
  g_avx512_bf16_preferred.store(preferred, std::memory_order_relaxed);
}

bool avx512_bf16_preferred() { return g_avx512_bf16_preferred.load(std::memory_order_relaxed); }

bool cpu_has_avx512_vnni() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = [] {
    __builtin_cpu_init();
    return cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
  }();
  return has;
#else
  return false;
#endif
}

bool use_avx512_vnni() {
  return use_avx512() && avx512_extensions_enabled() && cpu_has_avx512_vnni();
}

bool cpu_has_avx512_bf16_vbmi() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = [] {
    __builtin_cpu_init();
    return cpu_has_avx512_bf16() && __builtin_cpu_supports("avx512vbmi");
  }();
  return has;
#else
  return false;
#endif
}

bool use_avx512_bf16_vbmi() {
  return use_avx512() && avx512_extensions_enabled() && cpu_has_avx512_bf16_vbmi();
}

bool cpu_has_amx_bf16() {
#if defined(__x86_64__) && defined(__linux__)
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!cpu_has_avx512_bf16() || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    constexpr unsigned kAmxBf16 = 1u << 22, kAmxTile = 1u << 24;  // CPUID.(7,0):EDX
    if ((edx & (kAmxBf16 | kAmxTile)) != (kAmxBf16 | kAmxTile)) return false;
    // The permission covers every thread of the process, present and future.
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtileData = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0;
  }();
  return has;
#else
  return false;
#endif
}

bool use_amx_bf16() {
  // The flag first: a process whose cap leaves AMX off never asks Linux for
  // the tile state.
  return use_avx512() && avx512_extensions_enabled() &&
         g_amx_enabled.load(std::memory_order_relaxed) && cpu_has_amx_bf16();
}

void set_amx_enabled(bool enabled) { g_amx_enabled.store(enabled, std::memory_order_relaxed); }

}  // namespace baton::kernels::cpu
