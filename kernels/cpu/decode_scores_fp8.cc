#include "kernels/cpu/decode_scores_fp8.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <array>
#include <cstring>

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

// One dimension pair of 16 keys (8 when kHalf) at `row`, widened to F32
// through F16 (a code shifted into an F16 word is the code's value times
// 2^-8; the scales take it back): keys 0-7 in lo, 8-15 in hi, each key's
// pair side by side.
template <bool kHalf>
BATON_AVX512_FP8_INLINE void widen_pair(const char* row, __m512& lo, __m512& hi) {
  const __m256i codes =
      kHalf ? _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)))
            : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
  const __m512i f16 = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(codes), 7),
                                       _mm512_set1_epi16(int16_t(0xbfff)));
  lo = _mm512_cvtph_ps(_mm512_castsi512_si256(f16));
  hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(f16, 1));
}

// As scores16, on F32 FMAs against F32 query vectors (vector r at q + r d):
// each lane sums one dimension (even or odd) of a key, and the pairs' lanes
// are joined at the end. Where VDPBF16PS is slow (Intel issues a quarter as
// many as 512-bit FMAs) this pass is the faster one. Fewer than three query
// vectors rotate consecutive pairs over two sets of accumulators, so the
// FMA chains do not wait on their latency.
template <int R, bool kHalf>
BATON_AVX512_FP8_INLINE void fma_scores16(const float* q, int32_t d, const char* row,
                                          size_t group_bytes, const char* scales, float* s,
                                          int32_t s_stride, PrefetchStream& stream) {
  constexpr size_t kRowBytes = (kHalf ? 8 : 16) * 2;
  constexpr int P = R <= 2 ? 2 : 1;
  __m512 lo[R][P], hi[R][P];
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < P; ++x) lo[r][x] = hi[r][x] = _mm512_setzero_ps();
  const int32_t pairs = d / 2;
  for (int32_t c = 0; c < pairs; c += P) {
    stream.consumed(P * kRowBytes);
    for (int x = 0; x < P; ++x, row += group_bytes) {
      __m512 wl, wh;
      widen_pair<kHalf>(row, wl, wh);
      for (int r = 0; r < R; ++r) {
        double pair;  // q's two dimensions of this pair, broadcast as one 64-bit lane
        std::memcpy(&pair, q + size_t(r) * size_t(d) + 2 * (c + x), sizeof pair);
        const __m512 qp = _mm512_castpd_ps(_mm512_set1_pd(pair));
        lo[r][x] = _mm512_fmadd_ps(qp, wl, lo[r][x]);
        hi[r][x] = _mm512_fmadd_ps(qp, wh, hi[r][x]);
      }
    }
  }
  constexpr __mmask16 kLanes = kHalf ? 0x00ff : 0xffff;
  const __m512 scale = _mm512_mul_ps(_mm512_maskz_loadu_ps(kLanes, scales), _mm512_set1_ps(256.0f));
  // Lanes 2t and 2t + 1 of (lo, hi) hold key t's two halves.
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int r = 0; r < R; ++r) {
    __m512 l = lo[r][0], h = hi[r][0];
    for (int x = 1; x < P; ++x) {
      l = _mm512_add_ps(l, lo[r][x]);
      h = _mm512_add_ps(h, hi[r][x]);
    }
    const __m512 sums =
        _mm512_add_ps(_mm512_permutex2var_ps(l, even, h), _mm512_permutex2var_ps(l, odd, h));
    _mm512_mask_storeu_ps(s + size_t(r) * s_stride, kLanes, _mm512_mul_ps(sums, scale));
  }
}

// 16 keys' scores (8 when kHalf) on the VDPBF16PS pass (q BF16 pairs) or,
// kFma, the FMA pass (q F32 vectors).
template <int R, bool kFma, bool kHalf>
BATON_AVX512_FP8_INLINE void any_scores16(const void* q, int32_t d, const char* row,
                                          size_t group_bytes, const char* scales, float* s,
                                          int32_t s_stride, const Tables& t,
                                          PrefetchStream& stream) {
  if constexpr (kFma)
    fma_scores16<R, kHalf>(static_cast<const float*>(q), d, row, group_bytes, scales, s, s_stride,
                           stream);
  else
    scores16<R, kHalf>(static_cast<const uint32_t*>(q), d, row, group_bytes, scales, s, s_stride, t,
                       stream);
}

