// kv_transfer/block_runs.h — block lists to merged byte runs, and their checksum.
//
// Layer-major pools make a run of adjacent block ids one contiguous byte range
// per layer, K and V included. A BlockRun is a maximal stretch of the
// (src[i], dst[i]) pairs where both sides advance by one block: one put (or
// one active message) per run per layer.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/kv_layout.h"
#include "common/status.h"

namespace baton::kv_transfer {

struct BlockRun {
  int32_t src_block = 0;
  int32_t dst_block = 0;
  int32_t count = 0;
};

// Pairs src[i] -> dst[i] merged into maximal runs, order kept.
std::vector<BlockRun> merge_block_runs(std::span<const int32_t> src, std::span<const int32_t> dst);

// Same length, non-empty, every id inside its pool, no destination repeated.
Status validate_block_lists(std::span<const int32_t> src, const KvLayout& src_layout,
                            std::span<const int32_t> dst, const KvLayout& dst_layout);

// Streaming XXH3-64 over the bytes of `blocks` for layers [layer_begin,
// layer_end), layer by layer, blocks in list order. Sender (over source
// blocks) and receiver (over destination blocks) get the same value when the
// bytes arrived intact, whatever the merging.
class KvChecksum {
 public:
  KvChecksum();
  ~KvChecksum();
  KvChecksum(const KvChecksum&) = delete;
  KvChecksum& operator=(const KvChecksum&) = delete;
  void add_layer(const uint8_t* pool, const KvLayout& layout, int32_t layer,
                 std::span<const BlockRun> runs, bool source_side);
  uint64_t digest() const;

 private:
  void* state_;  // XXH3_state_t, kept out of this header
};

uint64_t checksum_blocks(const uint8_t* pool, const KvLayout& layout,
                         std::span<const int32_t> blocks, int32_t layer_begin, int32_t layer_end);

}  // namespace baton::kv_transfer
