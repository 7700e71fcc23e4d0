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

BlockManager::BlockManager(int32_t num_blocks)
    : ref_counts_(size_t(num_blocks), 0), registered_(size_t(num_blocks)) {
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
  std::vector<int32_t> evicted;
  for (auto& id : blocks) {
    id = take_free_block(evicted);
    BATON_CHECK(ref_counts_[size_t(id)] == 0);
    ref_counts_[size_t(id)] = 1;
  }
  if (!evicted.empty()) finish_eviction(evicted);
  // Evicted ids come in release order: sorted, any adjacent ones among
  // them still form runs.
  std::sort(blocks.begin(), blocks.end());
  return blocks;
}

int32_t BlockManager::take_free_block(std::vector<int32_t>& evicted) {
  if (!free_list_.empty()) {
    std::pop_heap(free_list_.begin(), free_list_.end(), kLowestFirst);
    const int32_t id = free_list_.back();
    free_list_.pop_back();
    return id;
  }
  // Evict the registered block released longest ago: its K/V is overwritten.
  const int32_t id = evictable_.front();
  evictable_.pop_front();
  by_hash_.erase(registered_[size_t(id)].hash);
  evicted.push_back(id);
  return id;
}

void BlockManager::finish_eviction(const std::vector<int32_t>& evicted) {
  if (eviction_hook_) {
    std::vector<BlockKey> keys;
    keys.reserve(evicted.size());
    for (int32_t id : evicted) {
      const Registration& r = registered_[size_t(id)];
      keys.push_back({.hash = r.hash, .parent = r.parent, .tokens = r.tokens});
    }
    eviction_hook_(keys, evicted);
  }
  for (int32_t id : evicted) registered_[size_t(id)] = Registration{};
}

void BlockManager::add_ref(int32_t block) {
  int32_t& count = ref_counts_.at(size_t(block));
  if (count == 0) {
    // Only a registered block is handed out while free (find()).
    Registration& r = registered_[size_t(block)];
    BATON_CHECK(!r.tokens.empty());
    evictable_.erase(r.evictable);
  }
  ++count;
}

void BlockManager::release(const std::vector<int32_t>& blocks) {
  for (int32_t id : blocks) {
    int32_t& count = ref_counts_.at(size_t(id));
    BATON_CHECK(count > 0);  // a double free is a bug, never input-driven
    if (--count > 0) continue;
    Registration& r = registered_[size_t(id)];
    if (!r.tokens.empty()) {
      r.evictable = evictable_.insert(evictable_.end(), id);
    } else {
      free_list_.push_back(id);
      std::push_heap(free_list_.begin(), free_list_.end(), kLowestFirst);
    }
  }
}

void BlockManager::register_block(int32_t block, const BlockKey& key) {
  BATON_CHECK(ref_counts_.at(size_t(block)) > 0 && !key.tokens.empty());
  Registration& r = registered_[size_t(block)];
  if (!r.tokens.empty() || by_hash_.contains(key.hash)) return;
  r.hash = key.hash;
  r.parent = key.parent;
  r.tokens.assign(key.tokens.begin(), key.tokens.end());
  by_hash_.emplace(key.hash, block);
}

std::optional<int32_t> BlockManager::find(const BlockKey& key) const {
  const auto it = by_hash_.find(key.hash);
  if (it == by_hash_.end()) return std::nullopt;
  const Registration& r = registered_[size_t(it->second)];
  if (r.parent != key.parent || !std::ranges::equal(r.tokens, key.tokens)) return std::nullopt;
  return it->second;
}

Status BlockTable::reserve(BlockManager& manager, int32_t n) {
  int32_t missing = blocks_needed(num_tokens_ + n) - int32_t(blocks_.size());
  if (missing <= 0) return Status::ok();
  BATON_ASSIGN_OR_RETURN(auto fresh, manager.allocate(missing));
  blocks_.insert(blocks_.end(), fresh.begin(), fresh.end());
  return Status::ok();
}

void BlockTable::share(BlockManager& manager, int32_t block) {
  BATON_CHECK(num_tokens_ == int32_t(blocks_.size()) * block_size_);
  manager.add_ref(block);
  blocks_.push_back(block);
  num_tokens_ += block_size_;
}

void BlockTable::commit(int32_t n) {
  BATON_CHECK(blocks_needed(num_tokens_ + n) <= int32_t(blocks_.size()));
  num_tokens_ += n;
}

void BlockTable::truncate(BlockManager& manager, int32_t blocks) {
  BATON_CHECK(blocks <= int32_t(blocks_.size()) && blocks * block_size_ <= num_tokens_ &&
              blocks >= num_released_);
  std::vector<int32_t> rest(blocks_.begin() + blocks, blocks_.end());
  std::reverse(rest.begin(), rest.end());  // the chain's tail first, as release()
  manager.release(rest);
  blocks_.resize(size_t(blocks));
  num_tokens_ = blocks * block_size_;
}

void BlockTable::release(BlockManager& manager) {
  // Last block first: a chain's tail is then evicted before its head, whose
  // loss would leave every later block of the chain unreachable.
  std::vector<int32_t> held(blocks_.begin() + num_released_, blocks_.end());
  std::reverse(held.begin(), held.end());
  manager.release(held);
  blocks_.clear();
  num_tokens_ = 0;
  num_released_ = 0;
}

void BlockTable::skip(int32_t n) {
  BATON_CHECK(n >= 0 && num_released_ == int32_t(blocks_.size()) &&
              num_tokens_ == int32_t(blocks_.size()) * block_size_);
  blocks_.insert(blocks_.end(), size_t(n), kSkippedBlock);
  num_released_ += n;
  num_tokens_ += n * block_size_;
}

void BlockTable::release_before(BlockManager& manager, int32_t first_needed) {
  const int32_t end = std::min(std::max(first_needed, 0) / block_size_, int32_t(blocks_.size()));
  if (end <= num_released_) return;
  manager.release(std::vector<int32_t>(blocks_.begin() + num_released_, blocks_.begin() + end));
  num_released_ = end;
}

}  // namespace baton::engine
