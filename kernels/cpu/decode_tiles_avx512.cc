#include "kernels/cpu/decode_tiles_avx512.h"

#if defined(__x86_64__) || defined(__i386__)
#include <algorithm>
#include <limits>

#include "common/kv_layout.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/simd_avx512.h"

namespace baton::kernels::cpu {
// The passes' own pieces live in avx512::, apart from the AVX2 passes'
// names (key_tile_scores.h), so one translation unit can hold both (as
// bench/partition_ab's does).
namespace avx512 {
namespace {

// 16 8-bit codes of a V row as floats in units of kv_code_unit(T): int8
// exactly; E4M3 moved into F16 (its sign, exponent and mantissa fields
// shifted into F16's, which holds every E4M3 value times 2^-8 exactly) and
// widened.
template <DType T>
BATON_AVX512_INLINE __m512 widen16_codes(__m128i codes) {
  if constexpr (T == DType::kI8) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes));
  } else {
    static_assert(T == DType::kFP8E4M3);
    // Sign-extended to 16 bits and shifted left by 7, the code's exponent
    // and mantissa land in F16's fields and its sign in F16's sign bit; the
    // sign's copy in bit 14 is cleared.
    const __m256i shifted = _mm256_slli_epi16(_mm256_cvtepi8_epi16(codes), 7);
    return _mm512_cvtph_ps(_mm256_and_si256(shifted, _mm256_set1_epi16(int16_t(0xbfff))));
  }
}

// One K tile row's dimension (a BF16 pair's two) of 16 keys at `row` as
// floats, or of 8 keys (the upper lanes zero) when kHalf.
template <DType T, bool kHalf>
BATON_AVX512_INLINE void load_key_dims(const char* row, __m512 (&dim)[2]) {
  constexpr __mmask16 kLanes = kHalf ? 0x00ff : 0xffff;
  if constexpr (T == DType::kF32) {
    const float* f = reinterpret_cast<const float*>(row);
    dim[0] = kHalf ? _mm512_maskz_loadu_ps(kLanes, f) : _mm512_loadu_ps(f);
  } else if constexpr (T == DType::kF16) {
    dim[0] = _mm512_cvtph_ps(kHalf ? _mm256_maskz_loadu_epi16(kLanes, row)
                                   : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row)));
  } else {
    const __m512i raw = kHalf ? _mm512_maskz_loadu_epi32(kLanes, row) : _mm512_loadu_si512(row);
    // A BF16 value is the top half of an F32: the even element moves up,
    // the odd one is already there.
    dim[0] = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
    dim[1] = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(int32_t(0xffff0000u))));
  }
}

// The scores of R query vectors against J groups of 16 keys (8 keys when
// kHalf, J = 1): group j's dimension group 0 at rows[j], the next groups
// group_bytes apart, its scores at s + 16 j. Each query element is
// broadcast once for the J groups: with one group, the broadcasts (FMA
// memory operands) and the key loads outnumbered the FMAs, and the load
// ports, not the FMA units, set the pace.
template <DType T, int R, int J, bool kHalf, typename Stream>
BATON_AVX512_INLINE void key_scores16(const float* q, int32_t d, const char* const (&rows)[J],
                                      size_t group_bytes, float* s, int32_t s_stride,
                                      Stream& stream) {
  constexpr int g = key_group_of(T);
  // Independent accumulators per query and group: two FMA units with four
  // cycles of latency keep 8 chains busy. Consecutive dimensions rotate
  // over them.
  constexpr int S = R * J >= 4 ? 2 : R * J == 1 ? 8 : 4;
  static_assert(S % g == 0 && 8 % S == 0 && R * J * S <= 16 && (!kHalf || J == 1));
  __m512 acc[R][J][S];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j)
      for (int x = 0; x < S; ++x) acc[r][j][x] = _mm512_setzero_ps();
  constexpr size_t kRowBytes = (kHalf ? 8 : 16) * dtype_size(T);
  const char* row[J];
  for (int j = 0; j < J; ++j) row[j] = rows[j];
  for (int32_t c8 = 0; c8 < d; c8 += 8) {
    stream.consumed(8 * J * kRowBytes);
    for (int32_t c = c8; c < c8 + 8; c += S)
      for (int u = 0; u < S; u += g) {
        __m512 dim[J][2];
        for (int j = 0; j < J; ++j) {
          load_key_dims<T, kHalf>(row[j], dim[j]);
          row[j] += group_bytes;
        }
        for (int r = 0; r < R; ++r)
          for (int e = 0; e < g; ++e) {
            const __m512 qv = _mm512_set1_ps(q[size_t(r) * d + c + u + e]);
            for (int j = 0; j < J; ++j)
              acc[r][j][u + e] = _mm512_fmadd_ps(qv, dim[j][e], acc[r][j][u + e]);
          }
      }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) {
      __m512 sum = acc[r][j][0];
      for (int x = 1; x < S; ++x) sum = _mm512_add_ps(sum, acc[r][j][x]);
      float* out = s + size_t(r) * s_stride + 16 * j;
      if constexpr (kHalf)
        _mm256_storeu_ps(out, _mm512_castps512_ps256(sum));
      else
        _mm512_storeu_ps(out, sum);
    }
}