template <int R, bool kFma>
BATON_AVX512_FP8 void tile_scores(const void* q, int32_t d, const char* tile, size_t group_stride,
                                  ptrdiff_t scale_delta, int32_t n8, float* s, int32_t s_stride,
                                  PrefetchStream& stream) {
  PrefetchStream local = stream;  // a local copy stays in registers
  const Tables t = kFma ? Tables{} : load_tables();
  const char* scales = tile + scale_delta;
  int32_t k = 0;
  for (; k + 16 <= n8; k += 16)
    any_scores16<R, kFma, false>(q, d, tile + size_t(k) * 2, group_stride, scales + size_t(k) * 4,
                                 s + k, s_stride, t, local);
  if (k < n8)
    any_scores16<R, kFma, true>(q, d, tile + size_t(k) * 2, group_stride, scales + size_t(k) * 4,
                                s + k, s_stride, t, local);
  stream = local;
}

template <int R, bool kFma>
BATON_AVX512_FP8 void run_scores(const void* q, int32_t d, const char* const* tiles,
                                 size_t group_stride, ptrdiff_t scale_delta, int32_t keys, float* s,
                                 int32_t s_stride, PrefetchStream& stream) {
  PrefetchStream local = stream;
  const Tables t = kFma ? Tables{} : load_tables();
  int32_t k = 0, j = 0;
  for (; k + 16 <= keys; k += 16, ++j)
    any_scores16<R, kFma, false>(q, d, tiles[j], group_stride, tiles[j] + scale_delta, s + k,
                                 s_stride, t, local);
  // The run's last, partly filled tile: its slots past `keys` score
  // whatever they hold, and the softmax masks them.
  if (keys - k > 8)
    any_scores16<R, kFma, false>(q, d, tiles[j], group_stride, tiles[j] + scale_delta, s + k,
                                 s_stride, t, local);
  else if (k < keys)
    any_scores16<R, kFma, true>(q, d, tiles[j], group_stride, tiles[j] + scale_delta, s + k,
                                s_stride, t, local);
  stream = local;
}

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
    fp8::tile_scores<R, false>(q, d, static_cast<const char*>(k), group_stride, scale_delta, n8, s,
                               s_stride, stream);
  });
}

void key_run_scores_fp8(int32_t queries, const uint32_t* q, int32_t d, const char* const* tiles,
                        size_t group_stride, ptrdiff_t scale_delta, int32_t keys, float* s,
                        int32_t s_stride, PrefetchStream& stream) {
  with_queries<4>(queries, [&]<int R>() {
    fp8::run_scores<R, false>(q, d, tiles, group_stride, scale_delta, keys, s, s_stride, stream);
  });
}

void key_tile_scores_e4m3_fma(int32_t queries, const float* q, int32_t d, const void* k,
                              size_t group_stride, ptrdiff_t scale_delta, int32_t n8, float* s,
                              int32_t s_stride, PrefetchStream& stream) {
  with_queries<4>(queries, [&]<int R>() {
    fp8::tile_scores<R, true>(q, d, static_cast<const char*>(k), group_stride, scale_delta, n8, s,
                              s_stride, stream);
  });
}

void key_run_scores_e4m3_fma(int32_t queries, const float* q, int32_t d, const char* const* tiles,
                             size_t group_stride, ptrdiff_t scale_delta, int32_t keys, float* s,
                             int32_t s_stride, PrefetchStream& stream) {
  with_queries<4>(queries, [&]<int R>() {
    fp8::run_scores<R, true>(q, d, tiles, group_stride, scale_delta, keys, s, s_stride, stream);
  });
}

#pragma GCC diagnostic pop

}  // namespace baton::kernels::cpu

#endif
