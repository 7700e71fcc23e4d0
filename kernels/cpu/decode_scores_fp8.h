// kernels/cpu/decode_scores_fp8.h — E4M3 KV's decode score pass with
// AVX-512 BF16.
//
// Every E4M3 value is a BF16 value (BF16 has E4M3's exponent range and more
// mantissa bits), so a K tile's codes become BF16 exactly through a table:
// VPERMI2B looks up the low and the high byte of each code's magnitude, the
// code's sign goes into the high byte, and two VPERMT2B interleave the
// bytes into BF16 words. An E4M3 K tile keeps a pair of dimensions of a key
// side by side (key_group_of(kFP8E4M3) = 2), so the words are the pairs
// VDPBF16PS takes: one instruction adds two products into each of 16 keys'
// lanes, against the query's pair broadcast. The query vectors are rounded
// to BF16 once per partition (bf16_query_pairs): an error of at most 2^-9
// of each element, where an E4M3 key carries up to 2^-4 of its own.
//
// Each score comes out multiplied by its key's scale, read from the block.
//
// Where VDPBF16PS is slow, or the CPU lacks it, the F32 FMA pass of
// decode_scores_e4m3_fma.h takes E4M3 scores instead.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/prefetch_stream.h"

namespace baton::kernels::cpu {

#if defined(__x86_64__) || defined(__i386__)

// pairs[c] = the BF16 values of q[2c] (low half) and q[2c + 1] (high half),
// rounded to nearest even, for c in [0, n / 2); n a multiple of 32. Call
// only when use_avx512_bf16_vbmi().
void bf16_query_pairs(const float* q, size_t n, uint32_t* pairs);

// s[r * s_stride + t] = scale_t (q_r · k_t) for `queries` (1..4) query
// vectors r (d / 2 pairs each, vector r's at q + r d / 2) and the keys
// [0, n8) of an E4M3 K tile k laid out as common/kv_layout.h says (pair c
// of key t at byte c * group_stride + 2 t); n8 a multiple of 8, d of 4. Key
// t's scale is the float at byte k + scale_delta + 4 t. Call only when
// use_avx512_bf16_vbmi().
void key_tile_scores_fp8(int32_t queries, const uint32_t* q, int32_t d, const void* k,
                         size_t group_stride, ptrdiff_t scale_delta, int32_t n8, float* s,
                         int32_t s_stride, PrefetchStream& stream);
// The same for a run of 16-key tiles: tiles[j] holds keys [16 j, 16 j + 16)
// of the run's keys [0, keys), all but the last tile full, and their scales
// at tiles[j] + scale_delta.
void key_run_scores_fp8(int32_t queries, const uint32_t* q, int32_t d, const char* const* tiles,
                        size_t group_stride, ptrdiff_t scale_delta, int32_t keys, float* s,
                        int32_t s_stride, PrefetchStream& stream);

#endif

}  // namespace baton::kernels::cpu
