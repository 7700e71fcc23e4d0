#include "kernels/cpu/attention_decode.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_block.h"
#include "kernels/cpu/attention_decode_avx512.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/decode_scores_avx2.h"
#include "kernels/cpu/decode_scores_e4m3_fma.h"
#include "kernels/cpu/decode_scores_fp8.h"
#include "kernels/cpu/decode_scores_vnni.h"
#include "kernels/cpu/decode_tiles_avx512.h"
#include "kernels/cpu/key_tile_scores.h"
#include "kernels/cpu/prefetch_stream.h"
#include "kernels/cpu/simd_avx2.h"

namespace baton::kernels::cpu {
namespace {

// How far the prefetch stream runs ahead of the reads, in K or V parts of a
// block (a part holds one layer's K, or V, of every KV head: 6 KiB for
// smollm2-135m in BF16, 12 KiB in F32). One or two parts cover a DRAM
// latency: the 512-bit passes take one; the AVX2 passes about this many
// bytes in whole parts, at least one. On an AMD EPYC
// (bench/results/2026-12-04-attention-avx2-prefetch-distance.md), two parts of
// BF16 took 0.80-0.83 of the time of one from memory on one thread, while
// one part of F32 did better than two, and two parts made the 512-bit
// passes no faster.
constexpr int32_t kPrefetchPartsAhead = 1;
constexpr size_t kAvx2PrefetchBytesAhead = size_t(12) << 10;
// Elements one step of the V pass consumes from a V row.
constexpr int32_t kChunk = 16;

int32_t round_up(int32_t x, int32_t m) { return (x + m - 1) / m * m; }

// The kernels a partition's score and V passes run.
enum class Passes {
  kAvx2,          // key_tile_scores.h and tile_pv below
  kAvx512,        // decode_tiles_avx512.h, 512-bit F32 FMAs
  kAvx512Bf16Dot  // BF16: the AVX2 score pass, VDPBF16PS for V (attention_decode_avx512.h)
};

// Blocks per run of the AVX-512 passes (see kRunBlocks): the V pass takes
// its rows through the table for every dtype.
constexpr int32_t kAvx512RunBlocks = 4;

#if BATON_HAVE_X86

// Sixteen V elements as two vectors (the 8-bit formats' codes unscaled, in
// units of kv_code_unit). BF16 takes them as even and odd elements
// (avx2::load16_bf16_even_odd), so the V pass keeps its accumulators in that
// order too (kernel order, avx2::bf16_pair_slot).
template <DType T>
BATON_AVX2_INLINE void load16(const void* row, int32_t i, __m256& lo, __m256& hi) {
  if constexpr (T == DType::kF32) {
    const float* f = static_cast<const float*>(row) + i;
    lo = _mm256_loadu_ps(f);
    hi = _mm256_loadu_ps(f + 8);
  } else if constexpr (T == DType::kF16) {
    const uint16_t* h = static_cast<const uint16_t*>(row) + i;
    lo = avx2::load8_f16(h);
    hi = avx2::load8_f16(h + 8);
  } else if constexpr (T == DType::kI8) {
    avx2::widen16_i8(static_cast<const char*>(row) + i, lo, hi);
  } else if constexpr (T == DType::kFP8E4M3) {
    // In units of kv_code_unit.
    avx2::widen16_e4m3(static_cast<const char*>(row) + i, lo, hi);
  } else {
    avx2::load16_bf16_even_odd(static_cast<const uint16_t*>(row) + i, lo, hi);
  }
}

// The V rows of one KV head for a run of keys that may span several
// blocks: key t's row starts at rows[t] + offset. A block's rows are
// adjacent, so in a one-block run, [0] is the head's whole tile, and only
// [0] may be asked for: there `rows` is the table of blocks, not of rows.
struct KeyRows {
  const char* const* rows;
  size_t offset;
  const void* operator[](int32_t t) const { return rows[t] + offset; }
};

// The rows of one block's tile, adjacent: F32's one-block runs address them
// from the tile, as before runs, and need no table of rows.
struct TileRows {
  const char* tile;
  size_t row_bytes;
  const void* operator[](int32_t t) const { return tile + size_t(t) * row_bytes; }
};

// a[r][2j], a[r][2j + 1] += p_r[t] · (chunk j of v_t) for one key t, whose
// V row is v.
template <DType T, int R, int C>
BATON_AVX2_INLINE void pv_key(const float* p, int32_t p_stride, const void* v, int32_t t,
                              int32_t c0, __m256 (&a)[R][2 * C]) {
  __m256 pr[R];
  if (T == DType::kF32 || C > 1)
    for (int r = 0; r < R; ++r) pr[r] = _mm256_broadcast_ss(p + size_t(r) * p_stride + t);
  for (int j = 0; j < C; ++j) {
    if constexpr (T == DType::kF32) {
      // One V vector in a register at a time, for all R FMAs: with R = 3 and
      // C = 2 the 12 accumulators and 3 broadcasts leave just one.
      const float* vt = static_cast<const float*>(v) + c0 + kChunk * j;
      for (int half = 0; half < 2; ++half) {
        const __m256 x = _mm256_loadu_ps(vt + 8 * half);
        for (int r = 0; r < R; ++r)
          a[r][2 * j + half] = _mm256_fmadd_ps(pr[r], x, a[r][2 * j + half]);
      }
    } else {
      __m256 lo, hi;
      load16<T>(v, c0 + kChunk * j, lo, hi);
      for (int r = 0; r < R; ++r) {
        // With one chunk, each probability is broadcast right before its
        // two FMAs: R broadcasts at once need one register more than the
        // two-key passes have, and the accumulator spilled instead chains
        // every FMA on it through a store and a reload.
        const __m256 pv = C == 1 ? _mm256_broadcast_ss(p + size_t(r) * p_stride + t) : pr[r];
        a[r][2 * j] = _mm256_fmadd_ps(pv, lo, a[r][2 * j]);
        a[r][2 * j + 1] = _mm256_fmadd_ps(pv, hi, a[r][2 * j + 1]);
      }
    }
  }
}

// acc_r[c0, c0 + 16 C) += Σ_t p_r[t] v_t for R queries over keys [0, n).
template <DType T, int R, int C, typename Rows>
BATON_AVX2_INLINE void tile_pv_pass(const float* p, int32_t p_stride, Rows v, int32_t d, int32_t n,
                                    int32_t c0, float* acc, PrefetchStream& prefetch) {
  // Each accumulator takes one FMA per key, so fewer than two FMA units x
  // four cycles of latency = 8 accumulators leave the units waiting on the
  // chains. Then even and odd keys go to separate accumulators (BF16 and
  // F16 with R = 3 have room for only C = 1: 6 of them; so do the one-chunk
  // tail passes).
  constexpr bool kTwoKeys = R * 2 * C < 8;
  __m256 a[R][2 * C], b[R][2 * C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 2 * C; ++j) {
      a[r][j] = _mm256_loadu_ps(acc + size_t(r) * d + c0 + 8 * j);
      b[r][j] = _mm256_setzero_ps();
    }
  int32_t t = 0;
  if constexpr (kTwoKeys) {
    for (; t + 2 <= n; t += 2) {
      prefetch.consumed(2 * kChunk * C * dtype_size(T));
      pv_key<T, R, C>(p, p_stride, v[t], t, c0, a);
      pv_key<T, R, C>(p, p_stride, v[t + 1], t + 1, c0, b);
    }
  }
  for (; t < n; ++t) {
    prefetch.consumed(kChunk * C * dtype_size(T));
    pv_key<T, R, C>(p, p_stride, v[t], t, c0, a);
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 2 * C; ++j) {
      if constexpr (kTwoKeys) a[r][j] = _mm256_add_ps(a[r][j], b[r][j]);
      _mm256_storeu_ps(acc + size_t(r) * d + c0 + 8 * j, a[r][j]);
    }
}

// As many 16-element chunks per pass as keep R x 2C accumulators, R
// broadcasts and (half precision) one converted chunk in 16 registers.
template <DType T, int R, typename Rows>
BATON_AVX2 void tile_pv(const float* p, int32_t p_stride, Rows v, int32_t d, int32_t n, float* acc,
                        PrefetchStream& stream) {
  PrefetchStream prefetch = stream;  // a local copy stays in registers
  constexpr int C = T == DType::kF32 ? (R == 1   ? 4
                                        : R == 2 ? 3
                                        : R == 3 ? 2
                                                 : 1)
                                     : (R == 1   ? 4
                                        : R == 2 ? 2
                                                 : 1);
  int32_t c = 0;
  for (; c + kChunk * C <= d; c += kChunk * C)
    tile_pv_pass<T, R, C>(p, p_stride, v, d, n, c, acc, prefetch);
  for (; c < d; c += kChunk) tile_pv_pass<T, R, 1>(p, p_stride, v, d, n, c, acc, prefetch);
  stream = prefetch;
}

struct Scratch {
  std::vector<float> q, scores, acc;
  // 8-bit KV: each KV head's V scales over the partition's keys, times
  // kv_code_unit, P.stride apart.
  std::vector<float> v_scales;
  // int8 KV: the query vectors as codes (decode_scores_vnni.h), and as the
  // AVX2 pass takes them (decode_scores_avx2.h).
  std::vector<uint32_t> q_words;
  std::vector<float> q_scales;
  std::vector<uint32_t> q_codes, q_magnitudes;
  // E4M3 KV: the query vectors as BF16 pairs (decode_scores_fp8.h).
  std::vector<uint32_t> q_pairs;
  // The probabilities split for the AVX-512 V pass.
  std::vector<uint16_t> p_hi, p_lo;
  std::vector<const char*> blocks;
  std::vector<const char*> rows;     // each key's row in its block (head 0, K part)
  std::vector<const char*> tiles;    // K tiles in the order runs read them
  std::vector<const char*> regions;  // what the prefetch stream reads, in order
};

// What the passes over one partition share.
struct Partition {
  int32_t d;         // head_dim
  int32_t bs;        // block size
  int32_t heads;     // KV heads
  int32_t per_head;  // query vectors per KV head
  int32_t n_q;       // query vectors
  int32_t keys;      // keys of the partition
  int32_t stride;    // of the score rows
  int32_t num_blocks;
  size_t tile_bytes;      // one KV head's K (or V) in a block
  size_t v_offset;        // from a block's K part to its V part
  size_t row_bytes;       // one key's row of one head
  size_t k_group_stride;  // between the dimension groups of a K tile
  int32_t window;         // > 0: a sliding window (PagedAttentionParams::window)
  // 8-bit KV: from head h's K tile to its K scales in the same block,
  // k_scale_delta + h * k_scale_step bytes.
  ptrdiff_t k_scale_delta;
  ptrdiff_t k_scale_step;
  // E4M3 KV on the 512-bit passes: scores on F32 FMAs (e4m3_scores_on_fmas,
  // read once: the queries are prepared for one pass or the other).
  bool e4m3_fmas;
};

// Parts (K or V of every head of a block) the AVX2 passes prefetch ahead:
// kAvx2PrefetchBytesAhead in whole parts, at least one.
int32_t avx2_prefetch_parts(const Partition& P) {
  return int32_t(std::max<size_t>(1, kAvx2PrefetchBytesAhead / (size_t(P.heads) * P.tile_bytes)));
}

// Blocks per run of the AVX2 half-precision V pass, which takes each KV
// head's rows of several blocks in one call: with one call per 16-key
// block, the set-up of each call cost a quarter of the pass. Four blocks of
// V rows stay in L1 while the V pass goes over them once per column chunk.
// The score pass reads the same runs block by block, in the same order for
// the prefetch stream. F32's passes measured no better with runs; the
// AVX-512 V pass takes one block's tile per call.
template <DType T>
constexpr int32_t kRunBlocks = T == DType::kF32 ? 1 : 4;

// The rows the AVX2 V pass addresses in a run: a one-block run's from its
// tile, longer runs' through the row table.
template <DType T>
auto run_rows(KeyRows rows, size_t row_bytes) {
  if constexpr (kRunBlocks<T> == 1)
    return TileRows{static_cast<const char*>(rows[0]), row_bytes};
  else
    return rows;
}

// Calls f<R>(rows, k0, n, i) for the run of up to run_blocks blocks that
// starts at block j0 (keys [k0, k0 + n) of the partition) and every KV head
// h, for each group of R query vectors [i, i + R) of that head, with `rows`
// the head's V rows of those keys: the order the prefetch stream is told.
template <int32_t kMaxGroup, typename F>
BATON_AVX2_INLINE void for_v_run(const Partition& P, const Scratch& sc, int32_t run_blocks,
                                 int32_t j0, F&& f) {
  const int32_t k0 = j0 * P.bs;
  const int32_t n = std::min(run_blocks * P.bs, P.keys - k0);
  // A one-block run needs only its first row, the block's tile: sc.rows
  // is filled for longer runs only.
  const char* const* first_row = run_blocks == 1 ? &sc.blocks[size_t(j0)] : &sc.rows[size_t(k0)];
  for (int32_t h = 0; h < P.heads; ++h) {
    const KeyRows rows{first_row, P.v_offset + size_t(h) * P.tile_bytes};
    const int32_t first = h * P.per_head;
    for_query_groups<kMaxGroup>(
        P.per_head, [&]<int R>(int32_t i) { f.template operator()<R>(rows, k0, n, first + i); });
  }
}

// for_v_run over every run of the partition, in order.
template <int32_t kMaxGroup, typename F>
BATON_AVX2_INLINE void for_each_v_run(const Partition& P, const Scratch& sc, int32_t run_blocks,
                                      F&& f) {
  for (int32_t j0 = 0; j0 < P.num_blocks; j0 += run_blocks)
    for_v_run<kMaxGroup>(P, sc, run_blocks, j0, f);
}

// For runs of several blocks: the table of each key's row (sc.rows, head 0's
// K part, which V rows are found from), and the K tiles in the order
// k_pass and for_each_v_run read them (sc.tiles: for
// each run, for each head, the run's blocks), for the prefetch stream.
BATON_AVX2_INLINE void prepare_runs(const Partition& P, int32_t run_blocks, Scratch& sc) {
  sc.rows.resize(size_t(P.keys));
  for (int32_t j = 0, t = 0; j < P.num_blocks; ++j)
    for (int32_t r = 0; r < P.bs && t < P.keys; ++r, ++t)
      sc.rows[size_t(t)] = sc.blocks[size_t(j)] + size_t(r) * P.row_bytes;
  sc.tiles.clear();
  for (int32_t j0 = 0; j0 < P.num_blocks; j0 += run_blocks)
    for (int32_t h = 0; h < P.heads; ++h)
      for (int32_t j = j0; j < std::min(P.num_blocks, j0 + run_blocks); ++j)
        sc.tiles.push_back(sc.blocks[size_t(j)] + size_t(h) * P.tile_bytes);
}

// The accumulators of the AVX2 V pass (kernel order, see load16) of n_q
// query vectors back to element order in dst.
template <DType T>
BATON_AVX2 void kernel_to_element_order(const float* src, int32_t n_q, int32_t d, float* dst) {
  const size_t n = size_t(n_q) * size_t(d);
  if constexpr (T != DType::kBF16) {
    std::copy(src, src + n, dst);
  } else {
    // Each chunk of 16 holds its even elements, then its odd ones.
    for (size_t c = 0; c < n; c += kChunk) {
      const __m256 even = _mm256_loadu_ps(src + c), odd = _mm256_loadu_ps(src + c + 8);
      const __m256 lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
      _mm256_storeu_ps(dst + c, _mm256_permute2f128_ps(lo, hi, 0x20));
      _mm256_storeu_ps(dst + c + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
    }
  }
}

// The scores of the run of up to run_blocks blocks that starts at block
// j0, from the queries at sc.q, one K tile at a time (for each KV head and
// group of query vectors, the run's blocks), which the prefetch stream
// follows. The AVX2 or the AVX-512 score pass, which take the same groups
// of query vectors.
template <DType T>
BATON_AVX2 void k_run(const Partition& P, Scratch& sc, int32_t run_blocks, int32_t j0, bool avx512,
                      PrefetchStream& prefetch) {
  static_assert(kAvx512TileQueries == kMaxQueryGroup);
  const int32_t j1 = std::min(P.num_blocks, j0 + run_blocks);
  for (int32_t h = 0; h < P.heads; ++h)
    for_query_groups(P.per_head, [&]<int R>(int32_t g0) {
      const int32_t i = h * P.per_head + g0;
      // int8: the query vectors' codes against the keys' (VNNI); E4M3:
      // BF16 pairs against the keys' (decode_scores_fp8.h).
      QueryCodes codes;
      SignedQueryCodes signed_codes;
      if constexpr (T == DType::kI8) {
        const size_t at = size_t(i) * (P.d / 4);
        codes = {sc.q_words.data() + at, sc.q_scales.data() + i};
        if (!avx512)
          signed_codes = {sc.q_codes.data() + at, sc.q_magnitudes.data() + at,
                          sc.q_scales.data() + i};
      }
      const bool fmas = T == DType::kFP8E4M3 && avx512 && P.e4m3_fmas;
      const uint32_t* pairs = T == DType::kFP8E4M3 && avx512 && !fmas
                                  ? sc.q_pairs.data() + size_t(i) * (P.d / 2)
                                  : nullptr;
      const ptrdiff_t scale_delta = P.k_scale_delta + h * P.k_scale_step;
      if (avx512 && P.bs == 16 && run_blocks > 1) {
        // The run's tiles of head h, as prepare_runs lists them: two at a
        // time, each query element broadcast once for both.
        const char* const* tiles = sc.tiles.data() + size_t(j0) * P.heads + size_t(h) * (j1 - j0);
        const int32_t k0 = j0 * P.bs;
        float* s = sc.scores.data() + size_t(i) * P.stride + k0;
        const int32_t keys = std::min(j1 * P.bs, P.keys) - k0;
        if constexpr (T == DType::kI8)
          key_run_scores_vnni(R, codes, P.d, tiles, P.k_group_stride, scale_delta, keys, s,
                              P.stride, prefetch);
        else if constexpr (T == DType::kFP8E4M3) {
          if (fmas)
            key_run_scores_e4m3_fma(R, sc.q.data() + size_t(i) * P.d, P.d, tiles, P.k_group_stride,
                                    scale_delta, keys, s, P.stride, prefetch);
          else
            key_run_scores_fp8(R, pairs, P.d, tiles, P.k_group_stride, scale_delta, keys, s,
                               P.stride, prefetch);
        } else
          key_run_scores_avx512(T, R, sc.q.data() + size_t(i) * P.d, P.d, tiles, P.k_group_stride,
                                keys, s, P.stride, prefetch);
        return;
      }
      for (int32_t j = j0; j < j1; ++j) {
        const int32_t k0 = j * P.bs;
        // Scores of the slots past the context in the last 8 keys are
        // masked by the softmax.
        const int32_t n8 = round_up(std::min(P.bs, P.keys - k0), 8);
        const float* q = sc.q.data() + size_t(i) * P.d;
        const char* tile = sc.blocks[size_t(j)] + size_t(h) * P.tile_bytes;
        float* s = sc.scores.data() + size_t(i) * P.stride + k0;
        // The 8-bit formats run score passes of their own.
        if constexpr (T == DType::kI8) {
          if (avx512)
            key_tile_scores_vnni(R, codes, P.d, tile, P.k_group_stride, scale_delta, n8, s,
                                 P.stride, prefetch);
          else
            key_tile_scores_i8_avx2(R, signed_codes, P.d, tile, P.k_group_stride, scale_delta, n8,
                                    s, P.stride, prefetch);
        } else if constexpr (T == DType::kFP8E4M3) {
          if (fmas)
            key_tile_scores_e4m3_fma(R, q, P.d, tile, P.k_group_stride, scale_delta, n8, s,
                                     P.stride, prefetch);
          else if (avx512)
            key_tile_scores_fp8(R, pairs, P.d, tile, P.k_group_stride, scale_delta, n8, s, P.stride,
                                prefetch);
          else
            key_tile_scores_e4m3_avx2(R, q, P.d, tile, P.k_group_stride, scale_delta, n8, s,
                                      P.stride, prefetch);
        } else if (avx512)
          key_tile_scores_avx512(T, R, q, P.d, tile, P.k_group_stride, n8, s, P.stride, prefetch);
        else
          key_tile_scores<T, R>(q, P.d, tile, P.k_group_stride, n8, s, P.stride, prefetch);
      }
    });
}

// Pass 1: every score of the partition, run by run.
template <DType T>
BATON_AVX2 void k_pass(const Partition& P, Scratch& sc, int32_t run_blocks, bool avx512,
                       PrefetchStream& prefetch) {
  for (int32_t j0 = 0; j0 < P.num_blocks; j0 += run_blocks)
    k_run<T>(P, sc, run_blocks, j0, avx512, prefetch);
}

// sc.acc (kernel order) += Σ_t p[t] v_t over the keys of the run that
// starts at block j0, for every query vector, with F32 FMAs.
template <DType T>
BATON_AVX2 void v_run_avx2(const Partition& P, Scratch& sc, int32_t j0, PrefetchStream& prefetch) {
  for_v_run<kMaxQueryGroup>(
      P, sc, kRunBlocks<T>, j0, [&]<int R>(KeyRows v, int32_t k0, int32_t n, int32_t i) {
        const float* p = sc.scores.data() + size_t(i) * P.stride + k0;
        float* a = sc.acc.data() + size_t(i) * P.d;
        tile_pv<T, R>(p, P.stride, run_rows<T>(v, P.row_bytes), P.d, n, a, prefetch);
      });
}

// Pass 3 with F32 FMAs: acc (element order) = Σ_t p[t] v_t for every query
// vector.
template <DType T>
BATON_AVX2 void v_pass_avx2(const Partition& P, Scratch& sc, PrefetchStream& prefetch, float* acc) {
  for (int32_t j0 = 0; j0 < P.num_blocks; j0 += kRunBlocks<T>) v_run_avx2<T>(P, sc, j0, prefetch);
  kernel_to_element_order<T>(sc.acc.data(), P.n_q, P.d, acc);
}

// Pass 3 for BF16 with AVX-512 BF16 dot products (attention_decode_avx512.h),
// the same result as v_pass_avx2 to within 2^-17 of each probability.
BATON_AVX2 void v_pass_avx512_bf16(const Partition& P, Scratch& sc, PrefetchStream& prefetch,
                                   float* acc) {
  for_each_v_run<kAvx512MaxQueries>(
      P, sc, 1, [&]<int R>(KeyRows v, int32_t k0, int32_t n, int32_t i) {
        const size_t at = size_t(i) * P.stride + size_t(k0);
        tile_pv_bf16_avx512(R, sc.p_hi.data() + at, sc.p_lo.data() + at, P.stride, v[0], P.d, n,
                            sc.acc.data() + size_t(i) * P.d, prefetch);
      });
  static_assert(kPvAvx512Columns == kAvx512Columns);
  constexpr ChunkSlots kSlots = chunk_slots(pv_avx512_slot);
  chunks_to_element_order(sc.acc.data(), sc.acc.size(), kSlots, acc);
}

// Pass 3 with 512-bit F32 FMAs (decode_tiles_avx512.h), in runs of
// kAvx512RunBlocks blocks.
template <DType T>
BATON_AVX2 void v_pass_avx512(const Partition& P, Scratch& sc, PrefetchStream& prefetch,
                              float* acc) {
  for_each_v_run<kAvx512TileQueries>(
      P, sc, kAvx512RunBlocks, [&]<int R>(KeyRows v, int32_t k0, int32_t n, int32_t i) {
        tile_pv_avx512(T, R, sc.scores.data() + size_t(i) * P.stride + k0, P.stride, v.rows,
                       v.offset, P.d, n, sc.acc.data() + size_t(i) * P.d, prefetch);
      });
  if constexpr (T == DType::kBF16) {
    constexpr ChunkSlots kSlots = chunk_slots(tile_pv_avx512_slot);
    chunks_to_element_order(sc.acc.data(), sc.acc.size(), kSlots, acc);
  } else {
    std::copy(sc.acc.begin(), sc.acc.end(), acc);
  }
}

// 8-bit KV: sc.v_scales[h P.stride + t] = the scale of key t's V row of KV
// head h, times the unit the V pass reads its codes in. The softmax applies
// them as it writes the probabilities.
template <DType T>
BATON_AVX2 void gather_v_scales(const Partition& P, const KvLayout& L, Scratch& sc) {
  constexpr float unit = kv_code_unit(T);
  sc.v_scales.resize(size_t(P.heads) * P.stride);
  for (int32_t h = 0; h < P.heads; ++h) {
    // Where a block's scales of this head start, from its start.
    const size_t at = L.scale_byte_offset(0, 0, KvPart::kValue, h, 0);
    float* scales = sc.v_scales.data() + size_t(h) * P.stride;
    for (int32_t j = 0; j < P.num_blocks; ++j) {
      const int32_t n = std::min(P.bs, P.keys - j * P.bs);
      const char* src = sc.blocks[size_t(j)] + at;
      float* dst = scales + size_t(j) * P.bs;
      // Element by element: a call of memcpy per block cost more than the
      // copy itself.
      for (int32_t t = 0; t < n; ++t) {
        float scale;
        std::memcpy(&scale, src + size_t(t) * sizeof(float), sizeof(float));
        dst[t] = scale * unit;
      }
    }
    // The last 8 keys' slots past the partition: their probabilities are
    // 0, and so are these, so no product of the two is a NaN.
    std::fill(scales + P.keys, scales + P.stride, 0.0f);
  }
}

// p[t] *= scales[t] for t in [0, n8), n8 a multiple of 8: probabilities
// times their V rows' scales.
BATON_AVX2 void scale_probabilities(float* p, const float* scales, int32_t n8) {
  for (int32_t t = 0; t < n8; t += 8)
    _mm256_storeu_ps(p + t, _mm256_mul_ps(_mm256_loadu_ps(p + t), _mm256_loadu_ps(scales + t)));
}

// Keys [hidden, visible) of the partition are those query vector i sees:
// row r of the step sits at position ctx - q_len + r and sees keys up to it,
// under a sliding window only its last `window` positions.
struct SeenKeys {
  int32_t hidden;
  int32_t visible;
};
SeenKeys seen_keys(const Partition& P, int32_t i, int32_t group, int32_t ctx, int32_t q_len,
                   int32_t key_begin) {
  const int32_t row = (i % P.per_head) / group;
  const int32_t position = ctx - q_len + row;
  return {std::clamp(first_seen_key(position, P.window) - key_begin, 0, P.keys),
          std::clamp(position + 1 - key_begin, 0, P.keys)};
}

// The AVX2 half-precision passes, fused run by run: a run's scores, an
// online-softmax step over them, then the run's V rows. K and V of the
// same blocks are read one right after the other, and the prefetch stream
// runs on through the softmax steps instead of waiting out one softmax
// over the whole partition: from memory, one thread took 0.92-0.95 of the
// time of the two passes and the softmax between them
// (bench/results/2026-12-04-attention-avx2-fused-runs.md). F32's passes, whose
// runs are single blocks, took 1.25 of the time this way in runs of four.
template <DType T>
BATON_AVX2 void attend_runs_fused(const Partition& P, Scratch& sc, int32_t q_len, int32_t group,
                                  int32_t ctx, int32_t key_begin, const PartitionState& state,
                                  const char* then) {
  constexpr int32_t run_blocks = kRunBlocks<T>;
  static_assert(run_blocks > 1, "the V rows of a run come from sc.rows");
  prepare_runs(P, run_blocks, sc);
  // Each run's K tiles, then its V tiles, the next partition's start last.
  sc.regions.clear();
  for (int32_t j0 = 0, at = 0; j0 < P.num_blocks; j0 += run_blocks) {
    const int32_t tiles = P.heads * (std::min(P.num_blocks, j0 + run_blocks) - j0);
    const bool last = j0 + run_blocks >= P.num_blocks;
    PrefetchStream::k_then_v(&sc.tiles[size_t(at)], tiles, P.v_offset, last ? then : nullptr,
                             sc.regions);
    at += tiles;
  }
  PrefetchStream prefetch(sc.regions.data(), int32_t(sc.regions.size()), P.tile_bytes);
  prefetch.prime(avx2_prefetch_parts(P) * P.heads);
  prefetch.set_readers(query_groups<kMaxQueryGroup>(P.per_head));
  for (int32_t i = 0; i < P.n_q; ++i) {
    state.row_max[i] = kNegInf;
    state.row_sum[i] = 0.0f;
  }
  for (int32_t j0 = 0; j0 < P.num_blocks; j0 += run_blocks) {
    k_run<T>(P, sc, run_blocks, j0, /*avx512=*/false, prefetch);
    const int32_t k0 = j0 * P.bs;
    const int32_t n = std::min(run_blocks * P.bs, P.keys - k0);
    for (int32_t i = 0; i < P.n_q; ++i) {
      const SeenKeys seen = seen_keys(P, i, group, ctx, q_len, key_begin);
      float* s = sc.scores.data() + size_t(i) * P.stride + k0;
      const int32_t visible = mask_before_window(s, std::clamp(seen.hidden - k0, 0, n),
                                                 std::clamp(seen.visible - k0, 0, n));
      const float alpha =
          softmax_update_avx2(s, visible, round_up(n, 8), state.row_max + i, state.row_sum + i);
      if constexpr (is_quantized(T))
        scale_probabilities(s, sc.v_scales.data() + size_t(i / P.per_head) * P.stride + k0,
                            round_up(n, 8));
      // The run's V rows add to what the earlier runs left, taken to the
      // new running max.
      if (alpha != 1.0f) {
        float* a = sc.acc.data() + size_t(i) * P.d;
        for (int32_t c = 0; c < P.d; ++c) a[c] *= alpha;
      }
    }
    v_run_avx2<T>(P, sc, j0, prefetch);
  }
  kernel_to_element_order<T>(sc.acc.data(), P.n_q, P.d, state.acc);
}

template <DType T>
BATON_AVX2 void attend_partition_avx2(const PagedAttentionParams& p, int32_t seq, int32_t key_begin,
                                      int32_t key_end, const PartitionState& state,
                                      const char* then) {
  thread_local Scratch sc;
  const KvLayout& L = p.layout;
  const int32_t group = p.num_heads / L.num_kv_heads;
  const int32_t q_len = p.query_start[seq + 1] - p.query_start[seq];
  const int32_t ctx = p.context_lens[seq];
  const size_t esize = L.element_bytes();
  Partition P;
  P.d = L.head_dim;
  P.bs = L.block_size;
  P.heads = L.num_kv_heads;
  P.per_head = q_len * group;
  P.n_q = P.per_head * P.heads;
  P.keys = key_end - key_begin;
  P.stride = round_up(std::max(P.keys, 1), 8);
  P.num_blocks = (P.keys + P.bs - 1) / P.bs;
  P.tile_bytes = L.head_tile_elements() * esize;
  P.v_offset = L.part_elements() * esize;  // V part after the K part
  P.k_group_stride = L.key_group_stride();
  P.window = p.window;
  P.e4m3_fmas = e4m3_scores_on_fmas();
  const int32_t d = P.d;

  // 512-bit passes where the CPU has them (and the 8-bit formats' score
  // passes their extensions) and head_dim fills their chunks; BF16's V pass
  // on VDPBF16PS where that is preferred (cpu_features.h).
  const Passes passes = T == DType::kBF16 && use_avx512_bf16() && d % kPvAvx512Columns == 0
                            ? Passes::kAvx512Bf16Dot
                        : decode_partition_avx512(L) ? Passes::kAvx512
                                                     : Passes::kAvx2;
  const bool dot = passes == Passes::kAvx512Bf16Dot;
  // Queries scaled, vector i at sc.q + i * d.
  sc.q.resize(size_t(P.n_q) * d);
  for (int32_t h = 0; h < P.heads; ++h)
    for (int32_t r = 0; r < q_len; ++r)
      for (int32_t g = 0; g < group; ++g) {
        const float* src =
            static_cast<const float*>(p.q) +
            (size_t(p.query_start[seq] + r) * p.num_heads + size_t(h) * group + g) * d;
        float* dst = sc.q.data() + (size_t(h) * P.per_head + size_t(r) * group + g) * d;
        for (int32_t c = 0; c < d; ++c) dst[c] = src[c] * p.scale;
      }
  if constexpr (T == DType::kI8) {
    const size_t words = size_t(P.n_q) * size_t(d / 4);
    sc.q_words.resize(words);
    sc.q_scales.resize(size_t(P.n_q));
    quantize_queries(sc.q.data(), P.n_q, d, sc.q_words.data(), sc.q_scales.data());
    if (passes == Passes::kAvx2) {
      sc.q_codes.resize(words);
      sc.q_magnitudes.resize(words);
      signed_query_codes(sc.q_words.data(), words, sc.q_codes.data(), sc.q_magnitudes.data());
    }
  } else if constexpr (T == DType::kFP8E4M3) {
    // The AVX2 and the F32 FMA score passes take the F32 queries.
    if (passes == Passes::kAvx512 && !P.e4m3_fmas) {
      sc.q_pairs.resize(size_t(P.n_q) * size_t(d / 2));
      bf16_query_pairs(sc.q.data(), sc.q.size(), sc.q_pairs.data());
    }
  }
  if constexpr (is_quantized(T)) {
    P.k_scale_delta = ptrdiff_t(L.scale_byte_offset(0, 0, KvPart::kKey, 0, 0));
    P.k_scale_step = ptrdiff_t(size_t(P.bs) * sizeof(float)) - ptrdiff_t(P.tile_bytes);
  } else {
    P.k_scale_delta = P.k_scale_step = 0;
  }
  sc.scores.resize(size_t(P.n_q) * P.stride);
  sc.acc.assign(size_t(P.n_q) * d, 0.0f);

  const int32_t* table = p.block_tables + size_t(seq) * p.block_table_stride;
  const int32_t first_block = key_begin / P.bs;
  sc.blocks.resize(size_t(P.num_blocks));
  for (int32_t j = 0; j < P.num_blocks; ++j)
    sc.blocks[size_t(j)] = static_cast<const char*>(p.kv_pool) +
                           L.block_offset(p.layer, table[first_block + j]) * esize;
  P.row_bytes = size_t(d) * esize;
  if constexpr (kRunBlocks<T> != 1) {
    if (passes == Passes::kAvx2) {
      if constexpr (is_quantized(T)) gather_v_scales<T>(P, L, sc);
      return attend_runs_fused<T>(P, sc, q_len, group, ctx, key_begin, state, then);
    }
  }
  // The AVX-512 passes take runs of several blocks; AVX2's F32 passes and
  // the VDPBF16PS V pass one block at a time.
  const int32_t run_blocks = passes == Passes::kAvx512 ? kAvx512RunBlocks : 1;
  const bool runs = run_blocks > 1;
  if (runs) prepare_runs(P, run_blocks, sc);

  // In the order the passes read: block by block, or run by run, one KV
  // head at a time.
  sc.regions.clear();
  if (runs)
    PrefetchStream::k_then_v(sc.tiles.data(), int32_t(sc.tiles.size()), P.v_offset, then,
                             sc.regions);
  else
    PrefetchStream::k_then_v(sc.blocks.data(), P.num_blocks, P.v_offset, then, sc.regions);
  // Regions of a head's tile, or of a block's K (or V) part of every head,
  // which is v_offset long.
  PrefetchStream prefetch(sc.regions.data(), int32_t(sc.regions.size()),
                          runs ? P.tile_bytes : P.v_offset);
  const int32_t parts_ahead =
      passes == Passes::kAvx2 ? avx2_prefetch_parts(P) : kPrefetchPartsAhead;
  prefetch.prime(parts_ahead * (runs ? P.heads : 1));
  // Every query group of a head reads each of its tiles.
  prefetch.set_readers(query_groups<kMaxQueryGroup>(P.per_head));
  // Pass 1: every score of the partition.
  k_pass<T>(P, sc, run_blocks, passes == Passes::kAvx512, prefetch);
  if constexpr (is_quantized(T)) gather_v_scales<T>(P, L, sc);
  // Pass 2: one softmax per query vector over the partition, relative to
  // the partition's own max. The VDPBF16PS V pass takes the probabilities
  // split into BF16 halves, written here without storing them as floats.
  if (dot) {
    // Two elements past the last row: a tile of odd length reads its last
    // key's pair.
    sc.p_hi.resize(size_t(P.n_q) * P.stride + 2);
    sc.p_lo.resize(sc.p_hi.size());
    std::fill(sc.p_hi.end() - 2, sc.p_hi.end(), 0);
    std::fill(sc.p_lo.end() - 2, sc.p_lo.end(), 0);
  }
  for (int32_t i = 0; i < P.n_q; ++i) {
    const size_t at = size_t(i) * P.stride;
    const SeenKeys seen = seen_keys(P, i, group, ctx, q_len, key_begin);
    const int32_t visible = mask_before_window(sc.scores.data() + at, seen.hidden, seen.visible);
    if (dot) {
      softmax_split_bf16(sc.scores.data() + at, visible, P.stride, state.row_max + i,
                         state.row_sum + i, sc.p_hi.data() + at, sc.p_lo.data() + at);
    } else if (passes == Passes::kAvx512) {
      const float* v_scales =
          is_quantized(T) ? sc.v_scales.data() + size_t(i / P.per_head) * P.stride : nullptr;
      softmax_row_avx512(sc.scores.data() + at, visible, P.stride, state.row_max + i,
                         state.row_sum + i, v_scales);
    } else {
      // A first step of the online softmax.
      state.row_max[i] = kNegInf;
      state.row_sum[i] = 0.0f;
      softmax_update_avx2(sc.scores.data() + at, visible, P.stride, state.row_max + i,
                          state.row_sum + i);
    }
  }
  // Pass 3: V weighted by the probabilities (VDPBF16PS groups at most
  // kAvx512MaxQueries query vectors).
  if (dot) {
    prefetch.set_readers(query_groups<kAvx512MaxQueries>(P.per_head));
    v_pass_avx512_bf16(P, sc, prefetch, state.acc);
  } else if (passes == Passes::kAvx512) {
    v_pass_avx512<T>(P, sc, prefetch, state.acc);
  } else {
    v_pass_avx2<T>(P, sc, prefetch, state.acc);
  }
}

#endif  // BATON_HAVE_X86

}  // namespace

bool e4m3_scores_on_fmas() { return !avx512_bf16_preferred() || !use_avx512_bf16_vbmi(); }

bool decode_partition_avx512(const KvLayout& layout) {
#if BATON_HAVE_X86
  if (!use_avx512() || layout.head_dim % kAvx512Columns != 0) return false;
  switch (layout.dtype) {
    case DType::kI8:
      return use_avx512_vnni();
    case DType::kFP8E4M3:  // the F32 FMA pass needs nothing more
      return true;
    default:
      return true;
  }
#else
  (void)layout;
  return false;
#endif
}

bool decode_partition_supported(const KvLayout& layout) {
#if BATON_HAVE_X86
  // The score pass reads K tiles 8 keys at a time.
  return use_avx2() && layout.head_dim % kChunk == 0 && layout.block_size % 8 == 0;
#else
  (void)layout;
  return false;
#endif
}

void attend_decode_partition(const PagedAttentionParams& p, int32_t seq, int32_t key_begin,
                             int32_t key_end, const PartitionState& state, const void* then) {
#if BATON_HAVE_X86
  const char* next = static_cast<const char*>(then);
  switch (p.layout.dtype) {
    case DType::kF32:
      return attend_partition_avx2<DType::kF32>(p, seq, key_begin, key_end, state, next);
    case DType::kF16:
      return attend_partition_avx2<DType::kF16>(p, seq, key_begin, key_end, state, next);
    case DType::kBF16:
      return attend_partition_avx2<DType::kBF16>(p, seq, key_begin, key_end, state, next);
    case DType::kI8:
      return attend_partition_avx2<DType::kI8>(p, seq, key_begin, key_end, state, next);
    case DType::kFP8E4M3:
      return attend_partition_avx2<DType::kFP8E4M3>(p, seq, key_begin, key_end, state, next);
  }
#else
  (void)p;
  (void)seq;
  (void)key_begin;
  (void)key_end;
  (void)state;
  (void)then;
#endif
}

const void* decode_partition_start(const PagedAttentionParams& p, int32_t seq, int32_t key_begin) {
  const KvLayout& L = p.layout;
  if (key_begin >= p.context_lens[seq]) return nullptr;
  const int32_t block =
      p.block_tables[size_t(seq) * p.block_table_stride + key_begin / L.block_size];
  return static_cast<const char*>(p.kv_pool) + L.block_offset(p.layer, block) * L.element_bytes();
}

}  // namespace baton::kernels::cpu
