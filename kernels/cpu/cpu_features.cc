#include "kernels/cpu/cpu_features.h"

#include <atomic>

namespace baton::kernels::cpu {
namespace {
std::atomic<bool> g_simd_enabled{true};
std::atomic<bool> g_avx512_enabled{true};
std::atomic<bool> g_avx512_bf16_preferred{cpu_prefers_avx512_bf16()};
}  // namespace

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
  return use_avx512() && cpu_has_avx512_bf16() &&
         g_avx512_bf16_preferred.load(std::memory_order_relaxed);
}

void set_avx512_bf16_preferred(bool preferred) {
  g_avx512_bf16_preferred.store(preferred, std::memory_order_relaxed);
}

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

bool use_avx512_vnni() { return use_avx512() && cpu_has_avx512_vnni(); }

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

bool use_avx512_bf16_vbmi() { return use_avx512() && cpu_has_avx512_bf16_vbmi(); }

}  // namespace baton::kernels::cpu
