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

// The best OpenBLAS kernels this CPU runs, or null where it has no AVX2.
const char* best_core_for_cpu() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (cpu_has_avx512() && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd"))
    // Cooperlake's kernels add only BF16 GEMM to these, and OpenBLAS
    // 0.3.21 does not take that name cleanly ("Core not found").
    return "SkylakeX";
  if (cpu_has_avx2_fma_f16c()) return "Haswell";
#endif
  return nullptr;
}

}  // namespace

void setup_blas() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* best = best_core_for_cpu();
    if (best != nullptr && std::getenv("OPENBLAS_CORETYPE") == nullptr &&
        !core_has_avx2_kernels(openblas_get_corename()) && gotoblas_dynamic_init != nullptr &&
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
