// tests/engine/scattered_blocks.h — block tables that are not in id order.
//
// The block manager hands out its lowest free ids first, so tables built on a
// fresh pool are ascending runs and never test the paged kernels' indirection.
// This holds the lower half of the pool's ids, so the first reserves take
// ids from the upper half, and gives the held blocks back a few at a time in
// random order: every later reserve then takes a lower, scattered id.
#pragma once

#include <algorithm>
#include <random>
#include <vector>

#include "engine/block_manager.h"

namespace baton::engine::testing {

class ScatteredBlocks {
 public:
  ScatteredBlocks(BlockManager& manager, std::mt19937& rng) : manager_(manager) {
    auto all = manager.allocate(manager.num_free());  // ascending
    held_ = std::move(all).value();
    std::vector<int32_t> upper(held_.begin() + ptrdiff_t(held_.size() / 2), held_.end());
    held_.resize(held_.size() / 2);
    manager_.release(upper);
    std::shuffle(held_.begin(), held_.end(), rng);
  }
  ~ScatteredBlocks() { manager_.release(held_); }

  // Gives back `n` of the held blocks, random ones.
  void release_some(size_t n) {
    n = std::min(n, held_.size());
    std::vector<int32_t> back(held_.end() - ptrdiff_t(n), held_.end());
    held_.resize(held_.size() - n);
    manager_.release(back);
  }

 private:
  BlockManager& manager_;
  std::vector<int32_t> held_;  // lower-half ids, shuffled
};

// Whether some table lists a block before a lower-numbered one.
inline bool some_table_out_of_order(const std::vector<BlockTable>& tables) {
  return std::any_of(tables.begin(), tables.end(), [](const BlockTable& t) {
    return !std::is_sorted(t.blocks().begin(), t.blocks().end());
  });
}

}  // namespace baton::engine::testing