// p times scales[t, t + 16) in the lanes of m (zero in the others), or p
// where there are no scales.
BATON_AVX512_INLINE __m512 times_scales(__m512 p, const float* scales, int32_t t, __mmask16 m) {
  return scales ? _mm512_mul_ps(p, _mm512_maskz_loadu_ps(m, scales + t)) : p;
}

// The stream of a pass that prefetches nothing (prefill's block step).
struct NoStream {
  void consumed(size_t) {}
};

// Consecutive dimension groups of a K tile lie this many bytes apart.
template <DType T>
size_t group_bytes_of(size_t group_stride) {
  constexpr int g = key_group_of(T);
  return KvLayout::key_dim_offset(g, g, group_stride) * dtype_size(T);
}

template <DType T, int R, typename Stream>
BATON_AVX512 void key_tile_scores(const float* q, int32_t d, const void* k, size_t group_stride,
                                  int32_t n8, float* s, int32_t s_stride, Stream& stream) {
  Stream local = stream;  // a local copy stays in registers
  const size_t group_bytes = group_bytes_of<T>(group_stride);
  const size_t key_bytes = size_t(key_group_of(T)) * dtype_size(T);  // one key in a row
  const char* tile = static_cast<const char*>(k);
  int32_t t = 0;
  for (; t + 32 <= n8; t += 32) {
    const char* const rows[2] = {tile + size_t(t) * key_bytes, tile + size_t(t + 16) * key_bytes};
    key_scores16<T, R, 2, false>(q, d, rows, group_bytes, s + t, s_stride, local);
  }
  for (; t + 16 <= n8; t += 16) {
    const char* const rows[1] = {tile + size_t(t) * key_bytes};
    key_scores16<T, R, 1, false>(q, d, rows, group_bytes, s + t, s_stride, local);
  }
  if (t < n8) {
    const char* const rows[1] = {tile + size_t(t) * key_bytes};
    key_scores16<T, R, 1, true>(q, d, rows, group_bytes, s + t, s_stride, local);
  }
  stream = local;
}

// The scores of R query vectors against the keys [0, keys) of a run of
// 16-key tiles (tiles[j] holds keys [16 j, 16 j + 16)), two tiles at a
// time.
template <DType T, int R>
BATON_AVX512 void key_run_scores(const float* q, int32_t d, const char* const* tiles,
                                 size_t group_stride, int32_t keys, float* s, int32_t s_stride,
                                 PrefetchStream& stream) {
  PrefetchStream local = stream;
  const size_t group_bytes = group_bytes_of<T>(group_stride);
  int32_t t = 0, j = 0;
  for (; t + 32 <= keys; t += 32, j += 2) {
    const char* const rows[2] = {tiles[j], tiles[j + 1]};
    key_scores16<T, R, 2, false>(q, d, rows, group_bytes, s + t, s_stride, local);
  }
  for (; t < keys; t += 16, ++j) {
    // One tile left, or the run's last, partly filled one.
    const char* const rows[1] = {tiles[j]};
    if (t + 16 <= keys)
      key_scores16<T, R, 1, false>(q, d, rows, group_bytes, s + t, s_stride, local);
    else  // qualified: the stream's namespace holds the AVX2 pass of that name
      avx512::key_tile_scores<T, R>(q, d, tiles[j], group_stride, ((keys - t) + 7) / 8 * 8, s + t,
                                    s_stride, local);
  }
  stream = local;
}

// Elements [c, c + 32) of a V row as floats: in order for F32 and F16, the
// even ones then the odd ones for BF16 (tile_pv_avx512_slot).
template <DType T>
BATON_AVX512_INLINE void load_row32(const char* row, int32_t c, __m512& lo, __m512& hi) {
  if constexpr (is_quantized(T)) {
    const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c));
    lo = widen16_codes<T>(_mm256_castsi256_si128(codes));
    hi = widen16_codes<T>(_mm256_extracti128_si256(codes, 1));
  } else if constexpr (T == DType::kF32) {
    const float* f = reinterpret_cast<const float*>(row) + c;
    lo = _mm512_loadu_ps(f);
    hi = _mm512_loadu_ps(f + 16);
  } else if constexpr (T == DType::kF16) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(row) + c;
    lo = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
    hi = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + 16)));
  } else {
    const __m512i raw = _mm512_loadu_si512(reinterpret_cast<const uint16_t*>(row) + c);
    lo = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
    hi = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(int32_t(0xffff0000u))));
  }
}

