#include "kernels/cpu/attention_block.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention_block_avx512.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/decode_tiles_avx512.h"
#include "kernels/cpu/key_tile_scores.h"
#include "kernels/cpu/simd_avx2.h"

namespace baton::kernels::cpu {
namespace {

// Online-softmax bookkeeping for one query: turns its raw scores into
// probabilities relative to the new running max, returns the factor by which
// the old accumulator must shrink.
float softmax_update_scalar(float* s, int32_t visible, int32_t keys, float* row_max,
                            float* row_sum) {
  if (visible <= 0) {
    std::fill(s, s + keys, 0.0f);
    return 1.0f;
  }
  float block_max = kNegInf;
  for (int32_t t = 0; t < visible; ++t) block_max = std::max(block_max, s[t]);
  const float new_max = std::max(*row_max, block_max);
  // Once the running max settles (most blocks), skip the exp.
  const float alpha = new_max == *row_max
                          ? 1.0f
                          : std::exp(*row_max - new_max);  // exp(-inf) = 0 on the first block
  float sum = 0.0f;
  for (int32_t t = 0; t < visible; ++t) {
    s[t] = std::exp(s[t] - new_max);
    sum += s[t];
  }
  std::fill(s + visible, s + keys, 0.0f);
  *row_max = new_max;
  *row_sum = *row_sum * alpha + sum;
  return alpha;
}

void attend_block_scalar(const AttentionBlockArgs& a) {
  const int32_t d = a.head_dim;
  const float* k = static_cast<const float*>(a.k);  // F32 only here: one dimension per group
  const float* v = static_cast<const float*>(a.v);
  int32_t max_visible = 0;
  for (int32_t i = 0; i < a.n_q; ++i) {
    const float* qi = a.q + size_t(i) * d;
    float* s = a.scores + size_t(i) * a.keys_padded;
    const int32_t visible = std::min(a.visible[i], a.keys_padded);
    max_visible = std::max(max_visible, visible);
    for (int32_t t = 0; t < visible; ++t) {
      float dot = 0.0f;
      for (int32_t c = 0; c < d; ++c) dot += qi[c] * k[size_t(c) * a.k_group_stride + size_t(t)];
      s[t] = dot;
    }
    const int32_t seen = a.hidden ? mask_before_window(s, a.hidden[i], visible) : visible;
    a.alpha[i] = softmax_update_scalar(s, seen, a.keys_padded, a.row_max + i, a.row_sum + i);
  }
  for (int32_t i = 0; i < a.n_q; ++i) {
    float* acc = a.acc + size_t(i) * d;
    const float* p = a.scores + size_t(i) * a.keys_padded;
    for (int32_t c = 0; c < d; ++c) acc[c] *= a.alpha[i];
    for (int32_t t = 0; t < max_visible; ++t) {
      if (p[t] == 0.0f) continue;
      const float* vt = v + size_t(t) * d;
      for (int32_t c = 0; c < d; ++c) acc[c] += p[t] * vt[c];
    }
  }
}

#if BATON_HAVE_X86

// Eight K/V elements starting at element i of a tile, as floats.
template <DType T>
BATON_AVX2_INLINE __m256 load8_kv(const void* base, size_t i) {
  if constexpr (T == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  } else if constexpr (T == DType::kBF16) {
    return avx2::load8_bf16(static_cast<const uint16_t*>(base) + i);
  } else {
    return avx2::load8_f16(static_cast<const uint16_t*>(base) + i);
  }
}

// acc[r] = acc[r] * alpha[r] + Σ_t p[r][t] · v[t] for R queries and C chunks of
// 8 dimensions at once: each V load serves R queries, and R x C independent
// accumulators hide the FMA latency (one chain per accumulator would stall).
template <DType T, int R, int C>
BATON_AVX2_INLINE void pv_chunk_avx2(const float* p, int32_t p_stride, const float* alpha,
                                     const void* v, int32_t d, int32_t keys, int32_t c0,
                                     float* acc) {
  __m256 a[R][C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j)
      a[r][j] = _mm256_mul_ps(_mm256_loadu_ps(acc + size_t(r) * d + c0 + 8 * j),
                              _mm256_set1_ps(alpha[r]));
  // R broadcasts + R x C accumulators + one V vector fit in 16 registers
  // (holding all C V vectors at once would spill for R = 3, C = 4).
  for (int32_t t = 0; t < keys; ++t) {
    __m256 pr[R];
    for (int r = 0; r < R; ++r) pr[r] = _mm256_broadcast_ss(p + size_t(r) * p_stride + t);
    for (int j = 0; j < C; ++j) {
      const __m256 vt = load8_kv<T>(v, size_t(t) * d + c0 + 8 * j);
      for (int r = 0; r < R; ++r) a[r][j] = _mm256_fmadd_ps(pr[r], vt, a[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) _mm256_storeu_ps(acc + size_t(r) * d + c0 + 8 * j, a[r][j]);
}

// Scores of R (1..3) query vectors against keys [0, n8) of a K tile, 16 keys
// at a time where they are, each query element broadcast once for both
// groups of 8 keys. A block step's tile is computed, not read from memory,
// so the loads and broadcasts per FMA set its rate: 3 queries x 16 keys take
// one broadcast per two FMAs, where key_tile_scores' 4 x 8 (tuned for
// decode, which waits on memory) take one per FMA.
template <DType T, int R>
BATON_AVX2 void block_key_scores(const float* q, int32_t d, const void* k, size_t group_stride,
                                 int32_t n8, float* s, int32_t s_stride) {
  static_assert(R >= 1 && R <= 3);
  constexpr int g = key_group_of(T);
  NoPrefetch none;
  int32_t t = 0;
  if constexpr (g == 1) {
    // Two accumulators per (query, 8 keys), alternating over dimensions,
    // keep 12 FMA chains for R = 3; with the two key rows and a broadcast
    // they fill 15 registers.
    constexpr int S = 2;
    for (; t + 16 <= n8; t += 16) {
      __m256 acc[R][2][S];
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < 2; ++j)
          for (int x = 0; x < S; ++x) acc[r][j][x] = _mm256_setzero_ps();
      size_t row = size_t(t);
      for (int32_t c = 0; c < d; c += S)
        for (int u = 0; u < S; ++u, row += group_stride) {
          const __m256 k0 = load_key_dim8<T, 0>(k, row);
          const __m256 k1 = load_key_dim8<T, 0>(k, row + 8);
          for (int r = 0; r < R; ++r) {
            const __m256 b = _mm256_broadcast_ss(q + size_t(r) * d + c + u);
            acc[r][0][u] = _mm256_fmadd_ps(b, k0, acc[r][0][u]);
            acc[r][1][u] = _mm256_fmadd_ps(b, k1, acc[r][1][u]);
          }
        }
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < 2; ++j)
          _mm256_storeu_ps(s + size_t(r) * s_stride + t + 8 * j,
                           _mm256_add_ps(acc[r][j][0], acc[r][j][1]));
    }
  } else {
    // BF16's passes of 16 keys share their broadcasts already.
    for (; t + 16 <= n8; t += 16)
      key_scores_pass<T, R, 2>(q, d, k, group_stride, t, s, s_stride, none);
  }
  for (; t < n8; t += 8) key_scores_pass<T, R, 1>(q, d, k, group_stride, t, s, s_stride, none);
}

// C chunks per pass such that R x C accumulators plus C V registers fit in 16.
template <DType T, int R>
BATON_AVX2 void pv_avx2(const float* p, int32_t p_stride, const float* alpha, const void* v,
                        int32_t d, int32_t keys, float* acc) {
  constexpr int C = R <= 3 ? 4 : 2;
  int32_t c = 0;
  for (; c + 8 * C <= d; c += 8 * C) pv_chunk_avx2<T, R, C>(p, p_stride, alpha, v, d, keys, c, acc);
  for (; c < d; c += 8) pv_chunk_avx2<T, R, 1>(p, p_stride, alpha, v, d, keys, c, acc);
}

// The scores and V steps with 512-bit FMAs where the CPU has AVX-512
// (decode_tiles_avx512.h, attention_block_avx512.h), else with AVX2.
template <DType T>
BATON_AVX2 void attend_block_avx2(const AttentionBlockArgs& a) {
  const int32_t d = a.head_dim;
  const bool avx512 = use_avx512() && d % 16 == 0;
  int32_t max_visible = 0;
  // A few query vectors at a time over the keys any of them sees, so each
  // loaded K row serves them all: up to four with AVX-512, three with AVX2
  // (block_key_scores).
  const auto scores = [&]<int R>(int32_t i) {
    int32_t visible = 0;
    for (int32_t j = i; j < i + R; ++j) visible = std::max(visible, a.visible[j]);
    const int32_t keys = (std::min(visible, a.keys_padded) + 7) & ~7;
    const float* q = a.q + size_t(i) * d;
    float* s = a.scores + size_t(i) * a.keys_padded;
    if constexpr (R <= 3) {
      if (!avx512)
        return block_key_scores<T, R>(q, d, a.k, a.k_group_stride, keys, s, a.keys_padded);
    }
    key_tile_scores_avx512(T, R, q, d, a.k, a.k_group_stride, keys, s, a.keys_padded);
  };
  if (avx512) {
    for_query_groups(a.n_q, scores);
  } else {
    for_query_groups<3>(a.n_q, scores);
  }
  for (int32_t i = 0; i < a.n_q; ++i) {
    float* s = a.scores + size_t(i) * a.keys_padded;
    int32_t visible = std::min(a.visible[i], a.keys_padded);
    if (a.hidden) visible = mask_before_window(s, a.hidden[i], visible);
    max_visible = std::max(max_visible, visible);
    a.alpha[i] = softmax_update_avx2(s, visible, a.keys_padded, a.row_max + i, a.row_sum + i);
  }
  // AVX2 takes three query vectors at a time: their four 8-dimension
  // chunks each share every V load, one broadcast per four FMAs (pv_avx2).
  const int32_t row_group = avx512 ? 4 : 3;
  int32_t i = 0;
  for (; i < a.n_q; i += row_group) {
    const int32_t rows = std::min(row_group, a.n_q - i);
    const float* p = a.scores + size_t(i) * a.keys_padded;
    float* acc = a.acc + size_t(i) * d;
    if (avx512) {
      block_pv_avx512(T, rows, p, a.keys_padded, a.alpha + i, a.v, d, max_visible, acc);
      continue;
    }
    if (rows == 4) pv_avx2<T, 4>(p, a.keys_padded, a.alpha + i, a.v, d, max_visible, acc);
    if (rows == 3) pv_avx2<T, 3>(p, a.keys_padded, a.alpha + i, a.v, d, max_visible, acc);
    if (rows == 2) pv_avx2<T, 2>(p, a.keys_padded, a.alpha + i, a.v, d, max_visible, acc);
    if (rows == 1) pv_avx2<T, 1>(p, a.keys_padded, a.alpha + i, a.v, d, max_visible, acc);
  }
}

#endif  // BATON_HAVE_X86

}  // namespace

#if BATON_HAVE_X86
BATON_AVX2 float softmax_update_avx2(float* s, int32_t visible, int32_t keys, float* row_max,
                                     float* row_sum) {
  if (visible <= 0) {
    for (int32_t t = 0; t < keys; t += 8) _mm256_storeu_ps(s + t, _mm256_setzero_ps());
    return 1.0f;
  }
  // Whole vectors two at a time (two chains each for the max and the sum);
  // lanes of the last vector at or past `visible` are masked to -inf for the
  // max and to 0 after exp.
  const int32_t whole = visible / 8 * 8;
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 tail_mask =
      _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(visible - whole), lane));
  __m256 max0 = _mm256_set1_ps(kNegInf), max1 = max0;
  int32_t t = 0;
  for (; t + 16 <= whole; t += 16) {
    max0 = _mm256_max_ps(max0, _mm256_loadu_ps(s + t));
    max1 = _mm256_max_ps(max1, _mm256_loadu_ps(s + t + 8));
  }
  if (t < whole) max0 = _mm256_max_ps(max0, _mm256_loadu_ps(s + t));
  if (whole < visible)
    max1 = _mm256_max_ps(
        max1, _mm256_blendv_ps(_mm256_set1_ps(kNegInf), _mm256_loadu_ps(s + whole), tail_mask));
  const __m256 vmax = _mm256_max_ps(max0, max1);
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float new_max = std::max(*row_max, _mm_cvtss_f32(m4));
  // Once the running max settles (most blocks), skip the exp.
  const float alpha = new_max == *row_max ? 1.0f : std::exp(*row_max - new_max);
  const __m256 vnew = _mm256_set1_ps(new_max);
  __m256 sum0 = _mm256_setzero_ps(), sum1 = sum0;
  for (t = 0; t + 16 <= whole; t += 16) {
    const __m256 p0 = avx2::exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), vnew));
    const __m256 p1 = avx2::exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t + 8), vnew));
    _mm256_storeu_ps(s + t, p0);
    _mm256_storeu_ps(s + t + 8, p1);
    sum0 = _mm256_add_ps(sum0, p0);
    sum1 = _mm256_add_ps(sum1, p1);
  }
  if (t < whole) {
    const __m256 p0 = avx2::exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), vnew));
    _mm256_storeu_ps(s + t, p0);
    sum0 = _mm256_add_ps(sum0, p0);
    t += 8;
  }
  if (whole < visible) {
    const __m256 p =
        _mm256_and_ps(avx2::exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), vnew)), tail_mask);
    _mm256_storeu_ps(s + t, p);
    sum1 = _mm256_add_ps(sum1, p);
    t += 8;
  }
  for (; t < keys; t += 8) _mm256_storeu_ps(s + t, _mm256_setzero_ps());
  const __m256 vsum = _mm256_add_ps(sum0, sum1);
  *row_max = new_max;
  *row_sum = *row_sum * alpha + avx2::hsum(vsum);
  return alpha;
}
#endif

bool attend_block_reads_pool(int32_t head_dim, int32_t block_size, DType kv_dtype) {
#if BATON_HAVE_X86
  // The score pass reads K rows 8 keys at a time and 8 dimensions a step.
  // 8-bit codes mean nothing without their rows' scales.
  return use_avx2() && head_dim % 8 == 0 && block_size % 8 == 0 && !is_quantized(kv_dtype);
#else
  (void)head_dim;
  (void)block_size;
  (void)kv_dtype;
  return false;
#endif
}

void attend_block(const AttentionBlockArgs& a) {
#if BATON_HAVE_X86
  if (use_avx2() && a.head_dim % 8 == 0 && a.keys_padded % 8 == 0) {
    switch (a.kv_dtype) {
      case DType::kF32:
        return attend_block_avx2<DType::kF32>(a);
      case DType::kF16:
        return attend_block_avx2<DType::kF16>(a);
      case DType::kBF16:
        return attend_block_avx2<DType::kBF16>(a);
      case DType::kI8:
      case DType::kFP8E4M3:
        break;  // callers dequantize them to F32 tiles
    }
  }
#endif
  attend_block_scalar(a);  // callers pass F32 tiles whenever this path can be taken
}

}  // namespace baton::kernels::cpu
