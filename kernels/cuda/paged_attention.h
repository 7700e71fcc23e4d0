// kernels/cuda/paged_attention.h — batched paged attention on the device,
// FlashInfer's kernels over Baton's pool in the token-major key order
// (KeyOrder::kTokenMajor, FlashInfer's "HND" pages with K and V of a block
// side by side).
//
// A step is planned once (its host arrays uploaded, FlashInfer's scheduler
// run) and then serves every layer: append_kv writes the step's K and V,
// run attends. Steps where every sequence has one query row take the decode
// kernel (split-KV, so one long sequence still fills the device); others take
// the causal ragged prefill kernel, where a chunk attends to the context
// already in the pool (chunked prefill, prefix hits and KV received from
// another node are all that case).
//
// Sliding windows (Shape::layer_windows): each layer masks the keys outside
// its rows' windows. Where every layer has one, a step's plan leaves out each
// sequence's blocks wholly behind the widest window of its first row: the
// engine gives those blocks back as the sequence runs (BlockTable::
// release_before), so they may hold another sequence's KV, or nothing yet.
//
// Plain C++ (no CUDA headers); BF16 queries, outputs and KV; head_dim 64 or 128.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "kernels/attention_params.h"

namespace baton::kernels::cuda {

// Device memory PagedAttention::create allocates for FlashInfer's scheduler
// and split-KV partials.
inline constexpr size_t kPagedAttentionWorkspaceBytes = size_t(136) << 20;

class PagedAttention {
 public:
  struct Shape {
    int32_t num_heads = 0;  // query heads, a multiple of num_kv_heads
    int32_t num_kv_heads = 0;
    int32_t head_dim = 0;  // 64 or 128
    int32_t block_size = 0;
    // Per layer, > 0: the layer's sliding window (PagedAttentionParams::
    // window); 0: it attends to the whole context. Empty: no layer has one.
    std::vector<int32_t> layer_windows;
  };
  // Workspaces on the current device.
  static Result<std::unique_ptr<PagedAttention>> create(const Shape& shape);
  virtual ~PagedAttention() = default;

  // Plans a step from the host arrays of `plan` (num_seqs, query_start,
  // context_lens, block_tables, and layout.num_blocks, which every block id
  // must be below; q, out and kv_pool are not read) and uploads them on
  // `stream`. The previous step's work on `stream` must be done.
  virtual Status plan(const PagedAttentionParams& plan, void* stream) = 0;
  // Writes K and V of the planned step's tokens into layer `layer` of `pool`:
  // token t's heads at k + t * row_stride (and v alike), BF16.
  virtual Status append_kv(const KvLayout& layout, void* pool, int32_t layer, const void* k,
                           const void* v, int64_t row_stride, void* stream) = 0;
  // The planned step's attention for layer p.layer: p.q and p.out device
  // pointers, [tokens, num_heads, head_dim] BF16; p.kv_pool the device pool;
  // p.window the layer's window in Shape::layer_windows.
  virtual Status run(const PagedAttentionParams& p, void* stream) = 0;
  // Whether the planned step takes the decode kernel.
  virtual bool planned_decode() const = 0;
};

}  // namespace baton::kernels::cuda
