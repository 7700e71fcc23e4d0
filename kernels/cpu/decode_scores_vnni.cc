#include "kernels/cpu/decode_scores_vnni.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/dispatch.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace baton::kernels::cpu {

namespace {

// A query vector with an infinity or a NaN scores NaN, as it would in F32:
// zero codes (128 each) and scale NaN.
void not_finite(int32_t d, uint32_t* words, float* scale) {
  std::fill(words, words + d / 4, 0x80808080u);
  *scale = std::numeric_limits<float>::quiet_NaN();
}

void quantize_queries_scalar(const float* q, int32_t n_q, int32_t d, uint32_t* words,
                             float* scales) {
  for (int32_t i = 0; i < n_q; ++i) {
    const float* v = q + size_t(i) * d;
    float amax = 0.0f;
    bool finite = true;
    for (int32_t c = 0; c < d; ++c) {
      amax = std::max(amax, std::abs(v[c]));
      finite = finite && std::isfinite(v[c]);
    }
    if (!finite) {
      not_finite(d, words + size_t(i) * (d / 4), scales + i);
      continue;
    }
    float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    scales[i] = amax / 127.0f;
    if (!std::isfinite(inverse)) inverse = scales[i] = 0.0f;
    for (int32_t c = 0; c < d; c += 4) {
      uint8_t codes[4];
      for (int32_t e = 0; e < 4; ++e) {
        const float x = std::clamp(std::nearbyint(v[c + e] * inverse), -127.0f, 127.0f);
        codes[e] = uint8_t(int32_t(x) + 128);
      }
      std::memcpy(words + size_t(i) * (d / 4) + c / 4, codes, 4);
    }
  }
}

#if defined(__x86_64__) || defined(__i386__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"  // the _mm512_reduce_* macros
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The same 16 lanes at a time (d a multiple of 16): VCVTPS2DQ rounds to
// nearest even under the default MXCSR, as nearbyint does. A query vector
// is quantized once per partition, and a long context has many: in scalar
// code this took half as long as the score pass itself.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void quantize_queries_avx512(
    const float* q, int32_t n_q, int32_t d, uint32_t* words, float* scales) {
  for (int32_t i = 0; i < n_q; ++i) {
    const float* v = q + size_t(i) * d;
    __m512 vmax = _mm512_setzero_ps();
    __mmask16 not_finite_lanes = 0;
    for (int32_t c = 0; c < d; c += 16) {
      const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(v + c));
      // |x| > FLT_MAX or unordered: an infinity or a NaN.
      not_finite_lanes |=
          _mm512_cmp_ps_mask(a, _mm512_set1_ps(std::numeric_limits<float>::max()), _CMP_NLE_UQ);
      vmax = _mm512_max_ps(vmax, a);
    }
    if (not_finite_lanes != 0) {
      not_finite(d, words + size_t(i) * (d / 4), scales + i);
      continue;
    }
    const float amax = _mm512_reduce_max_ps(vmax);
    float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    scales[i] = amax / 127.0f;
    if (!std::isfinite(inverse)) inverse = scales[i] = 0.0f;
    const __m512 vinv = _mm512_set1_ps(inverse);
    uint8_t* out = reinterpret_cast<uint8_t*>(words + size_t(i) * (d / 4));
    for (int32_t c = 0; c < d; c += 16) {
      __m512i x = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + c), vinv));
      x = _mm512_min_epi32(_mm512_max_epi32(x, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
      x = _mm512_add_epi32(x, _mm512_set1_epi32(128));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c), _mm512_cvtepi32_epi8(x));
    }
  }
}
#pragma GCC diagnostic pop
#endif

}  // namespace

void quantize_queries(const float* q, int32_t n_q, int32_t d, uint32_t* words, float* scales) {
#if defined(__x86_64__) || defined(__i386__)
  if (d % 16 == 0 && use_avx512()) return quantize_queries_avx512(q, n_q, d, words, scales);
#endif
  quantize_queries_scalar(q, n_q, d, words, scales);
}

#if defined(__x86_64__) || defined(__i386__)

#define BATON_AVX512_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define BATON_AVX512_VNNI_INLINE                                               \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"), \
                 always_inline)) inline

// GCC 12's masked-off forms of _mm512_slli_epi32 and _mm512_cvtepi32_ps
// start from an undefined vector, which -Wmaybe-uninitialized reports once
// inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

// One dimension group (four dimensions) of J groups of keys into R query
// vectors' accumulators and the keys' code sums; the rows move on by
// group_bytes.
template <int R, int J, bool kHalf>
BATON_AVX512_VNNI_INLINE void dot_group(QueryCodes q, int32_t words, int32_t c,
                                        const char* (&row)[J], size_t group_bytes,
                                        __m512i (&acc)[R][J], __m512i (&sum)[J]) {
  const __m512i ones = _mm512_set1_epi32(0x01010101);
  __m512i k[J];
  for (int j = 0; j < J; ++j) {
    k[j] = kHalf ? _mm512_maskz_loadu_epi32(__mmask16(0x00ff), row[j]) : _mm512_loadu_si512(row[j]);
    row[j] += group_bytes;
    sum[j] = _mm512_dpbusd_epi32(sum[j], ones, k[j]);
  }
  for (int r = 0; r < R; ++r) {
    const __m512i qv = _mm512_set1_epi32(int32_t(q.words[size_t(r) * words + c]));
    for (int j = 0; j < J; ++j) acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], qv, k[j]);
  }
}

