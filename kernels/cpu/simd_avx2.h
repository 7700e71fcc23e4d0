// kernels/cpu/simd_avx2.h — small AVX2/FMA/F16C building blocks shared by the
// kernels: loading F32/F16/BF16 as 8 floats, horizontal sums, a vector exp.
//
// Everything here is compiled for AVX2 through a target attribute, so only
// functions carrying BATON_AVX2 themselves may call it, and only after
// use_avx2() said yes.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#define BATON_HAVE_X86 1
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <iterator>

#include "kernels/cpu/exp_poly.h"

#define BATON_AVX2 __attribute__((target("avx2,fma,f16c")))
#define BATON_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline

namespace baton::kernels::cpu::avx2 {

BATON_AVX2_INLINE __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

// BF16 is the top half of an F32: widen to 32 bits and shift up.
BATON_AVX2_INLINE __m256 load8_bf16(const uint16_t* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

// Sixteen BF16 values from one 256-bit load, widened by a shift and a mask:
// `even` holds elements 0, 2, ..., 14 and `odd` 1, 3, ..., 15. Half the work
// of widening two halves in order; a kernel keeps what the values meet
// (queries, x) in the same order (bf16_pair_slot), which dot products and
// sums do not mind.
BATON_AVX2_INLINE void load16_bf16_even_odd(const uint16_t* p, __m256& even, __m256& odd) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(int32_t(0xffff0000u))));
}

// Where element j of a 16-element chunk sits in load16_bf16_even_odd's order.
constexpr int bf16_pair_slot(int j) { return (j % 2) * 8 + j / 2; }

BATON_AVX2_INLINE __m256 load8_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Sixteen int8 codes as floats: elements 0-7 in `lo`, 8-15 in `hi`.
BATON_AVX2_INLINE void widen16_i8(const void* codes, __m256& lo, __m256& hi) {
  const auto* c = static_cast<const char*>(codes);
  lo = _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c))));
  hi = _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + 8))));
}

// Sixteen E4M3 codes as floats times 2^-8 (exactly): sign-extended to 16
// bits and shifted left by 7, a code's exponent and mantissa land in F16's
// fields and its sign in F16's sign bit, the sign's copy in bit 14 cleared,
// then F16C widens them. Elements 0-7 in `lo`, 8-15 in `hi`.
BATON_AVX2_INLINE void widen16_e4m3(const void* codes, __m256& lo, __m256& hi) {
  const __m128i raw = _mm_loadu_si128(static_cast<const __m128i*>(codes));
  const __m256i f16 = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(raw), 7),
                                       _mm256_set1_epi16(int16_t(0xbfff)));
  lo = _mm256_cvtph_ps(_mm256_castsi256_si128(f16));
  hi = _mm256_cvtph_ps(_mm256_extracti128_si256(f16, 1));
}

BATON_AVX2_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) for x <= ~88, relative error ~2e-7 (exp_poly.h). Inputs below -87
// give 0 or a tiny value; callers mask excluded entries explicitly.
BATON_AVX2_INLINE __m256 exp8(__m256 x) {
  using namespace exp_poly;
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(kMaxInput)), _mm256_set1_ps(kMinInput));
  const __m256 n =
      _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), x);
  __m256 y = _mm256_set1_ps(kP[0]);
#pragma GCC unroll 8
  for (size_t i = 1; i < std::size(kP); ++i) y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kP[i]));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

}  // namespace baton::kernels::cpu::avx2

#endif  // x86
