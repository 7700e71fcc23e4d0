#include "bench/bench_flags.h"

#include <cstdlib>
#include <cstring>

#include "bench/ceilings.h"
#include "bench/huge_buffer.h"
#include "kernels/cpu/cpu_features.h"

namespace baton::bench {

void take_bench_flags(int* argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      set_bench_threads(std::atoi(argv[i] + 10));
    } else if (std::strncmp(argv[i], "--huge_pages=", 13) == 0) {
      HugeBuffer::use_huge_pages() = std::atoi(argv[i] + 13) != 0;
    } else if (std::strncmp(argv[i], "--avx512=", 9) == 0) {
      kernels::cpu::set_avx512_enabled(std::atoi(argv[i] + 9) != 0);
    } else if (std::strncmp(argv[i], "--avx512_bf16=", 14) == 0) {
      kernels::cpu::set_avx512_bf16_preferred(std::atoi(argv[i] + 14) != 0);
    } else if (std::strncmp(argv[i], "--amx=", 6) == 0) {
      kernels::cpu::set_amx_enabled(std::atoi(argv[i] + 6) != 0);
    } else {
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
}

}  // namespace baton::bench
