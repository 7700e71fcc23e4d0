#include "engine/block_manager.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <string>

#include "common/check.h"

namespace baton::engine {

namespace {
// The heap's order: its front is the lowest id.
constexpr std::greater<int32_t> kLowestFirst;
}  // namespace

BlockManager::BlockManager(int32_t num_blocks) : ref_counts_(size_t(num_blocks), 0) {
  free_list_.resize(size_t(num_blocks));
  std::iota(free_list_.begin(), free_list_.end(), 0);  // ascending: already a heap
}

Result<std::vector<int32_t>> BlockManager::allocate(int32_t n) {
  if (n < 0) return invalid_argument("negative block count");
  if (n > num_free()) {
    return resource_exhausted("out of KV blocks: need " + std::to_string(n) + ", " +
                              std::to_string(num_free()) + " free of " +
                              std::to_string(num_blocks()));
  }
  std::vector<int32_t> blocks(static_cast<size_t>(n));
  for (auto& id : blocks) {
    std::pop_heap(free_list_.begin(), free_list_.end(), kLowestFirst);
    id = free_list_.back();
    free_list_.pop_back();
    BATON_CHECK(ref_counts_[size_t(id)] == 0);
    ref_counts_[size_t(id)] = 1;
  }
  return blocks;
}

void BlockManager::add_ref(int32_t block) {
  BATON_CHECK(ref_counts_.at(size_t(block)) > 0);
  ++ref_counts_[size_t(block)];
}

void BlockManager::release(const std::vector<int32_t>& blocks) {
  for (int32_t id : blocks) {
    int32_t& count = ref_counts_.at(size_t(id));
    BATON_CHECK(count > 0);  // a double free is a bug, never input-driven
    if (--count == 0) {
      free_list_.push_back(id);
      std::push_heap(free_list_.begin(), free_list_.end(), kLowestFirst);
    }
  }
}

Status BlockTable::reserve(BlockManager& manager, int32_t n) {
  int32_t missing = blocks_needed(num_tokens_ + n) - int32_t(blocks_.size());
  if (missing <= 0) return Status::ok();
  BATON_ASSIGN_OR_RETURN(auto fresh, manager.allocate(missing));
  blocks_.insert(blocks_.end(), fresh.begin(), fresh.end());
  return Status::ok();
}

void BlockTable::commit(int32_t n) {
  BATON_CHECK(blocks_needed(num_tokens_ + n) <= int32_t(blocks_.size()));
  num_tokens_ += n;
}

void BlockTable::release(BlockManager& manager) {
  manager.release(blocks_);
  blocks_.clear();
  num_tokens_ = 0;
}

}  // namespace baton::engine
