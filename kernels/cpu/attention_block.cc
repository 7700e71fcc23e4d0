#include "kernels/cpu/attention_block.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/simd_avx2.h"

namespace baton::kernels::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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
  const float alpha = std::exp(*row_max - new_max);  // exp(-inf) = 0 on the first block
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
  int32_t max_visible = 0;
  for (int32_t i = 0; i < a.n_q; ++i) {
    const float* qi = a.q + size_t(i) * d;
    float* s = a.scores + size_t(i) * a.keys_padded;
    const int32_t visible = std::min(a.visible[i], a.keys_padded);
    max_visible = std::max(max_visible, visible);
    for (int32_t t = 0; t < visible; ++t) {
      const float* kt = a.k + size_t(t) * d;
      float dot = 0.0f;
      for (int32_t c = 0; c < d; ++c) dot += qi[c] * kt[c];
      s[t] = dot;
    }
    a.alpha[i] = softmax_update_scalar(s, visible, a.keys_padded, a.row_max + i, a.row_sum + i);
  }
  for (int32_t i = 0; i < a.n_q; ++i) {
    float* acc = a.acc + size_t(i) * d;
    const float* p = a.scores + size_t(i) * a.keys_padded;
    for (int32_t c = 0; c < d; ++c) acc[c] *= a.alpha[i];
    for (int32_t t = 0; t < max_visible; ++t) {
      if (p[t] == 0.0f) continue;
      const float* vt = a.v + size_t(t) * d;
      for (int32_t c = 0; c < d; ++c) acc[c] += p[t] * vt[c];
    }
  }
}

#if BATON_HAVE_X86

// Scores of one query against keys [0, keys) (keys a multiple of 8), eight
// keys at a time so one transposing horizontal sum yields eight scores.
BATON_AVX2 void scores_avx2(const float* q, const float* k, int32_t d, int32_t keys, float* s) {
  for (int32_t t0 = 0; t0 < keys; t0 += 8) {
    __m256 acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
    const float* kt = k + size_t(t0) * d;
    for (int32_t c = 0; c < d; c += 8) {
      __m256 qv = _mm256_loadu_ps(q + c);
      for (int j = 0; j < 8; ++j)
        acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kt + size_t(j) * d + c), acc[j]);
    }
    _mm256_storeu_ps(s + t0, avx2::hsum8x8(acc));
  }
}

BATON_AVX2 float softmax_update_avx2(float* s, int32_t visible, int32_t keys, float* row_max,
                                     float* row_sum) {
  if (visible <= 0) {
    for (int32_t t = 0; t < keys; t += 8) _mm256_storeu_ps(s + t, _mm256_setzero_ps());
    return 1.0f;
  }
  // Lanes at or past `visible` are masked to -inf for the max and 0 after exp.
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 vmax = _mm256_set1_ps(kNegInf);
  for (int32_t t = 0; t < visible; t += 8) {
    __m256 mask = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(visible - t), lane));
    vmax = _mm256_max_ps(vmax,
                         _mm256_blendv_ps(_mm256_set1_ps(kNegInf), _mm256_loadu_ps(s + t), mask));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float new_max = std::max(*row_max, _mm_cvtss_f32(m4));
  const float alpha = std::exp(*row_max - new_max);
  const __m256 vnew = _mm256_set1_ps(new_max);
  __m256 vsum = _mm256_setzero_ps();
  int32_t t = 0;
  for (; t < visible; t += 8) {
    __m256 mask = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(visible - t), lane));
    __m256 p = _mm256_and_ps(avx2::exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), vnew)), mask);
    _mm256_storeu_ps(s + t, p);
    vsum = _mm256_add_ps(vsum, p);
  }
  for (; t < keys; t += 8) _mm256_storeu_ps(s + t, _mm256_setzero_ps());
  *row_max = new_max;
  *row_sum = *row_sum * alpha + avx2::hsum(vsum);
  return alpha;
}

// acc[r] = acc[r] * alpha[r] + Σ_t p[r][t] · v[t] for R queries at once, so each
// V vector loaded serves R queries.
template <int R>
BATON_AVX2 void pv_avx2(const float* p, int32_t p_stride, const float* alpha, const float* v,
                        int32_t d, int32_t keys, float* acc) {
  for (int32_t c = 0; c < d; c += 8) {
    __m256 a[R];
    for (int r = 0; r < R; ++r)
      a[r] = _mm256_mul_ps(_mm256_loadu_ps(acc + size_t(r) * d + c), _mm256_set1_ps(alpha[r]));
    for (int32_t t = 0; t < keys; ++t) {
      __m256 vt = _mm256_loadu_ps(v + size_t(t) * d + c);
      for (int r = 0; r < R; ++r)
        a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + size_t(r) * p_stride + t), vt, a[r]);
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(acc + size_t(r) * d + c, a[r]);
  }
}

BATON_AVX2 void attend_block_avx2(const AttentionBlockArgs& a) {
  const int32_t d = a.head_dim;
  int32_t max_visible = 0;
  for (int32_t i = 0; i < a.n_q; ++i) {
    float* s = a.scores + size_t(i) * a.keys_padded;
    const int32_t visible = std::min(a.visible[i], a.keys_padded);
    max_visible = std::max(max_visible, visible);
    const int32_t keys = (visible + 7) & ~7;
    scores_avx2(a.q + size_t(i) * d, a.k, d, keys, s);
    a.alpha[i] = softmax_update_avx2(s, visible, a.keys_padded, a.row_max + i, a.row_sum + i);
  }
  constexpr int kRows = 4;
  int32_t i = 0;
  for (; i + kRows <= a.n_q; i += kRows)
    pv_avx2<kRows>(a.scores + size_t(i) * a.keys_padded, a.keys_padded, a.alpha + i, a.v, d,
                   max_visible, a.acc + size_t(i) * d);
  const int32_t rest = a.n_q - i;
  const float* p = a.scores + size_t(i) * a.keys_padded;
  float* acc = a.acc + size_t(i) * d;
  if (rest == 3) pv_avx2<3>(p, a.keys_padded, a.alpha + i, a.v, d, max_visible, acc);
  if (rest == 2) pv_avx2<2>(p, a.keys_padded, a.alpha + i, a.v, d, max_visible, acc);
  if (rest == 1) pv_avx2<1>(p, a.keys_padded, a.alpha + i, a.v, d, max_visible, acc);
}

#endif  // BATON_HAVE_X86

}  // namespace

void attend_block(const AttentionBlockArgs& a) {
#if BATON_HAVE_X86
  if (use_avx2() && a.head_dim % 8 == 0 && a.keys_padded % 8 == 0) {
    attend_block_avx2(a);
    return;
  }
#endif
  attend_block_scalar(a);
}

}  // namespace baton::kernels::cpu
