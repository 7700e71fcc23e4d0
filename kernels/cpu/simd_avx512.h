// kernels/cpu/simd_avx512.h — what the 512-bit kernels share: their target
// attributes and loading F32/F16/BF16 as 16 floats.
//
// Everything here is compiled for AVX-512 F/BW/VL through a target
// attribute, so only functions carrying BATON_AVX512 themselves may call it,
// and only after use_avx512() said yes.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
// GCC 12's AVX-512 intrinsics pass an undefined vector as the merge source of
// their unmasked forms, which -Wmaybe-uninitialized reports wherever they are
// inlined (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

#define BATON_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define BATON_AVX512_INLINE \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"), always_inline)) inline

namespace baton::kernels::cpu::avx512 {

// Sixteen elements of dtype T from element i of `base`, in order, as floats
// (a BF16 value is the top half of an F32).
template <DType T>
BATON_AVX512_INLINE __m512 load16(const void* base, size_t i) {
  if constexpr (T == DType::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(base) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i));
    if constexpr (T == DType::kF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

}  // namespace baton::kernels::cpu::avx512

#endif  // x86
