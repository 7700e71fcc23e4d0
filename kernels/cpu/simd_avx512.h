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
#include <iterator>
#include <limits>

#include "common/dtype.h"
#include "kernels/cpu/exp_poly.h"

#define BATON_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define BATON_AVX512_INLINE \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"), always_inline)) inline
// The same with AVX512_BF16 (VDPBF16PS, VCVTNE2PS2BF16): only after
// cpu_has_avx512_bf16() said yes.
#define BATON_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
#define BATON_AVX512_BF16_INLINE                                               \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c"), \
                 always_inline)) inline

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

// exp(x) for x <= 0 over 16 lanes, as avx2::exp8 (exp_poly.h); inputs below
// -87 give 0 or a tiny value.
BATON_AVX512_INLINE __m512 exp16_nonpositive(__m512 x) {
  using namespace exp_poly;
  x = _mm512_max_ps(x, _mm512_set1_ps(kMinInput));
  const __m512 n =
      _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(kLog2e), _mm512_set1_ps(0.5f)),
                           _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), x);
  __m512 y = _mm512_set1_ps(kP[0]);
#pragma GCC unroll 8
  for (size_t i = 1; i < std::size(kP); ++i) y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(kP[i]));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  const __m512i e =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

// The first `n` of 16 lanes.
BATON_AVX512_INLINE __mmask16 first_lanes(int32_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// The max of s[0, visible), -inf when visible is 0.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"  // the _mm512_reduce_* macros
BATON_AVX512_INLINE float max_of(const float* s, int32_t visible) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 max0 = neg_inf, max1 = neg_inf;
  int32_t t = 0;
  for (; t + 32 <= visible; t += 32) {
    max0 = _mm512_max_ps(max0, _mm512_loadu_ps(s + t));
    max1 = _mm512_max_ps(max1, _mm512_loadu_ps(s + t + 16));
  }
  for (; t < visible; t += 16)
    max0 = _mm512_max_ps(max0, _mm512_mask_loadu_ps(neg_inf, first_lanes(visible - t), s + t));
  return _mm512_reduce_max_ps(_mm512_max_ps(max0, max1));
}
#pragma GCC diagnostic pop

// The 16 x 16 matrix of 32-bit elements r[row][col] transposed in place:
// r[col] then holds element col of every row.
BATON_AVX512_INLINE void transpose16x16(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4g + c], 128-bit lane L: rows 4g..4g+3 of column 4L + c.
  __m512i u[16];
  for (int g = 0; g < 16; g += 4) {
    u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
    const __m512i x1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
    const __m512i y0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i y1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
    r[8 + c] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
  }
}

}  // namespace baton::kernels::cpu::avx512

#endif  // x86
