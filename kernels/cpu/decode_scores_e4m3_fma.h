// kernels/cpu/decode_scores_e4m3_fma.h — E4M3 KV's decode score pass on
// AVX-512 F32 FMAs.
//
// Each pair of a K tile's codes is widened instead of multiplied in BF16: a
// code shifted into an F16 word (its value times 2^-8), VCVTPH2PS to F32,
// and FMAs against the F32 query vectors, each lane one dimension of a key,
// the pair joined at the end; exact products, F32 sums. It needs AVX-512 F,
// BW and VL alone, so CPUs without AVX-512 BF16 or VBMI (Skylake-X, Cascade
// Lake, Ice Lake) take it, and so do those where VDPBF16PS is slow (Intel
// issues a quarter as many as 512-bit FMAs; decode_scores_fp8.h has the
// VDPBF16PS pass).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/prefetch_stream.h"

namespace baton::kernels::cpu {

#if defined(__x86_64__) || defined(__i386__)

// s[r * s_stride + t] = scale_t (q_r · k_t) for `queries` (1..4) F32 query
// vectors r (vector r at q + r d) and the keys [0, n8) of an E4M3 K tile k
// laid out as common/kv_layout.h says (pair c of key t at byte c *
// group_stride + 2 t); n8 a multiple of 8, d of 4. Key t's scale is the
// float at byte k + scale_delta + 4 t. Call only when use_avx512().
void key_tile_scores_e4m3_fma(int32_t queries, const float* q, int32_t d, const void* k,
                              size_t group_stride, ptrdiff_t scale_delta, int32_t n8, float* s,
                              int32_t s_stride, PrefetchStream& stream);
// The same for a run of 16-key tiles: tiles[j] holds keys [16 j, 16 j + 16)
// of the run's keys [0, keys), all but the last tile full, and their scales
// at tiles[j] + scale_delta.
void key_run_scores_e4m3_fma(int32_t queries, const float* q, int32_t d, const char* const* tiles,
                             size_t group_stride, ptrdiff_t scale_delta, int32_t keys, float* s,
                             int32_t s_stride, PrefetchStream& stream);

#endif

}  // namespace baton::kernels::cpu
