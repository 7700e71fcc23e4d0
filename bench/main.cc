// Benchmark entry point of bench_kernels: Google Benchmark's flags plus
// Baton's (bench/bench_flags.h).
#include <benchmark/benchmark.h>

#include <string>

#include "bench/bench_flags.h"
#include "bench/ceilings.h"
#include "kernels/cpu/blas_setup.h"
#include "kernels/cpu/cpu_features.h"

int main(int argc, char** argv) {
  baton::kernels::cpu::setup_blas();  // first: see blas_setup.h
  baton::bench::take_bench_flags(&argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("pool_threads", std::to_string(baton::bench::bench_pool().size()));
  namespace cpu = baton::kernels::cpu;
  benchmark::AddCustomContext("blas_core", cpu::blas_core_name());
  benchmark::AddCustomContext("avx512", !cpu::cpu_has_avx512() ? "absent"
                                        : cpu::use_avx512()    ? "used"
                                                               : "off (--avx512=0)");
  benchmark::AddCustomContext("avx512_bf16", !cpu::cpu_has_avx512_bf16() ? "absent"
                                             : cpu::use_avx512_bf16()
                                                 ? "used"
                                                 : "not used (--avx512_bf16=1 to use)");
  benchmark::AddCustomContext("amx_bf16", !cpu::cpu_has_amx_bf16() ? "absent"
                                          : cpu::use_amx_bf16()
                                              ? "used"
                                              : "not used (--amx, --avx512 or BATON_MAX_CPU_ISA)");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
