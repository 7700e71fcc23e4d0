// kernels/cpu/decode_scores_vnni.h — int8 KV's decode score pass with
// AVX-512 VNNI.
//
// An int8 K tile keeps four dimensions of a key side by side
// (key_group_of(kI8) = 4), so one 64-byte load holds four dimensions of 16
// keys: VPDPBUSD multiplies them by four query codes broadcast and adds the
// four products into each key's lane. The query vectors are quantized to
// int8 once per partition (quantize_queries). VPDPBUSD takes its first
// operand unsigned, so the query codes go in plus 128, and 128 times each
// key's code sum (one more VPDPBUSD, against ones) comes out again.
//
// Each score comes out multiplied by its key's scale, read from the block.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/prefetch_stream.h"

namespace baton::kernels::cpu {

// The query vectors of a partition as VPDPBUSD takes them.
struct QueryCodes {
  // Vector i's d / 4 words at words + i * d / 4: four codes each, plus 128,
  // in the order of the vector's dimensions.
  const uint32_t* words = nullptr;
  // Vector i ~ its codes times scales[i] (max|q| / 127, or 0 for a zero
  // vector or one too small to invert).
  const float* scales = nullptr;
};

// Quantizes n_q vectors of d floats (d a multiple of 4) at q: code =
// nearbyint(q * 127 / max|q|), scale = max|q| / 127, as row_scale does for
// int8 KV rows (kernels/cpu/attention.h); a vector too small to invert gets
// zero codes and scale 0, one with an infinity or a NaN zero codes and scale
// NaN (it scores NaN, as in F32). words: n_q * d / 4, scales: n_q.
void quantize_queries(const float* q, int32_t n_q, int32_t d, uint32_t* words, float* scales);

#if defined(__x86_64__) || defined(__i386__)

// s[r * s_stride + t] = scale_t (q_r · k_t) for `queries` (1..4) query
// vectors r of `q` (codes of vectors 0..queries-1) and the keys [0, n8) of
// an int8 K tile k laid out as common/kv_layout.h says (group c of key t at
// c * group_stride + 4 t); n8 a multiple of 8, d of 4. Key t's scale is the
// float at byte k + scale_delta + 4 t. Call only when use_avx512_vnni().
void key_tile_scores_vnni(int32_t queries, QueryCodes q, int32_t d, const void* k,
                          size_t group_stride, ptrdiff_t scale_delta, int32_t n8, float* s,
                          int32_t s_stride, PrefetchStream& stream);
// The same for a run of 16-key tiles: tiles[j] holds keys [16 j, 16 j + 16)
// of the run's keys [0, keys), all but the last tile full, and their scales
// at tiles[j] + scale_delta.
void key_run_scores_vnni(int32_t queries, QueryCodes q, int32_t d, const char* const* tiles,
                         size_t group_stride, ptrdiff_t scale_delta, int32_t keys, float* s,
                         int32_t s_stride, PrefetchStream& stream);

#endif

}  // namespace baton::kernels::cpu
