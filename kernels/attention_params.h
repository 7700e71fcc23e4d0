// kernels/attention_params.h — the paged attention params every backend
// takes: one struct for prefill (many query rows per sequence) and decode
// (one), over the pool of common/kv_layout.h. Pointers are in the memory of
// the backend that runs the kernel (host for the CPU, device for CUDA).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "common/kv_layout.h"

namespace baton::kernels {

struct PagedAttentionParams {
  const void* q = nullptr;        // [num_query_rows, num_heads, head_dim]
  void* out = nullptr;            // [num_query_rows, num_heads, head_dim]
  DType qo_dtype = DType::kF32;   // of q and out: F32 on the CPU, the KV dtype on CUDA
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
  // > 0: sliding-window attention. A query at position p sees only the keys
  // at positions (p - window, p], as transformers' sliding-window mask does.
  int32_t window = 0;
};

// The first key a query at `position` sees: 0, or under a sliding window
// the first of its last `window` positions.
inline int32_t first_seen_key(int32_t position, int32_t window) {
  return window > 0 ? std::max(0, position - window + 1) : 0;
}

// Layer `layer`'s window in a list of them (> 0), or 0: none (no list, or
// a layer it does not reach).
inline int32_t layer_window(const std::vector<int32_t>& layer_windows, int32_t layer) {
  return layer >= 0 && size_t(layer) < layer_windows.size() ? layer_windows[size_t(layer)] : 0;
}

// The window every layer's reads fit in, from each layer's window (> 0) or
// none (0): the largest, where every layer has one; 0 where some layer (or,
// with no windows listed, every layer) attends to the whole context. Keys
// further back than this are read by no layer.
inline int32_t kv_window(const std::vector<int32_t>& layer_windows) {
  if (layer_windows.empty()) return 0;
  if (*std::min_element(layer_windows.begin(), layer_windows.end()) <= 0) return 0;
  return *std::max_element(layer_windows.begin(), layer_windows.end());
}

}  // namespace baton::kernels
