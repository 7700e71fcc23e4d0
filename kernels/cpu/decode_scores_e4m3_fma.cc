#include "kernels/cpu/decode_scores_e4m3_fma.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/dispatch.h"

namespace baton::kernels::cpu {

// AVX-512 F, BW and VL alone: no BF16 or VBMI instruction may reach this
// pass, which runs where the CPU has neither.
#define BATON_AVX512_FMA __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define BATON_AVX512_FMA_INLINE \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"), always_inline)) inline

// GCC 12's unmasked AVX-512 intrinsics start from an undefined vector,
// which -Wmaybe-uninitialized reports once inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Apart from the VDPBF16PS pass's names, so one translation unit can hold
// both (as bench/partition_ab's does).
namespace e4m3_fma {
namespace {

// One dimension pair of 16 keys (8 when kHalf) at `row`, widened to F32
// through F16 (a code shifted into an F16 word is the code's value times
// 2^-8; the scales take it back): keys 0-7 in lo, 8-15 in hi, each key's
// pair side by side.
template <bool kHalf>
BATON_AVX512_FMA_INLINE void widen_pair(const char* row, __m512& lo, __m512& hi) {
  const __m256i codes =
      kHalf ? _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)))
            : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
  const __m512i f16 = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(codes), 7),
                                       _mm512_set1_epi16(int16_t(0xbfff)));
  lo = _mm512_cvtph_ps(_mm512_castsi512_si256(f16));
  hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(f16, 1));
}

// The scores of R query vectors (vector r at q + r d) against 16 keys (8
// when kHalf) whose first dimension pair is at `row`, times their scales at
// `scales`: each lane sums one dimension (even or odd) of a key, and the
// pairs' lanes are joined at the end. Fewer than three query vectors rotate
// consecutive pairs over two sets of accumulators, so the FMA chains do not
// wait on their latency.
template <int R, bool kHalf>
BATON_AVX512_FMA_INLINE void fma_scores16(const float* q, int32_t d, const char* row,
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

// The pass, for e4m3_score_runs.inc.
struct FmaPass {
  using Query = float;
  struct Context {};
  BATON_AVX512_FMA_INLINE static Context context() { return {}; }
  template <int R, bool kHalf>
  BATON_AVX512_FMA_INLINE static void score16(const float* q, int32_t d, const char* row,
                                              size_t group_bytes, const char* scales, float* s,
                                              int32_t s_stride, const Context&,
                                              PrefetchStream& stream) {
    fma_scores16<R, kHalf>(q, d, row, group_bytes, scales, s, s_stride, stream);
  }
};

#define BATON_E4M3_RUNS_TARGET BATON_AVX512_FMA
#include "kernels/cpu/e4m3_score_runs.inc"
#undef BATON_E4M3_RUNS_TARGET

}  // namespace
}  // namespace e4m3_fma

void key_tile_scores_e4m3_fma(int32_t queries, const float* q, int32_t d, const void* k,
                              size_t group_stride, ptrdiff_t scale_delta, int32_t n8, float* s,
                              int32_t s_stride, PrefetchStream& stream) {
  with_queries<4>(queries, [&]<int R>() {
    e4m3_fma::tile_scores<R, e4m3_fma::FmaPass>(q, d, static_cast<const char*>(k), group_stride,
                                                scale_delta, n8, s, s_stride, stream);
  });
}

void key_run_scores_e4m3_fma(int32_t queries, const float* q, int32_t d, const char* const* tiles,
                             size_t group_stride, ptrdiff_t scale_delta, int32_t keys, float* s,
                             int32_t s_stride, PrefetchStream& stream) {
  with_queries<4>(queries, [&]<int R>() {
    e4m3_fma::run_scores<R, e4m3_fma::FmaPass>(q, d, tiles, group_stride, scale_delta, keys, s,
                                               s_stride, stream);
  });
}

#pragma GCC diagnostic pop

}  // namespace baton::kernels::cpu

#endif