// The scores of R query vectors against J groups of 16 keys (8 keys when
// kHalf, J = 1): group j's first four dimensions at rows[j], the next four
// group_bytes on, its scores at s + 16 j. Each query word is broadcast once
// for the J groups; even and odd dimension groups go to separate
// accumulators, so short R x J chains do not wait on VPDPBUSD's latency.
template <int R, int J, bool kHalf>
BATON_AVX512_VNNI_INLINE void scores16(QueryCodes q, int32_t d, const char* const (&rows)[J],
                                       size_t group_bytes, ptrdiff_t scale_delta, float* s,
                                       int32_t s_stride, PrefetchStream& stream) {
  static_assert(!kHalf || J == 1);
  constexpr size_t kGroupBytes = (kHalf ? 8 : 16) * 4;  // one dimension group of the keys
  const int32_t words = d / 4;
  __m512i even[R][J], odd[R][J], even_sum[J], odd_sum[J];
  for (int j = 0; j < J; ++j) {
    even_sum[j] = odd_sum[j] = _mm512_setzero_si512();
    for (int r = 0; r < R; ++r) even[r][j] = odd[r][j] = _mm512_setzero_si512();
  }
  const char* row[J];
  for (int j = 0; j < J; ++j) row[j] = rows[j];
  int32_t c = 0;
  for (; c + 2 <= words; c += 2) {
    stream.consumed(2 * J * kGroupBytes);
    dot_group<R, J, kHalf>(q, words, c, row, group_bytes, even, even_sum);
    dot_group<R, J, kHalf>(q, words, c + 1, row, group_bytes, odd, odd_sum);
  }
  if (c < words) {
    stream.consumed(J * kGroupBytes);
    dot_group<R, J, kHalf>(q, words, c, row, group_bytes, even, even_sum);
  }
  constexpr __mmask16 kLanes = kHalf ? 0x00ff : 0xffff;
  for (int j = 0; j < J; ++j) {
    // Each key's code sum times 128: what the +128 of the query codes added.
    const __m512i offset = _mm512_slli_epi32(_mm512_add_epi32(even_sum[j], odd_sum[j]), 7);
    const __m512 key_scales = _mm512_maskz_loadu_ps(kLanes, rows[j] + scale_delta);
    for (int r = 0; r < R; ++r) {
      const __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(even[r][j], odd[r][j]), offset);
      const __m512 score = _mm512_mul_ps(_mm512_cvtepi32_ps(dot),
                                         _mm512_mul_ps(key_scales, _mm512_set1_ps(q.scales[r])));
      _mm512_mask_storeu_ps(s + size_t(r) * s_stride + 16 * j, kLanes, score);
    }
  }
}

template <int R>
BATON_AVX512_VNNI void tile_scores(QueryCodes q, int32_t d, const void* k, size_t group_stride,
                                   ptrdiff_t scale_delta, int32_t n8, float* s, int32_t s_stride,
                                   PrefetchStream& stream) {
  PrefetchStream local = stream;  // a local copy stays in registers
  const char* tile = static_cast<const char*>(k);
  // Key t's codes start 4 t bytes into the tile, as its scale does into
  // the tile's scales: one delta serves both.
  int32_t t = 0;
  for (; t + 32 <= n8; t += 32) {
    const char* const rows[2] = {tile + size_t(t) * 4, tile + size_t(t + 16) * 4};
    scores16<R, 2, false>(q, d, rows, group_stride, scale_delta, s + t, s_stride, local);
  }
  for (; t + 16 <= n8; t += 16) {
    const char* const rows[1] = {tile + size_t(t) * 4};
    scores16<R, 1, false>(q, d, rows, group_stride, scale_delta, s + t, s_stride, local);
  }
  if (t < n8) {
    const char* const rows[1] = {tile + size_t(t) * 4};
    scores16<R, 1, true>(q, d, rows, group_stride, scale_delta, s + t, s_stride, local);
  }
  stream = local;
}

template <int R>
BATON_AVX512_VNNI void run_scores(QueryCodes q, int32_t d, const char* const* tiles,
                                  size_t group_stride, ptrdiff_t scale_delta, int32_t keys,
                                  float* s, int32_t s_stride, PrefetchStream& stream) {
  PrefetchStream local = stream;
  int32_t t = 0, j = 0;
  for (; t + 32 <= keys; t += 32, j += 2) {
    const char* const rows[2] = {tiles[j], tiles[j + 1]};
    scores16<R, 2, false>(q, d, rows, group_stride, scale_delta, s + t, s_stride, local);
  }
  for (; t < keys; t += 16, ++j) {
    // One tile left, or the run's last, partly filled one.
    if (t + 16 <= keys) {
      const char* const rows[1] = {tiles[j]};
      scores16<R, 1, false>(q, d, rows, group_stride, scale_delta, s + t, s_stride, local);
    } else {
      tile_scores<R>(q, d, tiles[j], group_stride, scale_delta, ((keys - t) + 7) / 8 * 8, s + t,
                     s_stride, local);
    }
  }
  stream = local;
}

}  // namespace

#pragma GCC diagnostic pop

void key_tile_scores_vnni(int32_t queries, QueryCodes q, int32_t d, const void* k,
                          size_t group_stride, ptrdiff_t scale_delta, int32_t n8, float* s,
                          int32_t s_stride, PrefetchStream& stream) {
  with_queries<4>(queries, [&]<int R>() {
    tile_scores<R>(q, d, k, group_stride, scale_delta, n8, s, s_stride, stream);
  });
}

void key_run_scores_vnni(int32_t queries, QueryCodes q, int32_t d, const char* const* tiles,
                         size_t group_stride, ptrdiff_t scale_delta, int32_t keys, float* s,
                         int32_t s_stride, PrefetchStream& stream) {
  with_queries<4>(queries, [&]<int R>() {
    run_scores<R>(q, d, tiles, group_stride, scale_delta, keys, s, s_stride, stream);
  });
}

#endif

}  // namespace baton::kernels::cpu
