// kernels/cpu/blas_setup.h — how Baton runs OpenBLAS: single-threaded inside
// the kernels' own pool, and with the kernels of the CPU it runs on.
//
// Debian 12's OpenBLAS (0.3.21) picks its kernels by CPU model, and takes a
// model it does not know for a Prescott: SSE3 kernels. An Intel Xeon of the
// Emerald Rapids generation (model 207) is one: sgemm on two threads ran at
// 37.6 GFLOP/s there, and at 162-212 with the SkylakeX kernels
// (PERFORMANCE.md, "The machine"). OpenBLAS reads OPENBLAS_CORETYPE when it
// chooses its kernels, as it loads, before main; so where it chose kernels without AVX2 on a
// CPU that has it, setup_blas() names the CPU's best kernels and has
// OpenBLAS choose again. A core type the user set in the environment is
// left alone.
#pragma once

#include <string>

namespace baton::kernels::cpu {

// Once per process, before the first BLAS call (linear() calls it): sets
// OpenBLAS to one thread, and to the CPU's kernels as above. Programs call
// it first thing in main: setenv and unsetenv race with getenv on other
// threads.
void setup_blas();

// The kernels OpenBLAS runs ("SkylakeX", "Haswell", ...), for benchmarks to
// print.
std::string blas_core_name();

}  // namespace baton::kernels::cpu
