// kernels/cpu/cpu_features.h — run-time choice between the AVX-512 and AVX2
// kernels and their portable scalar twins.
#pragma once

#include <cstddef>

namespace baton::kernels::cpu {

// Bytes per cache line on x86-64 cores: the step of software prefetch loops.
inline constexpr size_t kCacheLine = 64;

// True when the CPU has AVX2, FMA and F16C (checked once).
bool cpu_has_avx2_fma_f16c();

// True when the AVX2 paths are to be used: the CPU has them and they were not
// switched off with set_simd_enabled(false) (tests use that to cover the
// scalar fallback on AVX2 machines).
bool use_avx2();
void set_simd_enabled(bool enabled);

// True when the CPU has AVX-512 F, BW, VL and BF16 (checked once): the BF16
// dot product (VDPBF16PS) of BF16 decode attention's score and V passes.
bool cpu_has_avx512_bf16();

// True when the AVX-512 BF16 paths are to be used: the CPU has them, SIMD is
// enabled and they were not switched off with set_avx512_enabled(false)
// (tests use that to cover the AVX2 paths on AVX-512 machines, benchmarks
// to compare the two).
bool use_avx512_bf16();
void set_avx512_enabled(bool enabled);

}  // namespace baton::kernels::cpu
