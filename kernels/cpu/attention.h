// kernels/cpu/attention.h — causal GQA attention over the paged KV pool.
//
// One params struct serves prefill (many query rows per sequence, tiled with
// an online softmax, never a full score matrix) and decode (one query row per
// sequence). Query head h reads KV head h / (num_heads / num_kv_heads); each
// KV head is loaded once for its whole group of query heads.
#pragma once

#include <cstdint>

#include "common/kv_layout.h"
#include "kernels/cpu/thread_pool.h"

namespace baton::kernels::cpu {

// Keys per decode partition (rounded up to whole blocks): small enough to
// spread one long context over many cores, large enough that merging
// partials (n_q x head_dim floats each) costs ~1% of reading the keys.
// Benchmarks that walk the partitions as paged_attention does use it too.
inline constexpr int32_t kDecodePartitionTokens = 256;

// Writes this step's K and V rows into their slots of layer `layer`.
// k, v: [num_tokens, layout.num_kv_heads, layout.head_dim] F32, converted to
// layout.dtype. slot_mapping: [num_tokens], slot = block_id * block_size + offset.
void store_kv(ThreadPool& pool, const KvLayout& layout, void* kv_pool, int32_t layer,
              const float* k, const float* v, const int32_t* slot_mapping, int64_t num_tokens);

struct PagedAttentionParams {
  const float* q = nullptr;       // [num_query_rows, num_heads, head_dim]
  float* out = nullptr;           // [num_query_rows, num_heads, head_dim]
  const void* kv_pool = nullptr;  // laid out as `layout`
  KvLayout layout;
  int32_t layer = 0;
  int32_t num_heads = 0;  // query heads; a multiple of layout.num_kv_heads
  int32_t num_seqs = 0;
  // [num_seqs + 1]: sequence s owns query rows [query_start[s], query_start[s+1]).
  const int32_t* query_start = nullptr;
  // [num_seqs]: tokens of s in the cache, this step's included. The query rows
  // of s are its last positions: row j sits at position context_len - q_len + j
  // and attends to positions [0, that position].
  const int32_t* context_lens = nullptr;
  // [num_seqs, block_table_stride]: block ids of s in token order.
  const int32_t* block_tables = nullptr;
  int32_t block_table_stride = 0;
  float scale = 1.0f;  // usually 1 / sqrt(head_dim)
};

// Dispatches per sequence: one query row takes the decode path, more take
// the tiled prefill path. Every output row is written.
void paged_attention(ThreadPool& pool, const PagedAttentionParams& params);

}  // namespace baton::kernels::cpu
