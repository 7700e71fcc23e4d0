// kernels/cpu/attention.h — causal GQA attention over the paged KV pool.
//
// One params struct serves prefill (many query rows per sequence, tiled with
// an online softmax, never a full score matrix) and decode (one query row per
// sequence). Query head h reads KV head h / (num_heads / num_kv_heads); each
// KV head is loaded once for its whole group of query heads.
#pragma once

#include <cstdint>

#include "common/kv_layout.h"
#include "kernels/attention_params.h"
#include "kernels/cpu/thread_pool.h"

namespace baton::kernels::cpu {

// Keys per decode partition (rounded up to whole blocks): small enough to
// spread one long context over many cores, large enough that merging
// partials (n_q x head_dim floats each) costs ~1% of reading the keys.
// Benchmarks that walk the partitions as paged_attention does use it too.
inline constexpr int32_t kDecodePartitionTokens = 256;

// How one K or V row of head_dim values is quantized: code = value *
// inverse, rounded (to nearest even) to the format, and value ~ code *
// scale. scale = max|row| / quantized_max(dtype), so the largest element
// maps onto the format's largest code, and inverse = quantized_max / max|row|.
// A zero row, or one so small that inverse is not finite, gets 0 and 0; a
// row with a NaN gets scale NaN and inverse 0 (it reads back as NaN).
// Unquantized formats get 1 and 1.
struct RowScale {
  float scale = 1.0f;
  float inverse = 1.0f;
};
RowScale row_scale(DType dtype, const float* row, int32_t n);

// Writes this step's K and V rows into their slots of layer `layer`.
// k, v: [num_tokens, layout.num_kv_heads, layout.head_dim] F32, converted to
// layout.dtype (quantized per row and KV head as row_scale says, the scales
// written beside the block's tiles). slot_mapping: [num_tokens], slot =
// block_id * block_size + offset.
void store_kv(ThreadPool& pool, const KvLayout& layout, void* kv_pool, int32_t layer,
              const float* k, const float* v, const int32_t* slot_mapping, int64_t num_tokens);

// The params every backend's paged attention takes (kernels/attention_params.h).
using kernels::PagedAttentionParams;

// Dispatches per sequence: one query row takes the decode path, more take
// the tiled prefill path. Every output row is written.
void paged_attention(ThreadPool& pool, const PagedAttentionParams& params);

// How paged_attention takes the query vectors of a sequence of q_len rows
// against `layout`'s keys (each vector scaled first): kI8, as int8 codes
// (quantize_queries in decode_scores_vnni.h), for int8 KV's decode rows on
// CPUs with AVX2; kBF16, rounded to BF16 (bf16_query_pairs in
// decode_scores_fp8.h), for E4M3 KV's decode rows on CPUs with AVX-512 BF16
// and VBMI that prefer VDPBF16PS (e4m3_scores_on_fmas() false); otherwise
// kF32, as they are.
DType decode_query_format(const KvLayout& layout, int32_t q_len);

}  // namespace baton::kernels::cpu
