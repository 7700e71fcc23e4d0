#include "kernels/cpu/blas_setup.h"

#include <cblas.h>
#include <strings.h>

#include <array>
#include <cstdlib>
#include <mutex>

#include "kernels/cpu/cpu_features.h"

// OpenBLAS built with DYNAMIC_ARCH (Debian's is) exports the function that
// chooses its kernels; it is not in cblas.h, and a build without
// DYNAMIC_ARCH lacks it, so it is declared weak and looked for.
extern "C" void gotoblas_dynamic_init(void) __attribute__((weak));
extern "C" void gotoblas_dynamic_quit(void) __attribute__((weak));

namespace baton::kernels::cpu {
namespace {

// OpenBLAS's names of the kernels that use AVX2 and FMA, or better.
bool core_has_avx2_kernels(const char* name) {
  constexpr std::array<const char*, 6> kAvx2Cores = {
      "Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Excavator"};
  for (const char* core : kAvx2Cores)
    if (strcasecmp(name, core) == 0) return true;
  return false;
}

// OpenBLAS's names of the kernels that use AVX-512.
bool core_has_avx512_kernels(const char* name) {
  constexpr std::array<const char*, 3> kAvx512Cores = {"SkylakeX", "Cooperlake", "SapphireRapids"};
  for (const char* core : kAvx512Cores)
    if (strcasecmp(name, core) == 0) return true;
  return false;
}

// The best OpenBLAS kernels this CPU runs under BATON_MAX_CPU_ISA's cap, or
// null where it has no AVX2 (and nothing is capped).
const char* best_core_for_cpu() {
#if defined(__x86_64__)
  if (max_cpu_isa() == MaxCpuIsa::kScalar) return "Prescott";  // SSE3: OpenBLAS's plainest
  __builtin_cpu_init();
  if (max_cpu_isa() >= MaxCpuIsa::kAvx512 && cpu_has_avx512() &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd"))
    // Cooperlake's kernels add only BF16 GEMM to these, and OpenBLAS
    // 0.3.21 does not take that name cleanly ("Core not found").
    return "SkylakeX";
  if (cpu_has_avx2_fma_f16c()) return "Haswell";
#endif
  return nullptr;
}

// Whether OpenBLAS's own choice is to be replaced by best_core_for_cpu():
// it fell back below AVX2 on a CPU that has it, or it is wider than the cap.
bool choose_again(const char* current) {
  switch (max_cpu_isa()) {
    case MaxCpuIsa::kScalar:
      return strcasecmp(current, "Prescott") != 0;
    case MaxCpuIsa::kAvx2:
      return !core_has_avx2_kernels(current) || core_has_avx512_kernels(current);
    case MaxCpuIsa::kAvx512:
    case MaxCpuIsa::kAmx:  // the AMX cap is for Baton's own GEMM
      return !core_has_avx2_kernels(current);
  }
  return false;
}

}  // namespace

void setup_blas() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* best = best_core_for_cpu();
    if (best != nullptr && std::getenv("OPENBLAS_CORETYPE") == nullptr &&
        choose_again(openblas_get_corename()) && gotoblas_dynamic_init != nullptr &&
        gotoblas_dynamic_quit != nullptr) {
      // Named for the one call that reads it, then unset: the environment
      // stays the user's, and a child process chooses for itself.
      setenv("OPENBLAS_CORETYPE", best, 0);
      gotoblas_dynamic_quit();
      gotoblas_dynamic_init();
      unsetenv("OPENBLAS_CORETYPE");
    }
    // BLAS runs single-threaded inside our pool: one owner of the cores.
    openblas_set_num_threads(1);
  });
}

std::string blas_core_name() { return openblas_get_corename(); }

}  // namespace baton::kernels::cpu
