#include "kernels/cpu/decode_scores_fp8.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <array>

#include "common/dtype.h"
#include "kernels/cpu/dispatch.h"

namespace baton::kernels::cpu {

#define BATON_AVX512_FP8 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi,avx2,fma,f16c")))
#define BATON_AVX512_FP8_INLINE                                                           \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi,avx2,fma,f16c"), \
                 always_inline)) inline

// GCC 12's unmasked AVX-512 intrinsics start from an undefined vector,
// which -Wmaybe-uninitialized reports once inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// The pass's own pieces live in fp8::, apart from the int8 pass's names, so
// one translation unit can hold both (as bench/partition_ab's does).
namespace fp8 {
namespace {

// The low and the high byte of the BF16 value of every E4M3 magnitude
// (code & 0x7f; 0x7f is NaN, whose BF16 is NaN too), and the VPERMT2B
// indices that interleave them into words: built once.
struct Bf16Bytes {
  std::array<uint8_t, 128> lo, hi;
  std::array<uint8_t, 64> pick0, pick1;  // codes [0, 32) and [32, 64)
};

const Bf16Bytes& bf16_bytes() {
  static const Bf16Bytes bytes = [] {
    Bf16Bytes b{};
    for (int c = 0; c < 128; ++c) {
      const uint16_t bits = float_to_bf16(fp8_e4m3_to_float(uint8_t(c))).bits;
      b.lo[size_t(c)] = uint8_t(bits & 0xff);
      b.hi[size_t(c)] = uint8_t(bits >> 8);
    }
    for (int k = 0; k < 32; ++k) {
      // Bit 6 of an index picks VPERMT2B's second table, the high bytes.
      b.pick0[size_t(2 * k)] = uint8_t(k);
      b.pick0[size_t(2 * k + 1)] = uint8_t(64 + k);
      b.pick1[size_t(2 * k)] = uint8_t(32 + k);
      b.pick1[size_t(2 * k + 1)] = uint8_t(96 + k);
    }
    return b;
  }();
  return bytes;
}

// The tables and indices of the conversion, in registers for a whole call.
struct Tables {
  __m512i lo0, lo1, hi0, hi1;  // bytes of magnitudes [0, 64) and [64, 128)
  __m512i sign;                // 0x80 in every byte
  __m512i pick0, pick1;        // codes [0, 32) and [32, 64) as (lo, hi) words
};

BATON_AVX512_FP8_INLINE Tables load_tables() {
  const Bf16Bytes& b = bf16_bytes();
  return {_mm512_loadu_si512(b.lo.data()),   _mm512_loadu_si512(b.lo.data() + 64),
          _mm512_loadu_si512(b.hi.data()),   _mm512_loadu_si512(b.hi.data() + 64),
          _mm512_set1_epi8(char(0x80)),      _mm512_loadu_si512(b.pick0.data()),
          _mm512_loadu_si512(b.pick1.data())};
}

// 64 E4M3 codes as BF16: codes [0, 32) in w0, [32, 64) in w1, in order.
BATON_AVX512_FP8_INLINE void to_bf16(__m512i codes, const Tables& t, __m512i& w0, __m512i& w1) {
  // VPERMI2B takes an index's low 7 bits: the magnitude.
  const __m512i lo = _mm512_permutex2var_epi8(t.lo0, codes, t.lo1);
  const __m512i hi_magnitude = _mm512_permutex2var_epi8(t.hi0, codes, t.hi1);
  // hi | (codes & 0x80): the sign bit joins the high byte.
  const __m512i hi = _mm512_ternarylogic_epi32(hi_magnitude, codes, t.sign, 0xf8);
  w0 = _mm512_permutex2var_epi8(lo, t.pick0, hi);
  w1 = _mm512_permutex2var_epi8(lo, t.pick1, hi);
}

// Two consecutive dimension pairs of 16 keys (8 when kHalf): the first at
// `row` in codes [0, 32), the second group_bytes on in codes [32, 64).
template <bool kHalf>
BATON_AVX512_FP8_INLINE __m512i load_pairs(const char* row, size_t group_bytes) {
  if constexpr (kHalf) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + group_bytes));
    return _mm512_inserti32x4(_mm512_castsi128_si512(a), b, 2);
  } else {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + group_bytes));
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
  }
}

