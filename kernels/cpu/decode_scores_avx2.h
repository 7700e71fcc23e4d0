// kernels/cpu/decode_scores_avx2.h — the 8-bit KV formats' decode score
// passes on AVX2, for CPUs without the AVX-512 extensions their own passes
// take (decode_scores_vnni.h, decode_scores_fp8.h).
//
// int8: the query vectors are quantized as for VNNI (quantize_queries) and
// multiplied in integers, so the scores equal the VNNI pass's bit for bit.
// AVX2 has no VPDPBUSD; VPMADDUBSW multiplies unsigned by signed bytes and
// adds pairs into 16 bits, so the query's magnitudes go in unsigned and its
// signs are moved onto the keys (VPSIGNB). A pair adds at most 2 x 127 x 127,
// which 16 bits hold; VPMADDWD against ones then sums a key's four
// dimensions into its 32-bit lane.
//
// E4M3: each code is moved into an F16 (its fields shifted into F16's, which
// hold every E4M3 value times 2^-8 exactly), widened with F16C and multiplied
// by the F32 query with FMAs: no rounding of the query, as the VDPBF16PS pass
// has.
//
// Each score comes out multiplied by its key's scale, read from the block.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/prefetch_stream.h"

namespace baton::kernels::cpu {

#if defined(__x86_64__) || defined(__i386__)

// int8 query codes as the AVX2 pass takes them: vector i's d / 4 words at
// + i * d / 4, four codes each in the order of its dimensions.
struct SignedQueryCodes {
  const uint32_t* codes = nullptr;       // the codes, signed
  const uint32_t* magnitudes = nullptr;  // their absolute values
  const float* scales = nullptr;         // as QueryCodes::scales
};

// codes[i] and magnitudes[i] for the `words` words of quantize_queries
// (each code plus 128). Call only when use_avx2().
void signed_query_codes(const uint32_t* words, size_t n, uint32_t* codes, uint32_t* magnitudes);

// s[r * s_stride + t] = scale_t (q_r · k_t) for `queries` (1..4) query
// vectors r (vector r's words at q.codes + r d / 4) and the keys [0, n8) of
// an int8 K tile k laid out as common/kv_layout.h says (group c of key t at
// byte c * group_stride + 4 t); n8 a multiple of 8, d of 8. Key t's scale
// is the float at byte k + scale_delta + 4 t. Call only when use_avx2().
void key_tile_scores_i8_avx2(int32_t queries, SignedQueryCodes q, int32_t d, const void* k,
                             size_t group_stride, ptrdiff_t scale_delta, int32_t n8, float* s,
                             int32_t s_stride, PrefetchStream& stream);

// The same for an E4M3 K tile (pair c of key t at byte c * group_stride +
// 2 t) and F32 query vectors (vector r at q + r d). Call only when
// use_avx2().
void key_tile_scores_e4m3_avx2(int32_t queries, const float* q, int32_t d, const void* k,
                               size_t group_stride, ptrdiff_t scale_delta, int32_t n8, float* s,
                               int32_t s_stride, PrefetchStream& stream);

#endif

}  // namespace baton::kernels::cpu
