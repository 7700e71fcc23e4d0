// kernels/cpu/key_tile_scores.h — the scores of a few query vectors against
// the keys of one K tile as the pool stores it (common/kv_layout.h): keys side
// by side, one dimension of each at a time (a pair for BF16). Decode attention
// (attention_decode.cc) and the block step of prefill attention (attention_block.cc) both use it.
//
// One load of a tile row holds the same dimension of 8 keys: F32 as it is,
// F16 converted (F16C), or a BF16 pair widened by a shift and a mask. Each
// is multiplied by that dimension of the query, broadcast, with keys across
// the lanes, so the accumulators are the scores themselves: no horizontal
// sums, and no query chunk held in registers across keys.
#pragma once

#include "kernels/cpu/simd_avx2.h"

#if BATON_HAVE_X86

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/kv_layout.h"

namespace baton::kernels::cpu {

// Dimension e of the 8 keys at element `at` of a K tile of dtype T, as
// floats: F32 as it is, F16 converted (F16C), or half e of a BF16 pair (the
// even dimension, e = 0, or the odd one).
template <DType T, int e>
BATON_AVX2_INLINE __m256 load_key_dim8(const void* k, size_t at) {
  if constexpr (T == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(k) + at);
  } else if constexpr (T == DType::kF16) {
    return avx2::load8_f16(static_cast<const uint16_t*>(k) + at);
  } else {
    const __m256i raw =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(k) + at));
    // A BF16 value is the top half of an F32: the even element moves up,
    // the odd one is already there.
    if constexpr (e == 0) return _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
    return _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(int32_t(0xffff0000u))));
  }
}

// acc[r][j][u + e] += q_r[e] k_j[e] for dimension e of one row (a half
// of BF16's pairs) of the J key groups at `row` (8 J keys), R queries (q_r
// at q + r d).
template <DType T, int e, int R, int J, int S>
BATON_AVX2_INLINE void key_dim_fmas(const float* q, int32_t d, const void* k, size_t row, int u,
                                    __m256 (&acc)[R][J][S]) {
  constexpr int g = key_group_of(T);
  if constexpr (g == 2) {
    // BF16: one half of the J key groups at a time, each query element
    // broadcast once for all of them: 12 accumulators, J keys, a broadcast
    // and the mask fill the 16 registers. Broadcast again for every 8 keys,
    // as F32's are below, there were as many broadcasts as FMAs (and in
    // llvm-mca's Zen 3 model a broadcast takes a vector pipe the FMAs use).
    // This holds for J = 2; the 8-key passes (J = 1) still broadcast once
    // per FMA pair. The odd half loads its rows again: GCC would otherwise
    // keep both raw rows for both halves and spill an accumulator.
    if constexpr (e == 1) asm("" : "+r"(k));
    __m256 dim[J];
    for (int j = 0; j < J; ++j) dim[j] = load_key_dim8<T, e>(k, row + 8 * size_t(j) * g);
    for (int r = 0; r < R; ++r) {
      const __m256 b = _mm256_broadcast_ss(q + size_t(r) * d + e);
      for (int j = 0; j < J; ++j) acc[r][j][u + e] = _mm256_fmadd_ps(b, dim[j], acc[r][j][u + e]);
    }
  } else {
    // F32 and F16: one key group at a time, the query elements broadcast
    // again for each. Both groups at once, GCC spilled accumulators.
    for (int j = 0; j < J; ++j) {
      const __m256 dim = load_key_dim8<T, e>(k, row + 8 * size_t(j));
      // Keeps GCC from reusing the broadcasts of the first 8 keys, which
      // spills accumulators.
      asm volatile("" : "+r"(q));
      for (int r = 0; r < R; ++r)
        acc[r][j][u] = _mm256_fmadd_ps(_mm256_broadcast_ss(q + size_t(r) * d), dim, acc[r][j][u]);
    }
  }
}