// The scores of R query vectors against 16 keys (8 when kHalf) whose first
// dimension pair is at `row` and whose scales are at `scales`. Even and odd
// dimension pairs go to separate accumulators, so that short chains do not
// wait on VDPBF16PS's latency.
template <int R, bool kHalf>
BATON_AVX512_FP8_INLINE void scores16(const uint32_t* q, int32_t d, const char* row,
                                      size_t group_bytes, const char* scales, float* s,
                                      int32_t s_stride, const Tables& t, PrefetchStream& stream) {
  constexpr size_t kRowBytes = (kHalf ? 8 : 16) * 2;
  const int32_t pairs = d / 2;
  __m512 even[R], odd[R];
  for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm512_setzero_ps();
  for (int32_t c = 0; c < pairs; c += 2) {
    stream.consumed(2 * kRowBytes);
    __m512i w0, w1;
    to_bf16(load_pairs<kHalf>(row, group_bytes), t, w0, w1);
    row += 2 * group_bytes;
    for (int r = 0; r < R; ++r) {
      const uint32_t* qr = q + size_t(r) * size_t(pairs) + c;
      even[r] =
          _mm512_dpbf16_ps(even[r], (__m512bh)w0, (__m512bh)_mm512_set1_epi32(int32_t(qr[0])));
      odd[r] = _mm512_dpbf16_ps(odd[r], (__m512bh)w1, (__m512bh)_mm512_set1_epi32(int32_t(qr[1])));
    }
  }
  constexpr __mmask16 kLanes = kHalf ? 0x00ff : 0xffff;
  const __m512 scale = _mm512_maskz_loadu_ps(kLanes, scales);
  for (int r = 0; r < R; ++r) {
    const __m512 score = _mm512_mul_ps(_mm512_add_ps(even[r], odd[r]), scale);
    _mm512_mask_storeu_ps(s + size_t(r) * s_stride, kLanes, score);
  }
}

// The VDPBF16PS pass, for e4m3_score_runs.inc.
struct Bf16Pass {
  using Query = uint32_t;
  using Context = Tables;
  BATON_AVX512_FP8_INLINE static Context context() { return load_tables(); }
  template <int R, bool kHalf>
  BATON_AVX512_FP8_INLINE static void score16(const uint32_t* q, int32_t d, const char* row,
                                              size_t group_bytes, const char* scales, float* s,
                                              int32_t s_stride, const Tables& t,
                                              PrefetchStream& stream) {
    scores16<R, kHalf>(q, d, row, group_bytes, scales, s, s_stride, t, stream);
  }
};

#define BATON_E4M3_RUNS_TARGET BATON_AVX512_FP8
#include "kernels/cpu/e4m3_score_runs.inc"
#undef BATON_E4M3_RUNS_TARGET

}  // namespace
}  // namespace fp8

BATON_AVX512_FP8 void bf16_query_pairs(const float* q, size_t n, uint32_t* pairs) {
  for (size_t i = 0; i < n; i += 32) {
    // The first operand's values go to the upper half.
    const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + i + 16), _mm512_loadu_ps(q + i));
    _mm512_storeu_si512(pairs + i / 2, (__m512i)h);
  }
}

void key_tile_scores_fp8(int32_t queries, const uint32_t* q, int32_t d, const void* k,
                         size_t group_stride, ptrdiff_t scale_delta, int32_t n8, float* s,
                         int32_t s_stride, PrefetchStream& stream) {
  with_queries<4>(queries, [&]<int R>() {
    fp8::tile_scores<R, fp8::Bf16Pass>(q, d, static_cast<const char*>(k), group_stride, scale_delta,
                                       n8, s, s_stride, stream);
  });
}

void key_run_scores_fp8(int32_t queries, const uint32_t* q, int32_t d, const char* const* tiles,
                        size_t group_stride, ptrdiff_t scale_delta, int32_t keys, float* s,
                        int32_t s_stride, PrefetchStream& stream) {
  with_queries<4>(queries, [&]<int R>() {
    fp8::run_scores<R, fp8::Bf16Pass>(q, d, tiles, group_stride, scale_delta, keys, s, s_stride,
                                      stream);
  });
}

#pragma GCC diagnostic pop

}  // namespace baton::kernels::cpu

#endif
