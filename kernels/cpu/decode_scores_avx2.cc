#include "kernels/cpu/decode_scores_avx2.h"

#if defined(__x86_64__) || defined(__i386__)
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/simd_avx2.h"

namespace baton::kernels::cpu {
namespace {

// Bytes of one dimension group of 8 keys: int8's four dimensions, E4M3's two.
constexpr size_t kI8GroupBytes = 8 * 4;
constexpr size_t kE4m3GroupBytes = 8 * 2;

// The scores of R query vectors against the 8 J keys [t0, t0 + 8 J) of an
// int8 K tile: each 32-byte load holds four dimensions of 8 keys, which
// every query vector's four codes meet. The running sums are exact 32-bit
// integers, so one chain per accumulator waits only on VPADDD.
template <int R, int J>
BATON_AVX2_INLINE void i8_scores(SignedQueryCodes q, int32_t d, const char* k, size_t group_stride,
                                 ptrdiff_t scale_delta, int32_t t0, float* s, int32_t s_stride,
                                 PrefetchStream& stream) {
  const int32_t words = d / 4;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[R][J];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) acc[r][j] = _mm256_setzero_si256();
  const char* row = k + size_t(t0) * 4;
  for (int32_t c = 0; c < words; c += 2) {
    stream.consumed(2 * J * kI8GroupBytes);
    for (int32_t u = c; u < c + 2; ++u, row += group_stride) {
      __m256i keys[J];
      for (int j = 0; j < J; ++j)
        keys[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + j * kI8GroupBytes));
      for (int r = 0; r < R; ++r) {
        const __m256i sign = _mm256_set1_epi32(int32_t(q.codes[size_t(r) * words + u]));
        const __m256i magnitude = _mm256_set1_epi32(int32_t(q.magnitudes[size_t(r) * words + u]));
        for (int j = 0; j < J; ++j) {
          const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(keys[j], sign));
          acc[r][j] = _mm256_add_epi32(acc[r][j], _mm256_madd_epi16(pairs, ones));
        }
      }
    }
  }
  for (int j = 0; j < J; ++j) {
    const __m256 key_scales =
        _mm256_loadu_ps(reinterpret_cast<const float*>(k + scale_delta) + t0 + 8 * j);
    for (int r = 0; r < R; ++r) {
      // In the VNNI pass's order: the same products, the same result.
      const __m256 score = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][j]),
                                         _mm256_mul_ps(key_scales, _mm256_set1_ps(q.scales[r])));
      _mm256_storeu_ps(s + size_t(r) * s_stride + t0 + 8 * j, score);
    }
  }
}

template <int R>
BATON_AVX2 void i8_tile_scores(SignedQueryCodes q, int32_t d, const void* k, size_t group_stride,
                               ptrdiff_t scale_delta, int32_t n8, float* s, int32_t s_stride,
                               PrefetchStream& stream) {
  PrefetchStream local = stream;  // a local copy stays in registers
  const char* tile = static_cast<const char*>(k);
  int32_t t = 0;
  for (; t + 16 <= n8; t += 16)
    i8_scores<R, 2>(q, d, tile, group_stride, scale_delta, t, s, s_stride, local);
  for (; t < n8; t += 8)
    i8_scores<R, 1>(q, d, tile, group_stride, scale_delta, t, s, s_stride, local);
  stream = local;
}

