// kernels/cpu/decode_tiles_avx512.h — the two tile kernels of decode
// attention (attention_decode.cc) with 512-bit F32 FMAs, for every KV dtype.
//
// They do what the AVX2 passes do, twice as wide: the score pass takes one
// dimension (a BF16 pair) of 16 keys per load, against that dimension of
// each query broadcast, so the accumulators are the scores; the V pass takes
// 32 elements of a V row per step, weighted by each query's probability.
// BF16 and F16 are widened to F32 exactly (a shift and a mask; VCVTPH2PS),
// so the products are F32's: no rounding of queries or probabilities.
//
// Why not AVX-512 BF16's VDPBF16PS: on Intel's Xeon (Emerald Rapids) one
// core issues 1.3 G of them per second against 5.4 G 512-bit FMAs, and
// keeping F32 precision would take two of them (a split of the F32 side)
// per pair of products. AMD's Zen 4 issues them faster than its FMAs, and
// keeps the V pass of attention_decode_avx512.h (use_avx512_bf16()).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "kernels/cpu/prefetch_stream.h"

namespace baton::kernels::cpu {

// Elements of a V row one step of the V pass takes: head_dim must be a
// multiple of it.
inline constexpr int32_t kAvx512Columns = 32;
// The most query vectors one call of either kernel serves.
inline constexpr int32_t kAvx512TileQueries = 4;

// The V pass reads the 8-bit formats' codes too, unscaled, in units of
// this: an E4M3 code comes out as its value times 2^-8 (what F16 holds of
// it exactly). The caller multiplies each probability by its V row's scale
// times the unit. (The 8-bit formats' score passes are their own:
// decode_scores_vnni.h, decode_scores_fp8.h.)
constexpr float kv_code_unit(DType t) { return t == DType::kFP8E4M3 ? 256.0f : 1.0f; }

#if defined(__x86_64__) || defined(__i386__)

// s[r * s_stride + t] = q_r · k_t for `queries` (1..kAvx512TileQueries)
// query vectors q_r at q + r d and the keys [0, n8) of a K tile k of dtype
// t, laid out as common/kv_layout.h says (dimension group c of key t at
// element c * group_stride + t * key_group_of(t)); n8 and d are multiples of
// 8. Keys past n8 are not read. F32, F16 or BF16. Call only when
// use_avx512().
void key_tile_scores_avx512(DType t, int32_t queries, const float* q, int32_t d, const void* k,
                            size_t group_stride, int32_t n8, float* s, int32_t s_stride,
                            PrefetchStream& stream);
// The same for a run of K tiles of 16 keys each: tiles[j] holds keys
// [16 j, 16 j + 16) of the run's keys [0, keys), all but the last tile full.
// Two tiles are taken at a time, each query element broadcast once for both.
void key_run_scores_avx512(DType t, int32_t queries, const float* q, int32_t d,
                           const char* const* tiles, size_t group_stride, int32_t keys, float* s,
                           int32_t s_stride, PrefetchStream& stream);
// The same as key_tile_scores_avx512 with no prefetch stream: prefill's block step
// (attention_block.cc), whose blocks the caller walks one at a time.
void key_tile_scores_avx512(DType t, int32_t queries, const float* q, int32_t d, const void* k,
                            size_t group_stride, int32_t n8, float* s, int32_t s_stride);

// acc_r += Σ_t p_r[t] v_t for `queries` (1..kAvx512TileQueries) query
// vectors r and keys t in [0, n), with p_r at p + r p_stride and v_t (d
// elements of dtype t, d a multiple of kAvx512Columns) at rows[t] +
// row_offset bytes. acc_r is at acc + r d, in tile_pv_avx512_slot order for
// BF16 and element order otherwise. Call only when use_avx512().
void tile_pv_avx512(DType t, int32_t queries, const float* p, int32_t p_stride,
                    const char* const* rows, size_t row_offset, int32_t d, int32_t n, float* acc,
                    PrefetchStream& stream);

// The first step of a partition's online softmax for one query vector, 16
// lanes wide: row_max = the max of s[0, visible), s[t] = exp(s[t] - row_max)
// there and 0 in [visible, n), row_sum = their sum. As softmax_update_avx2
// from an empty row. With `scales` (8-bit KV: each key's V scale), s[t]
// is stored times scales[t], and row_sum stays the sum of the exps; scales
// past `visible` are not read. Call only when use_avx512().
void softmax_row_avx512(float* s, int32_t visible, int32_t n, float* row_max, float* row_sum,
                        const float* scales = nullptr);

// Where each element of a chunk of kAvx512Columns sits among a V pass's
// accumulators: slots[j] for element j.
using ChunkSlots = std::array<int32_t, kAvx512Columns>;

// dst[c + j] = src[c + slots[j]] for every chunk c of kAvx512Columns of the
// n floats at src (n a multiple of it): accumulators that a V pass kept in
// its own order, back to element order. Call only when use_avx512().
void chunks_to_element_order(const float* src, size_t n, const ChunkSlots& slots, float* dst);

#endif

// Where element j of a chunk of kAvx512Columns sits among the BF16 V pass's
// accumulators: a 512-bit load of 32 BF16 values widens to its 16 even
// elements and its 16 odd ones.
constexpr int32_t tile_pv_avx512_slot(int32_t j) { return (j % 2) * 16 + j / 2; }

// The table of slot(j) for j in [0, kAvx512Columns).
constexpr std::array<int32_t, kAvx512Columns> chunk_slots(int32_t (*slot)(int32_t)) {
  std::array<int32_t, kAvx512Columns> slots{};
  for (int32_t j = 0; j < kAvx512Columns; ++j) slots[size_t(j)] = slot(j);
  return slots;
}

}  // namespace baton::kernels::cpu
