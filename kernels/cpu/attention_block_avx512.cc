#include "kernels/cpu/attention_block_avx512.h"

#if defined(__x86_64__) || defined(__i386__)
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/simd_avx512.h"

namespace baton::kernels::cpu {
namespace {

// Elements [c0, c0 + 16 C) of R queries' outputs: R x C accumulators, each
// V vector loaded once for the R FMAs.
template <DType T, int R, int C>
BATON_AVX512_INLINE void pv_chunk(const float* p, int32_t p_stride, const float* alpha,
                                  const void* v, int32_t d, int32_t keys, int32_t c0, float* acc) {
  __m512 a[R][C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j)
      a[r][j] = _mm512_mul_ps(_mm512_loadu_ps(acc + size_t(r) * d + c0 + 16 * j),
                              _mm512_set1_ps(alpha[r]));
  for (int32_t t = 0; t < keys; ++t) {
    __m512 pr[R];
    for (int r = 0; r < R; ++r) pr[r] = _mm512_set1_ps(p[size_t(r) * p_stride + t]);
    for (int j = 0; j < C; ++j) {
      const __m512 vt = avx512::load16<T>(v, size_t(t) * d + c0 + 16 * j);
      for (int r = 0; r < R; ++r) a[r][j] = _mm512_fmadd_ps(pr[r], vt, a[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) _mm512_storeu_ps(acc + size_t(r) * d + c0 + 16 * j, a[r][j]);
}

// Passes of four 16-element chunks (at most 16 accumulators and 4
// broadcasts), then one-chunk passes for what is left of d.
template <DType T, int R>
BATON_AVX512 void block_pv(const float* p, int32_t p_stride, const float* alpha, const void* v,
                           int32_t d, int32_t keys, float* acc) {
  constexpr int C = 4;
  int32_t c = 0;
  for (; c + 16 * C <= d; c += 16 * C) pv_chunk<T, R, C>(p, p_stride, alpha, v, d, keys, c, acc);
  for (; c < d; c += 16) pv_chunk<T, R, 1>(p, p_stride, alpha, v, d, keys, c, acc);
}

}  // namespace

void block_pv_avx512(DType t, int32_t queries, const float* p, int32_t p_stride, const float* alpha,
                     const void* v, int32_t d, int32_t keys, float* acc) {
  with_dtype(t, [&]<DType T>() {
    with_queries<4>(queries, [&]<int R>() { block_pv<T, R>(p, p_stride, alpha, v, d, keys, acc); });
  });
}

}  // namespace baton::kernels::cpu

#endif
