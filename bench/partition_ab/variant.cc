// One side of partition_ab, compiled once with BATON_AB_SIDE=a and once with
// BATON_AB_SIDE=b: the decode partition kernel of BATON_AB_SOURCE, its
// 512-bit tile passes (BATON_AB_TILES_SOURCE), its VDPBF16PS V pass
// (BATON_AB_BF16_SOURCE) and its 8-bit score passes (BATON_AB_VNNI_SOURCE,
// BATON_AB_FP8_SOURCE, BATON_AB_E4M3_FMA_SOURCE, BATON_AB_AVX2_SCORES_SOURCE),
// by default this tree's attention_decode.cc, decode_tiles_avx512.cc,
// attention_decode_avx512.cc, decode_scores_vnni.cc, decode_scores_fp8.cc,
// decode_scores_e4m3_fma.cc and decode_scores_avx2.cc,
// under names ending in _a or _b, so two versions of them link into one
// program.
#ifndef BATON_AB_SOURCE
#define BATON_AB_SOURCE "kernels/cpu/attention_decode.cc"
#endif
#ifndef BATON_AB_TILES_SOURCE
#define BATON_AB_TILES_SOURCE "kernels/cpu/decode_tiles_avx512.cc"
#endif
#ifndef BATON_AB_BF16_SOURCE
#define BATON_AB_BF16_SOURCE "kernels/cpu/attention_decode_avx512.cc"
#endif
#ifndef BATON_AB_VNNI_SOURCE
#define BATON_AB_VNNI_SOURCE "kernels/cpu/decode_scores_vnni.cc"
#endif
#ifndef BATON_AB_FP8_SOURCE
#define BATON_AB_FP8_SOURCE "kernels/cpu/decode_scores_fp8.cc"
#endif
#ifndef BATON_AB_E4M3_FMA_SOURCE
#define BATON_AB_E4M3_FMA_SOURCE "kernels/cpu/decode_scores_e4m3_fma.cc"
#endif
#ifndef BATON_AB_AVX2_SCORES_SOURCE
#define BATON_AB_AVX2_SCORES_SOURCE "kernels/cpu/decode_scores_avx2.cc"
#endif
#define BATON_AB_PASTE(name, side) name##_##side
#define BATON_AB_NAME(name, side) BATON_AB_PASTE(name, side)
#define attend_decode_partition BATON_AB_NAME(attend_decode_partition, BATON_AB_SIDE)
#define decode_partition_supported BATON_AB_NAME(decode_partition_supported, BATON_AB_SIDE)
#define decode_partition_start BATON_AB_NAME(decode_partition_start, BATON_AB_SIDE)
#define decode_partition_avx512 BATON_AB_NAME(decode_partition_avx512, BATON_AB_SIDE)
#define e4m3_scores_on_fmas BATON_AB_NAME(e4m3_scores_on_fmas, BATON_AB_SIDE)
// Each side's prefetch stream is its own class, so that a change to
// prefetch_stream.h is compared too, and the templates taking it (the AVX2
// tile passes of key_tile_scores.h among them) are each side's own
// instantiations. Every function taking a stream is therefore the side's
// own, which is why each side compiles all three sources.
#define PrefetchStream BATON_AB_NAME(PrefetchStream, BATON_AB_SIDE)
#define key_tile_scores_avx512 BATON_AB_NAME(key_tile_scores_avx512, BATON_AB_SIDE)
#define key_run_scores_avx512 BATON_AB_NAME(key_run_scores_avx512, BATON_AB_SIDE)
#define tile_pv_avx512 BATON_AB_NAME(tile_pv_avx512, BATON_AB_SIDE)
#define chunks_to_element_order BATON_AB_NAME(chunks_to_element_order, BATON_AB_SIDE)
#define softmax_row_avx512 BATON_AB_NAME(softmax_row_avx512, BATON_AB_SIDE)
#include BATON_AB_TILES_SOURCE
#define softmax_split_bf16 BATON_AB_NAME(softmax_split_bf16, BATON_AB_SIDE)
#define tile_pv_bf16_avx512 BATON_AB_NAME(tile_pv_bf16_avx512, BATON_AB_SIDE)
#include BATON_AB_BF16_SOURCE
#define quantize_queries BATON_AB_NAME(quantize_queries, BATON_AB_SIDE)
#define key_tile_scores_vnni BATON_AB_NAME(key_tile_scores_vnni, BATON_AB_SIDE)
#define key_run_scores_vnni BATON_AB_NAME(key_run_scores_vnni, BATON_AB_SIDE)
#include BATON_AB_VNNI_SOURCE
#define bf16_query_pairs BATON_AB_NAME(bf16_query_pairs, BATON_AB_SIDE)
#define key_tile_scores_fp8 BATON_AB_NAME(key_tile_scores_fp8, BATON_AB_SIDE)
#define key_run_scores_fp8 BATON_AB_NAME(key_run_scores_fp8, BATON_AB_SIDE)
// Before the FP8 source: revisions before the FMA pass's own file define
// its functions there (and have no E4M3 FMA source: empty).
#define key_tile_scores_e4m3_fma BATON_AB_NAME(key_tile_scores_e4m3_fma, BATON_AB_SIDE)
#define key_run_scores_e4m3_fma BATON_AB_NAME(key_run_scores_e4m3_fma, BATON_AB_SIDE)
#include BATON_AB_FP8_SOURCE
#include BATON_AB_E4M3_FMA_SOURCE
#define signed_query_codes BATON_AB_NAME(signed_query_codes, BATON_AB_SIDE)
#define key_tile_scores_i8_avx2 BATON_AB_NAME(key_tile_scores_i8_avx2, BATON_AB_SIDE)
#define key_tile_scores_e4m3_avx2 BATON_AB_NAME(key_tile_scores_e4m3_avx2, BATON_AB_SIDE)
#include BATON_AB_AVX2_SCORES_SOURCE
#include BATON_AB_SOURCE