// s[r * s_stride + t] = q_r · k_t for R query vectors (q_r at q + r d, in
// element order) and the 8 J keys [t0, t0 + 8 J) of a K tile k: dimension
// group c of key t at element c * group_stride + t * g (g = key_group_of(T)).
// stream.consumed(bytes) is told of the tile's bytes as they are read, 8
// dimensions at a time.
template <DType T, int R, int J, typename Stream>
BATON_AVX2_INLINE void key_scores_pass(const float* q, int32_t d, const void* k,
                                       size_t group_stride, int32_t t0, float* s, int32_t s_stride,
                                       Stream& stream) {
  constexpr int g = key_group_of(T);
  // Independent accumulators per (query, 8 keys): two FMA units with four
  // cycles of latency keep 8 chains busy, and 16 registers hold no more than
  // 12 beside the keys and a broadcast. Consecutive dimensions rotate over
  // them.
  constexpr int S = R * J * 4 <= 12 ? 4 : 2;
  static_assert(S % g == 0 && R * J * S <= 12);
  __m256 acc[R][J][S];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j)
      for (int x = 0; x < S; ++x) acc[r][j][x] = _mm256_setzero_ps();
  // The stream is told once per 8 dimensions: once per row measured
  // slower, its bookkeeping taking registers from the inner loop.
  // Element of the row of dimension group (c + u) / g: one group_stride
  // further per group (KvLayout::key_dim_offset), added rather than
  // multiplied, as the multiply took a port the FMAs use.
  size_t row = size_t(t0) * g;
  for (int32_t c8 = 0; c8 < d; c8 += 8) {
    stream.consumed(size_t(8 * J) * 8 * dtype_size(T));
    for (int32_t c = c8; c < c8 + 8; c += S)
      for (int u = 0; u < S; u += g, row += group_stride) {
        key_dim_fmas<T, 0, R, J, S>(q + c + u, d, k, row, u, acc);
        if constexpr (g == 2) key_dim_fmas<T, 1, R, J, S>(q + c + u, d, k, row, u, acc);
      }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) {
      __m256 sum = acc[r][j][0];
      for (int x = 1; x < S; ++x) sum = _mm256_add_ps(sum, acc[r][j][x]);
      _mm256_storeu_ps(s + size_t(r) * s_stride + t0 + 8 * j, sum);
    }
}

// The scores of R (1..4) query vectors against keys [0, n8) of a K tile,
// n8 and d multiples of 8: 16 keys at a time, then 8 (four queries: 8 at a
// time). Keys in [n8, ...) are not read; the caller masks keys in the
// tile's last 8 that lie past the context (their slots may hold anything). The reads advance
// `stream` (a PrefetchStream, or NoPrefetch) as they go.
//
// Not always inlined: the callers call it from lambdas, which carry no
// target attribute of their own.
template <DType T, int R, typename Stream>
BATON_AVX2 void key_tile_scores(const float* q, int32_t d, const void* k, size_t group_stride,
                                int32_t n8, float* s, int32_t s_stride, Stream& stream) {
  static_assert(R >= 1 && R <= 4);
  Stream local = stream;  // a local copy stays in registers
  int32_t t = 0;
  // Four queries fill 8 accumulators with 8 keys at a time.
  if constexpr (R < 4)
    for (; t + 16 <= n8; t += 16)
      key_scores_pass<T, R, 2>(q, d, k, group_stride, t, s, s_stride, local);
  for (; t < n8; t += 8) key_scores_pass<T, R, 1>(q, d, k, group_stride, t, s, s_stride, local);
  stream = local;
}

// The stream of a pass that prefetches nothing.
struct NoPrefetch {
  void consumed(size_t) {}
};

// The most query vectors one call of the AVX2 tile passes serves: their
// accumulators fill the registers.
inline constexpr int32_t kMaxQueryGroup = 4;

// Groups of at most kMax query vectors that n of them are taken in: as few
// as can be, of sizes as even as can be (7 as 4 + 3, not 4 + 2 + 1: a
// group of one reads its tiles for a third or a quarter of the work).
template <int32_t kMax>
constexpr int32_t query_groups(int32_t n) {
  return (n + kMax - 1) / kMax;
}

// Applies f<R>(first) to the query vectors [first, first + R) of [0, n), in
// query_groups<kMax>(n) groups.
template <int32_t kMax = kMaxQueryGroup, typename F>
BATON_AVX2_INLINE void for_query_groups(int32_t n, F&& f) {
  static_assert(kMax == 3 || kMax == 4);
  const int32_t groups = query_groups<kMax>(n);
  for (int32_t g = 0, first = 0; g < groups; ++g) {
    // The first n % groups groups take one more.
    const int32_t size = n / groups + (g < n % groups ? 1 : 0);
    switch (size) {
      case 1:
        f.template operator()<1>(first);
        break;
      case 2:
        f.template operator()<2>(first);
        break;
      case 3:
        f.template operator()<3>(first);
        break;
      default:
        if constexpr (kMax == 4) f.template operator()<4>(first);
        break;
    }
    first += size;
  }
}

}  // namespace baton::kernels::cpu

#endif  // BATON_HAVE_X86
