// engine/block_manager.h — who owns which KV block.
//
// Blocks are reference counted because the prefix cache shares full blocks
// between sequences. A BlockTable is one sequence's ordered list of block ids
// plus its token count; growing it may fail with ResourceExhausted, which the
// scheduler handles (wait or preempt) — it is never fatal.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace baton::engine {

class BlockManager {
 public:
  explicit BlockManager(int32_t num_blocks);

  int32_t num_blocks() const { return int32_t(ref_counts_.size()); }
  int32_t num_free() const { return int32_t(free_list_.size()); }
  int32_t ref_count(int32_t block) const { return ref_counts_.at(size_t(block)); }

  // n fresh blocks with reference count 1, or ResourceExhausted (nothing
  // taken): the n lowest free ids, in ascending order.
  Result<std::vector<int32_t>> allocate(int32_t n);
  // Another owner for a block already in use (prefix sharing).
  void add_ref(int32_t block);
  // Drops one reference per id; a block with none left becomes free.
  void release(const std::vector<int32_t>& blocks);

 private:
  std::vector<int32_t> ref_counts_;
  // A min-heap of the free ids. Lowest first keeps a sequence's blocks in
  // runs of adjacent ids, and so of adjacent memory, wherever the pool is not
  // fragmented: a prompt's blocks are taken at once (a decode node reserves
  // all of a transferred prompt's), and freed sequences leave runs behind.
  // Decode attention then reads K and V as long streams instead of scattered
  // pieces of a few KiB, and a KV transfer moves one range per run
  // (kv_transfer/block_runs.h). A recently freed block is no warmer in cache
  // than any other: one block spans every layer, megabytes apart.
  std::vector<int32_t> free_list_;
};

// One sequence's blocks in token order.
class BlockTable {
 public:
  explicit BlockTable(int32_t block_size) : block_size_(block_size) {}

  int32_t block_size() const { return block_size_; }
  int32_t num_tokens() const { return num_tokens_; }
  const std::vector<int32_t>& blocks() const { return blocks_; }
  // Blocks needed to hold `tokens` tokens in total.
  int32_t blocks_needed(int32_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  // Makes room for `n` more tokens, allocating blocks as needed; on
  // ResourceExhausted nothing changed.
  Status reserve(BlockManager& manager, int32_t n);
  // Records that `n` reserved slots now hold tokens.
  void commit(int32_t n);
  // Slot (block_id * block_size + offset) of token position `pos`.
  int32_t slot_of(int32_t pos) const {
    return blocks_[size_t(pos / block_size_)] * block_size_ + pos % block_size_;
  }
  // Returns every block to the manager; the table is empty afterwards.
  void release(BlockManager& manager);

 private:
  int32_t block_size_;
  int32_t num_tokens_ = 0;
  std::vector<int32_t> blocks_;
};

}  // namespace baton::engine