// a[r][2j], a[r][2j + 1] += p_r[t] · (elements [c0 + 32 j, + 32) of `row`).
template <DType T, int R, int C>
BATON_AVX512_INLINE void pv_key(const float* p, int32_t p_stride, const char* row, int32_t t,
                                int32_t c0, __m512 (&a)[R][2 * C]) {
  __m512 pr[R];
  for (int r = 0; r < R; ++r) pr[r] = _mm512_set1_ps(p[size_t(r) * p_stride + t]);
  for (int j = 0; j < C; ++j) {
    __m512 lo, hi;
    load_row32<T>(row, c0 + kAvx512Columns * j, lo, hi);
    for (int r = 0; r < R; ++r) {
      a[r][2 * j] = _mm512_fmadd_ps(pr[r], lo, a[r][2 * j]);
      a[r][2 * j + 1] = _mm512_fmadd_ps(pr[r], hi, a[r][2 * j + 1]);
    }
  }
}

// Keys of the V pass between two calls of the prefetch stream. Told every
// key (128 bytes a key for head_dim 64 in BF16), its bookkeeping took a
// quarter of the pass's time in L1; every 8 keys measured no better than 4.
constexpr int32_t kPvKeysPerTelling = 4;

// acc_r[c0, c0 + 32 C) += Σ_t p_r[t] v_t over keys [0, n).
template <DType T, int R, int C>
BATON_AVX512_INLINE void pv_pass(const float* p, int32_t p_stride, const char* const* rows,
                                 size_t row_offset, int32_t d, int32_t n, int32_t c0, float* acc,
                                 PrefetchStream& prefetch) {
  // Each accumulator takes one FMA per key: with fewer than 8 of them the
  // FMA units would wait on the chains, so even and odd keys go to separate
  // sets.
  constexpr bool kTwoKeys = R * 2 * C < 8;
  constexpr size_t kKeyBytes = size_t(kAvx512Columns) * C * dtype_size(T);
  __m512 a[R][2 * C], b[R][2 * C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 2 * C; ++j) {
      a[r][j] = _mm512_loadu_ps(acc + size_t(r) * d + c0 + 16 * j);
      b[r][j] = _mm512_setzero_ps();
    }
  int32_t t = 0;
  // With two sets, even keys go to a and odd ones to b.
  for (; t + kPvKeysPerTelling <= n; t += kPvKeysPerTelling) {
    prefetch.consumed(kPvKeysPerTelling * kKeyBytes);
#pragma GCC unroll 8
    for (int32_t u = 0; u < kPvKeysPerTelling; ++u) {
      if (kTwoKeys && u % 2 == 1)
        pv_key<T, R, C>(p, p_stride, rows[t + u] + row_offset, t + u, c0, b);
      else
        pv_key<T, R, C>(p, p_stride, rows[t + u] + row_offset, t + u, c0, a);
    }
  }
  for (; t < n; ++t) {
    prefetch.consumed(kKeyBytes);
    pv_key<T, R, C>(p, p_stride, rows[t] + row_offset, t, c0, a);
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 2 * C; ++j) {
      if constexpr (kTwoKeys) a[r][j] = _mm512_add_ps(a[r][j], b[r][j]);
      _mm512_storeu_ps(acc + size_t(r) * d + c0 + 16 * j, a[r][j]);
    }
}

// Passes of as many 32-element chunks as keep R x 2C accumulators, R
// broadcasts and a chunk's two halves in 32 registers (24 accumulators at
// most), then one-chunk passes for what is left of d.
template <DType T, int R>
BATON_AVX512 void tile_pv(const float* p, int32_t p_stride, const char* const* rows,
                          size_t row_offset, int32_t d, int32_t n, float* acc,
                          PrefetchStream& stream) {
  PrefetchStream prefetch = stream;  // a local copy stays in registers
  constexpr int C = R <= 3 ? 4 : 2;
  static_assert(R * 2 * C <= 24);
  int32_t c = 0;
  for (; c + kAvx512Columns * C <= d; c += kAvx512Columns * C)
    pv_pass<T, R, C>(p, p_stride, rows, row_offset, d, n, c, acc, prefetch);
  if constexpr (C > 2)
    for (; c + kAvx512Columns * 2 <= d; c += kAvx512Columns * 2)
      pv_pass<T, R, 2>(p, p_stride, rows, row_offset, d, n, c, acc, prefetch);
  for (; c < d; c += kAvx512Columns)
    pv_pass<T, R, 1>(p, p_stride, rows, row_offset, d, n, c, acc, prefetch);
  stream = prefetch;
}

}  // namespace
}  // namespace avx512

