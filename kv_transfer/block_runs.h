// kv_transfer/block_runs.h — block lists to merged byte runs, and their checksum.
//
// Layer-major pools make a run of adjacent block ids one contiguous byte range
// per layer, K and V included. A BlockRun is a maximal stretch of the
// (src[i], dst[i]) pairs where both sides advance by one block: one put (or
// one active message) per run per layer.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/kv_layout.h"
#include "common/pool_copier.h"
#include "common/status.h"

namespace baton::kv_transfer {

struct BlockRun {
  int32_t src_block = 0;
  int32_t dst_block = 0;
  int32_t count = 0;
  int32_t first_pair = 0;  // index of the run's first (src, dst) pair
};

// Pairs src[i] -> dst[i] merged into maximal runs, order kept.
std::vector<BlockRun> merge_block_runs(std::span<const int32_t> src, std::span<const int32_t> dst);

// Where two pools' geometries differ (KvLayout::same_geometry), first
// difference first, "a" for `a`'s value, "b" for `b`'s: "layers: 30 against
// 32", "key order: token-major against grouped". Empty when they agree.
std::string geometry_difference(const KvLayout& a, const KvLayout& b);

// Same length, non-empty, every id inside its pool, no destination repeated.
Status validate_block_lists(std::span<const int32_t> src, const KvLayout& src_layout,
                            std::span<const int32_t> dst, const KvLayout& dst_layout);

// The transfer checksum: XXH3-64 of every (layer, block pair) block, folded
// in (layer, pair) order by one more XXH3 over those hashes. Per-block hashes
// make it independent of how blocks were merged and let the receiver hash each
// run as it lands (AM mode), so "all layers in" is not followed by one long
// pass over the whole request. Sender and receiver agree when the bytes do.
class BlockHashes {
 public:
  BlockHashes() = default;
  BlockHashes(int32_t layer_begin, int32_t layer_end, size_t num_pairs)
      : layer_begin_(layer_begin),
        num_pairs_(num_pairs),
        hashes_(size_t(layer_end - layer_begin) * num_pairs, 0),
        recorded_(hashes_.size(), false),
        recorded_in_layer_(size_t(layer_end - layer_begin), 0) {}
  // Records the hash of pair `pair`'s block in `layer` (block_hash of it).
  void set(int32_t layer, size_t pair, uint64_t hash) {
    const size_t i = size_t(layer - layer_begin_) * num_pairs_ + pair;
    hashes_[i] = hash;
    if (!recorded_[i]) {
      recorded_[i] = true;
      ++recorded_in_layer_[size_t(layer - layer_begin_)];
    }
  }
  uint64_t digest() const;
  // Whether every pair's block of `layer` has been recorded.
  bool layer_complete(int32_t layer) const {
    return recorded_in_layer_[size_t(layer - layer_begin_)] == num_pairs_;
  }
  // XXH3-64 of `layer`'s block hashes in pair order: what the layer messages
  // carry, so that a receiver can verify one layer before the rest.
  uint64_t layer_digest(int32_t layer) const;

 private:
  int32_t layer_begin_ = 0;
  size_t num_pairs_ = 0;
  std::vector<uint64_t> hashes_;
  std::vector<bool> recorded_;
  std::vector<size_t> recorded_in_layer_;
};

// XXH3-64 of one block, through xxhash's dispatcher (AVX2 where the CPU has it).
uint64_t block_hash(const uint8_t* block, size_t bytes);

}  // namespace baton::kv_transfer
