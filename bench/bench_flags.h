// bench/bench_flags.h — the flags every Baton benchmark binary takes besides
// Google Benchmark's:
//   --threads=N      size of the kernel thread pool (default: one per hardware
//                    thread), so per-core efficiency can be seen apart from scaling;
//   --huge_pages=0|1 back KV pools, weights and the bandwidth test's arrays with
//                    2 MiB pages (default 1), as the engine does;
//   --avx512=0|1     use the AVX-512 kernels where the CPU has them (default
//                    1), so one binary compares them with the AVX2 ones;
//   --avx512_bf16=0|1 BF16 decode attention's V pass on VDPBF16PS where the
//                    CPU has it (default: on AMD, cpu_features.h), so one
//                    binary compares it with the F32 FMA pass;
//   --amx=0|1        BF16 weights' prefill GEMM on AMX tiles where the CPU
//                    has them (default 1), so one binary compares it with
//                    the paths beneath it.
#pragma once

namespace baton::bench {

// Applies and removes those flags from argv, leaving the rest for
// benchmark::Initialize.
void take_bench_flags(int* argc, char** argv);

}  // namespace baton::bench