// The 8-bit formats' keys take passes of their own (decode_scores_vnni.h,
// decode_scores_fp8.h, decode_scores_e4m3_fma.h): with_dtype refuses them.
void key_tile_scores_avx512(DType t, int32_t queries, const float* q, int32_t d, const void* k,
                            size_t group_stride, int32_t n8, float* s, int32_t s_stride,
                            PrefetchStream& stream) {
  with_dtype(t, [&]<DType T>() {
    with_queries<kAvx512TileQueries>(queries, [&]<int R>() {
      avx512::key_tile_scores<T, R>(q, d, k, group_stride, n8, s, s_stride, stream);
    });
  });
}

void key_run_scores_avx512(DType t, int32_t queries, const float* q, int32_t d,
                           const char* const* tiles, size_t group_stride, int32_t keys, float* s,
                           int32_t s_stride, PrefetchStream& stream) {
  with_dtype(t, [&]<DType T>() {
    with_queries<kAvx512TileQueries>(queries, [&]<int R>() {
      avx512::key_run_scores<T, R>(q, d, tiles, group_stride, keys, s, s_stride, stream);
    });
  });
}

void key_tile_scores_avx512(DType t, int32_t queries, const float* q, int32_t d, const void* k,
                            size_t group_stride, int32_t n8, float* s, int32_t s_stride) {
  avx512::NoStream none;
  with_dtype(t, [&]<DType T>() {
    with_queries<kAvx512TileQueries>(queries, [&]<int R>() {
      avx512::key_tile_scores<T, R>(q, d, k, group_stride, n8, s, s_stride, none);
    });
  });
}

void tile_pv_avx512(DType t, int32_t queries, const float* p, int32_t p_stride,
                    const char* const* rows, size_t row_offset, int32_t d, int32_t n, float* acc,
                    PrefetchStream& stream) {
  with_kv_dtype(t, [&]<DType T>() {
    with_queries<kAvx512TileQueries>(queries, [&]<int R>() {
      avx512::tile_pv<T, R>(p, p_stride, rows, row_offset, d, n, acc, stream);
    });
  });
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"  // the _mm512_reduce_* macros
BATON_AVX512 void softmax_row_avx512(float* s, int32_t visible, int32_t n, float* row_max,
                                     float* row_sum, const float* scales) {
  using avx512::first_lanes;
  visible = std::clamp(visible, 0, n);
  const float max = avx512::max_of(s, visible);
  *row_max = max;
  const __m512 vmax = _mm512_set1_ps(visible > 0 ? max : 0.0f);
  __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
  int32_t t = 0;
  for (; t + 32 <= visible; t += 32) {
    const __m512 p0 = avx512::exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + t), vmax));
    const __m512 p1 = avx512::exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + t + 16), vmax));
    _mm512_storeu_ps(s + t, avx512::times_scales(p0, scales, t, 0xffff));
    _mm512_storeu_ps(s + t + 16, avx512::times_scales(p1, scales, t + 16, 0xffff));
    sum0 = _mm512_add_ps(sum0, p0);
    sum1 = _mm512_add_ps(sum1, p1);
  }
  // The rest of the visible keys (masked), then zeros up to n.
  for (; t < n; t += 16) {
    const __mmask16 m = first_lanes(visible - t);
    const __m512 p = _mm512_maskz_mov_ps(
        m, avx512::exp16_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + t), vmax)));
    _mm512_mask_storeu_ps(s + t, first_lanes(n - t), avx512::times_scales(p, scales, t, m));
    sum0 = _mm512_add_ps(sum0, p);
  }
  *row_sum = _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
}
#pragma GCC diagnostic pop

BATON_AVX512 void chunks_to_element_order(const float* src, size_t n, const ChunkSlots& slots,
                                          float* dst) {
  // One permute of the chunk's two registers per 16 elements.
  const __m512i first = _mm512_loadu_si512(slots.data());
  const __m512i second = _mm512_loadu_si512(slots.data() + 16);
  for (size_t c = 0; c < n; c += kAvx512Columns) {
    const __m512 a = _mm512_loadu_ps(src + c), b = _mm512_loadu_ps(src + c + 16);
    _mm512_storeu_ps(dst + c, _mm512_permutex2var_ps(a, first, b));
    _mm512_storeu_ps(dst + c + 16, _mm512_permutex2var_ps(a, second, b));
  }
}

}  // namespace baton::kernels::cpu

#endif
