#include "kernels/cpu/attention_decode_avx512.h"

#if defined(__x86_64__) || defined(__i386__)
// GCC 12's AVX-512 intrinsics pass an undefined vector as the merge source of
// their unmasked forms, which -Wmaybe-uninitialized reports wherever they are
// inlined (a known false positive; softmax_split_bf16 also needs
// -Wuninitialized off for the _mm512_reduce_* macros).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/simd_avx512.h"

namespace baton::kernels::cpu {
namespace {

// Both BF16 values of keys t and t + 1 as one 32-bit pair in every lane.
BATON_AVX512_BF16_INLINE __m512bh broadcast_pair(const uint16_t* p) {
  int32_t pair;
  std::memcpy(&pair, p, sizeof(pair));
  return (__m512bh)_mm512_set1_epi32(pair);
}

// One pair of keys (y_row null: a last key without a partner, whose pair is
// taken with zeros) into columns [c0, c0 + 32 C) of R accumulators. `lo`
// receives the products with the probabilities' low halves: `hi`'s own
// accumulators, or a second set where registers allow, so the two dot
// products of a lane do not wait on each other.
template <int R, int C>
BATON_AVX512_BF16_INLINE void pv_key_pair(const uint16_t* p_hi, const uint16_t* p_lo,
                                          int32_t p_stride, const uint16_t* x_row,
                                          const uint16_t* y_row, __m512 (&hi)[R][2 * C],
                                          __m512 (&lo)[R][2 * C]) {
  __m512bh ph[R], pl[R];
  for (int r = 0; r < R; ++r) {
    ph[r] = broadcast_pair(p_hi + size_t(r) * p_stride);
    pl[r] = broadcast_pair(p_lo + size_t(r) * p_stride);
  }
  for (int j = 0; j < C; ++j) {
    const __m512i x = _mm512_loadu_si512(x_row + kPvAvx512Columns * j);
    const __m512i y =
        y_row ? _mm512_loadu_si512(y_row + kPvAvx512Columns * j) : _mm512_setzero_si512();
    // Lane k of `first` pairs column (k / 4) * 8 + k % 4 of the two keys,
    // `second` the column four further (pv_avx512_slot).
    const __m512bh first = (__m512bh)_mm512_unpacklo_epi16(x, y);
    const __m512bh second = (__m512bh)_mm512_unpackhi_epi16(x, y);
    for (int r = 0; r < R; ++r) {
      hi[r][2 * j] = _mm512_dpbf16_ps(hi[r][2 * j], first, ph[r]);
      lo[r][2 * j] = _mm512_dpbf16_ps(lo[r][2 * j], first, pl[r]);
      hi[r][2 * j + 1] = _mm512_dpbf16_ps(hi[r][2 * j + 1], second, ph[r]);
      lo[r][2 * j + 1] = _mm512_dpbf16_ps(lo[r][2 * j + 1], second, pl[r]);
    }
  }
}

// acc_r[c0, c0 + 32 C) += Σ_t p_r[t] v_t over keys [0, n).
template <int R, int C>
BATON_AVX512_BF16_INLINE void pv_pass(const uint16_t* p_hi, const uint16_t* p_lo, int32_t p_stride,
                                      const uint16_t* v, int32_t d, int32_t n, int32_t c0,
                                      float* acc, PrefetchStream& prefetch) {
  // Accumulators, two broadcasts per query, two rows and their two unpacks
  // in 32 registers: a second set for the low halves fits only for small R x C.
  constexpr bool kSecondSet = R * 4 * C + 2 * R + 4 <= 32;
  __m512 a[R][2 * C], b[R][2 * C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 2 * C; ++j) {
      a[r][j] = _mm512_loadu_ps(acc + size_t(r) * d + c0 + 16 * j);
      b[r][j] = _mm512_setzero_ps();
    }
  auto& low = kSecondSet ? b : a;
  const size_t pair_bytes = 2 * kPvAvx512Columns * C * sizeof(uint16_t);
  int32_t t = 0;
  for (; t + 2 <= n; t += 2) {
    prefetch.consumed(pair_bytes);
    pv_key_pair<R, C>(p_hi + t, p_lo + t, p_stride, v + size_t(t) * d + c0,
                      v + size_t(t + 1) * d + c0, a, low);
  }
  if (t < n) {
    prefetch.consumed(pair_bytes / 2);
    pv_key_pair<R, C>(p_hi + t, p_lo + t, p_stride, v + size_t(t) * d + c0, nullptr, a, low);
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 2 * C; ++j) {
      if constexpr (kSecondSet) a[r][j] = _mm512_add_ps(a[r][j], b[r][j]);
      _mm512_storeu_ps(acc + size_t(r) * d + c0 + 16 * j, a[r][j]);
    }
}

// Passes of as many 32-column chunks as R x 2C accumulators allow, then
// narrower ones for what is left of d.
template <int R>
BATON_AVX512_BF16 void tile_pv(const uint16_t* p_hi, const uint16_t* p_lo, int32_t p_stride,
                               const uint16_t* v, int32_t d, int32_t n, float* acc,
                               PrefetchStream& stream) {
  PrefetchStream prefetch = stream;  // a local copy stays in registers
  constexpr int32_t kCols = kPvAvx512Columns;
  int32_t c = 0;
  if constexpr (R < 3)
    for (; c + 4 * kCols <= d; c += 4 * kCols)
      pv_pass<R, 4>(p_hi, p_lo, p_stride, v, d, n, c, acc, prefetch);
  for (; c + 2 * kCols <= d; c += 2 * kCols)
    pv_pass<R, 2>(p_hi, p_lo, p_stride, v, d, n, c, acc, prefetch);
  for (; c < d; c += kCols) pv_pass<R, 1>(p_hi, p_lo, p_stride, v, d, n, c, acc, prefetch);
  stream = prefetch;
}

// hi + lo = x to 16 significant bits, stored under mask m.
BATON_AVX512_BF16_INLINE void store_split(__m512 x, __mmask16 m, uint16_t* hi, uint16_t* lo) {
  const __m256bh h = _mm512_cvtneps_pbh(x);
  // x - float(h) is exact (the two are within a factor of two), and its own
  // rounding to BF16 leaves an error of at most 2^-17 of x.
  const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
  const __m256bh l = _mm512_cvtneps_pbh(_mm512_sub_ps(x, back));
  _mm256_mask_storeu_epi16(hi, m, (__m256i)h);
  _mm256_mask_storeu_epi16(lo, m, (__m256i)l);
}

}  // namespace

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
BATON_AVX512_BF16 void softmax_split_bf16(const float* s, int32_t visible, int32_t n,
                                          float* row_max, float* row_sum, uint16_t* hi,
                                          uint16_t* lo) {
  visible = std::min(visible, n);
  const float max = avx512::max_of(s, visible);
  *row_max = max;
  const __m512 vmax = _mm512_set1_ps(visible > 0 ? max : 0.0f);
  __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
  int32_t t = 0;
  for (; t + 32 <= visible; t += 32) {
    const __m512 p0 = avx512::exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + t), vmax));
    const __m512 p1 = avx512::exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + t + 16), vmax));
    store_split(p0, 0xffff, hi + t, lo + t);
    store_split(p1, 0xffff, hi + t + 16, lo + t + 16);
    sum0 = _mm512_add_ps(sum0, p0);
    sum1 = _mm512_add_ps(sum1, p1);
  }
  // The rest of the visible keys (masked), then zeros up to n.
  for (; t < n; t += 16) {
    const __mmask16 m = avx512::first_lanes(visible - t);
    const __m512 p = _mm512_maskz_mov_ps(
        m, avx512::exp16_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + t), vmax)));
    store_split(p, avx512::first_lanes(n - t), hi + t, lo + t);
    sum0 = _mm512_add_ps(sum0, p);
  }
  *row_sum = _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
}
#pragma GCC diagnostic pop

void tile_pv_bf16_avx512(int32_t queries, const uint16_t* p_hi, const uint16_t* p_lo,
                         int32_t p_stride, const void* v, int32_t d, int32_t n, float* acc,
                         PrefetchStream& stream) {
  with_queries<kAvx512MaxQueries>(queries, [&]<int R>() {
    tile_pv<R>(p_hi, p_lo, p_stride, static_cast<const uint16_t*>(v), d, n, acc, stream);
  });
}

}  // namespace baton::kernels::cpu

#endif