// The scores of R query vectors against the 8 keys [t0, t0 + 8) of an E4M3
// K tile: each pair of dimensions of 8 keys is widened once and meets every
// query vector's pair, broadcast, so each lane sums one dimension of a key
// (even or odd) and a horizontal add joins them. Fewer than 8 query rows'
// chains (R x 2 halves) leave the FMA units waiting on their latency, so
// small R rotates consecutive pairs over P sets of accumulators.
template <int R>
BATON_AVX2_INLINE void e4m3_scores(const float* q, int32_t d, const char* k, size_t group_stride,
                                   ptrdiff_t scale_delta, int32_t t0, float* s, int32_t s_stride,
                                   PrefetchStream& stream) {
  constexpr int P = R <= 2 ? 2 : 1;
  __m256 acc[R][2][P];
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < P; ++x) acc[r][0][x] = acc[r][1][x] = _mm256_setzero_ps();
  const char* row = k + size_t(t0) * 2;
  const int32_t pairs = d / 2;
  for (int32_t c = 0; c < pairs; c += 4) {
    stream.consumed(4 * kE4m3GroupBytes);
    for (int32_t u = c; u < c + 4; u += P)
      for (int x = 0; x < P; ++x, row += group_stride) {
        // Keys 0-3 in lo, 4-7 in hi, each key's pair side by side.
        __m256 lo, hi;
        avx2::widen16_e4m3(row, lo, hi);
        for (int r = 0; r < R; ++r) {
          const __m256 pair = _mm256_castpd_ps(_mm256_broadcast_sd(
              reinterpret_cast<const double*>(q + size_t(r) * d + 2 * (u + x))));
          acc[r][0][x] = _mm256_fmadd_ps(pair, lo, acc[r][0][x]);
          acc[r][1][x] = _mm256_fmadd_ps(pair, hi, acc[r][1][x]);
        }
      }
  }
  // The codes' 2^-8 comes back with the scales.
  const __m256 key_scales =
      _mm256_mul_ps(_mm256_loadu_ps(reinterpret_cast<const float*>(k + scale_delta) + t0),
                    _mm256_set1_ps(256.0f));
  for (int r = 0; r < R; ++r) {
    __m256 lo = acc[r][0][0], hi = acc[r][1][0];
    for (int x = 1; x < P; ++x) {
      lo = _mm256_add_ps(lo, acc[r][0][x]);
      hi = _mm256_add_ps(hi, acc[r][1][x]);
    }
    // Keys 0, 1, 4, 5, 2, 3, 6, 7: the middle two 64-bit lanes swap.
    const __m256 sums = _mm256_hadd_ps(lo, hi);
    const __m256 ordered =
        _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(sums), 0b11011000));
    _mm256_storeu_ps(s + size_t(r) * s_stride + t0, _mm256_mul_ps(ordered, key_scales));
  }
}

template <int R>
BATON_AVX2 void e4m3_tile_scores(const float* q, int32_t d, const void* k, size_t group_stride,
                                 ptrdiff_t scale_delta, int32_t n8, float* s, int32_t s_stride,
                                 PrefetchStream& stream) {
  PrefetchStream local = stream;
  const char* tile = static_cast<const char*>(k);
  for (int32_t t = 0; t < n8; t += 8)
    e4m3_scores<R>(q, d, tile, group_stride, scale_delta, t, s, s_stride, local);
  stream = local;
}

}  // namespace

BATON_AVX2 void signed_query_codes(const uint32_t* words, size_t n, uint32_t* codes,
                                   uint32_t* magnitudes) {
  const __m256i bias = _mm256_set1_epi8(int8_t(0x80));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + i));
    const __m256i signed_codes = _mm256_xor_si256(w, bias);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), signed_codes);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(magnitudes + i), _mm256_abs_epi8(signed_codes));
  }
  for (; i < n; ++i) {
    const __m128i w = _mm_cvtsi32_si128(int32_t(words[i] ^ 0x80808080u));
    codes[i] = uint32_t(_mm_cvtsi128_si32(w));
    magnitudes[i] = uint32_t(_mm_cvtsi128_si32(_mm_abs_epi8(w)));
  }
}

void key_tile_scores_i8_avx2(int32_t queries, SignedQueryCodes q, int32_t d, const void* k,
                             size_t group_stride, ptrdiff_t scale_delta, int32_t n8, float* s,
                             int32_t s_stride, PrefetchStream& stream) {
  with_queries<4>(queries, [&]<int R>() {
    i8_tile_scores<R>(q, d, k, group_stride, scale_delta, n8, s, s_stride, stream);
  });
}

void key_tile_scores_e4m3_avx2(int32_t queries, const float* q, int32_t d, const void* k,
                               size_t group_stride, ptrdiff_t scale_delta, int32_t n8, float* s,
                               int32_t s_stride, PrefetchStream& stream) {
  with_queries<4>(queries, [&]<int R>() {
    e4m3_tile_scores<R>(q, d, k, group_stride, scale_delta, n8, s, s_stride, stream);
  });
}

}  // namespace baton::kernels::cpu

#endif
