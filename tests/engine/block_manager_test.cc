#include "engine/block_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace baton::engine {
namespace {

TEST(BlockManager, AllocatesDistinctBlocksUntilExhausted) {
  BlockManager manager(10);
  auto a = manager.allocate(4);
  ASSERT_TRUE(a.is_ok());
  auto b = manager.allocate(6);
  ASSERT_TRUE(b.is_ok());
  std::set<int32_t> ids(a->begin(), a->end());
  ids.insert(b->begin(), b->end());
  EXPECT_EQ(ids.size(), 10u);
  EXPECT_EQ(*ids.begin(), 0);
  EXPECT_EQ(*ids.rbegin(), 9);
  EXPECT_EQ(manager.num_free(), 0);

  auto c = manager.allocate(1);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("out of KV blocks"), std::string::npos);

  manager.release(*a);
  EXPECT_EQ(manager.num_free(), 4);
  EXPECT_FALSE(manager.allocate(5).is_ok());  // all-or-nothing
  EXPECT_EQ(manager.num_free(), 4);
}

TEST(BlockManager, SharedBlocksFreeOnLastRelease) {
  BlockManager manager(3);
  auto a = manager.allocate(2);
  ASSERT_TRUE(a.is_ok());
  manager.add_ref((*a)[0]);
  EXPECT_EQ(manager.ref_count((*a)[0]), 2);
  manager.release(*a);
  EXPECT_EQ(manager.num_free(), 2);  // (*a)[0] still held by its second owner
  EXPECT_EQ(manager.ref_count((*a)[0]), 1);
  manager.release({(*a)[0]});
  EXPECT_EQ(manager.num_free(), 3);
}

TEST(BlockTable, ReservesOnlyWhatTokensNeed) {
  BlockManager manager(8);
  BlockTable table(4);
  ASSERT_TRUE(table.reserve(manager, 5).is_ok());  // 5 tokens -> 2 blocks
  EXPECT_EQ(table.blocks().size(), 2u);
  table.commit(5);
  ASSERT_TRUE(table.reserve(manager, 3).is_ok());  // 8 tokens still fit in 2
  EXPECT_EQ(table.blocks().size(), 2u);
  table.commit(3);
  ASSERT_TRUE(table.reserve(manager, 1).is_ok());
  EXPECT_EQ(table.blocks().size(), 3u);
  table.commit(1);
  EXPECT_EQ(table.num_tokens(), 9);
  EXPECT_EQ(table.slot_of(8), table.blocks()[2] * 4 + 0);
  EXPECT_EQ(table.slot_of(5), table.blocks()[1] * 4 + 1);

  EXPECT_EQ(table.reserve(manager, 100).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(table.blocks().size(), 3u);  // failed reserve changed nothing
  table.release(manager);
  EXPECT_EQ(manager.num_free(), 8);
  EXPECT_TRUE(table.blocks().empty());
}

// Sliding windows: the blocks wholly before a token go back, once each;
// release() then returns only the rest.
TEST(BlockTable, ReleasesTheBlocksBeforeAWindowOnce) {
  BlockManager manager(8);
  BlockTable table(4);
  ASSERT_TRUE(table.reserve(manager, 14).is_ok());  // 4 blocks
  table.commit(14);
  table.release_before(manager, 3);  // block 0 still holds token 3
  EXPECT_EQ(table.num_released(), 0);
  EXPECT_EQ(manager.num_free(), 4);
  table.release_before(manager, 9);  // blocks 0 and 1 wholly before token 9
  EXPECT_EQ(table.num_released(), 2);
  EXPECT_EQ(manager.num_free(), 6);
  EXPECT_EQ(manager.ref_count(table.blocks()[0]), 0);
  EXPECT_EQ(manager.ref_count(table.blocks()[2]), 1);
  table.release_before(manager, 5);  // behind what went already: nothing
  table.release_before(manager, -7);
  EXPECT_EQ(manager.num_free(), 6);
  EXPECT_EQ(table.slot_of(13), table.blocks()[3] * 4 + 1);  // positions stay aligned
  ASSERT_TRUE(table.reserve(manager, 3).is_ok());           // grows as ever
  table.commit(3);
  EXPECT_EQ(manager.num_free(), 5);
  table.release_before(manager, 1000);  // past the end: every block
  EXPECT_EQ(manager.num_free(), 8);
  table.release(manager);
  EXPECT_EQ(manager.num_free(), 8);
  EXPECT_EQ(table.num_released(), 0);
  for (int32_t b = 0; b < 8; ++b) EXPECT_EQ(manager.ref_count(b), 0);
}

// A remote prompt's blocks before its windows are never held: skipped, they
// count as released tokens, hold no block, and reserve() grows the table
// from there.
TEST(BlockTable, SkippedBlocksCountTheirTokensAndHoldNone) {
  BlockManager manager(8);
  BlockTable table(4);
  table.skip(3);
  EXPECT_EQ(table.num_tokens(), 12);
  EXPECT_EQ(table.num_released(), 3);
  EXPECT_EQ(manager.num_free(), 8);
  ASSERT_TRUE(table.reserve(manager, 6).is_ok());  // tokens 12..17: two blocks
  EXPECT_EQ(manager.num_free(), 6);
  ASSERT_EQ(table.blocks().size(), 5u);
  for (int32_t i = 0; i < 3; ++i) EXPECT_EQ(table.blocks()[size_t(i)], BlockTable::kSkippedBlock);
  table.commit(6);
  EXPECT_EQ(table.slot_of(13), table.blocks()[3] * 4 + 1);
  table.release_before(manager, 16);  // block 3 now wholly behind
  EXPECT_EQ(table.num_released(), 4);
  EXPECT_EQ(manager.num_free(), 7);
  table.release(manager);  // only the block still held goes back
  EXPECT_EQ(manager.num_free(), 8);
  for (int32_t b = 0; b < 8; ++b) EXPECT_EQ(manager.ref_count(b), 0);
}

TEST(BlockManager, HandsOutTheLowestFreeIdsInOrder) {
  BlockManager manager(16);
  auto a = manager.allocate(6);
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(*a, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  auto b = manager.allocate(4);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(*b, (std::vector<int32_t>{6, 7, 8, 9}));
  // Freed out of order from the middle of a sequence: the next prompt still
  // gets them back as one ascending run, then the untouched tail.
  manager.release({3, 4, 2});
  auto c = manager.allocate(5);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(*c, (std::vector<int32_t>{2, 3, 4, 10, 11}));
}

TEST(BlockManager, RandomAllocFreeNeverLosesABlock) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937 rng(seed);
  BlockManager manager(64);
  std::vector<std::vector<int32_t>> held;
  std::set<int32_t> free_ids;  // what the manager should hold free
  for (int32_t id = 0; id < 64; ++id) free_ids.insert(id);
  for (int step = 0; step < 2000; ++step) {
    if (held.empty() || rng() % 2) {
      const int32_t n = int32_t(rng() % 9);
      auto got = manager.allocate(n);
      ASSERT_EQ(got.is_ok(), n <= int32_t(free_ids.size()));
      if (!got.is_ok()) continue;
      // The n lowest free ids, ascending.
      const std::vector<int32_t> lowest(free_ids.begin(), std::next(free_ids.begin(), n));
      ASSERT_EQ(*got, lowest);
      for (int32_t id : lowest) free_ids.erase(id);
      held.push_back(*got);
    } else {
      size_t i = rng() % held.size();
      manager.release(held[i]);
      free_ids.insert(held[i].begin(), held[i].end());
      held.erase(held.begin() + std::ptrdiff_t(i));
    }
    size_t in_use = 0;
    std::set<int32_t> unique;
    for (auto& h : held) {
      in_use += h.size();
      unique.insert(h.begin(), h.end());
    }
    ASSERT_EQ(unique.size(), in_use);
    ASSERT_EQ(manager.num_free() + int32_t(in_use), 64);
  }
}

// A key for tests: its own hash, no parent, and these tokens.
struct TestKey {
  uint64_t hash;
  std::vector<int32_t> tokens;
  BlockKey key() const { return BlockKey{.hash = hash, .parent = 0, .tokens = tokens}; }
};

TEST(PrefixCache, ARegisteredBlockOutlivesItsOwnerAndIsShared) {
  BlockManager manager(4);
  auto a = manager.allocate(2);
  ASSERT_TRUE(a.is_ok());
  const TestKey k{11, {1, 2, 3, 4}};
  EXPECT_FALSE(manager.find(k.key()).has_value());
  manager.register_block((*a)[0], k.key());
  EXPECT_EQ(manager.find(k.key()), (*a)[0]);
  EXPECT_EQ(manager.num_cached(), 1);

  manager.release(*a);
  // Both free, and the registered one still findable.
  EXPECT_EQ(manager.num_free(), 4);
  ASSERT_EQ(manager.find(k.key()), (*a)[0]);
  manager.add_ref((*a)[0]);
  EXPECT_EQ(manager.ref_count((*a)[0]), 1);
  EXPECT_EQ(manager.num_free(), 3);
  // Held again: never handed to a new owner.
  auto rest = manager.allocate(3);
  ASSERT_TRUE(rest.is_ok());
  EXPECT_EQ(std::count(rest->begin(), rest->end(), (*a)[0]), 0);
  EXPECT_FALSE(manager.allocate(1).is_ok());
  manager.release(*rest);
  manager.release({(*a)[0]});
  EXPECT_EQ(manager.num_free(), 4);
}

TEST(PrefixCache, MatchesTheWholeKeyNotJustItsHash) {
  BlockManager manager(2);
  auto a = manager.allocate(1);
  ASSERT_TRUE(a.is_ok());
  manager.register_block((*a)[0], TestKey{7, {5, 6}}.key());
  // The same hash with other tokens, or another parent: a collision.
  EXPECT_FALSE(manager.find(TestKey{7, {5, 7}}.key()).has_value());
  const std::vector<int32_t> tokens{5, 6};
  EXPECT_FALSE(manager.find(BlockKey{.hash = 7, .parent = 1, .tokens = tokens}).has_value());
  EXPECT_TRUE(manager.find(TestKey{7, {5, 6}}.key()).has_value());
  // A second block with a registered key stays unregistered, and frees as such.
  auto b = manager.allocate(1);
  ASSERT_TRUE(b.is_ok());
  manager.register_block((*b)[0], TestKey{7, {5, 6}}.key());
  EXPECT_EQ(manager.find(TestKey{7, {5, 6}}.key()), (*a)[0]);
  EXPECT_EQ(manager.num_cached(), 1);
  manager.release(*a);
  manager.release(*b);
  EXPECT_EQ(manager.num_free(), 2);
}

TEST(PrefixCache, UnregisteredBlocksGoFirstThenTheLeastRecentlyReleased) {
  BlockManager manager(5);
  auto all = manager.allocate(5);
  ASSERT_TRUE(all.is_ok());
  // Blocks 0..2 registered; released in the order 2, 0, 1; then 3 and 4
  // (never registered).
  std::vector<TestKey> keys;
  for (int32_t i = 0; i < 3; ++i) {
    keys.push_back(TestKey{uint64_t(100 + i), {i}});
    manager.register_block((*all)[size_t(i)], keys.back().key());
  }
  for (int32_t i : {2, 0, 1, 3, 4}) manager.release({(*all)[size_t(i)]});
  EXPECT_EQ(manager.num_free(), 5);
  auto fresh = manager.allocate(2);
  ASSERT_TRUE(fresh.is_ok());
  EXPECT_EQ(*fresh, (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(manager.num_cached(), 3);
  // Now the cache gives way: block 2 first, which leaves it.
  auto next = manager.allocate(1);
  ASSERT_TRUE(next.is_ok());
  EXPECT_EQ((*next)[0], 2);
  EXPECT_FALSE(manager.find(keys[2].key()).has_value());
  EXPECT_EQ(manager.find(keys[0].key()), 0);
  EXPECT_EQ(manager.num_cached(), 2);
  // Sharing block 0 takes it off the eviction order: 1 goes next.
  manager.add_ref(0);
  auto last = manager.allocate(1);
  ASSERT_TRUE(last.is_ok());
  EXPECT_EQ((*last)[0], 1);
  EXPECT_FALSE(manager.allocate(1).is_ok());
  EXPECT_EQ(manager.num_free(), 0);
}

// The eviction hook (the SSD tier's way in) hears of each registered block
// an allocation takes out of the cache, with its key intact, before the
// allocation returns; never of never-registered blocks, nor of allocations
// that evict nothing.
TEST(PrefixCache, EvictionHookHearsOfEachEvictedBlockWithItsKey) {
  BlockManager manager(4);
  std::vector<std::pair<int32_t, TestKey>> heard;
  manager.set_eviction_hook([&](std::span<const BlockKey> keys, std::span<const int32_t> blocks) {
    ASSERT_EQ(keys.size(), blocks.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      heard.push_back(
          {blocks[i], TestKey{keys[i].hash, {keys[i].tokens.begin(), keys[i].tokens.end()}}});
      // Already out of the cache: no lookup finds it while it is saved.
      EXPECT_FALSE(manager.find(keys[i]).has_value());
    }
  });
  auto all = manager.allocate(4);
  ASSERT_TRUE(all.is_ok());
  std::vector<TestKey> keys;
  for (int32_t i = 0; i < 2; ++i) {
    keys.push_back(TestKey{uint64_t(200 + i), {10 * i, 10 * i + 1}});
    manager.register_block(i, keys.back().key());
  }
  manager.release({3, 2, 1, 0});  // 2 and 3 never registered; 1 released before 0
  ASSERT_TRUE(manager.allocate(2).is_ok());
  EXPECT_TRUE(heard.empty()) << "never-registered blocks go first, and silently";
  auto evicting = manager.allocate(2);
  ASSERT_TRUE(evicting.is_ok());
  ASSERT_EQ(heard.size(), 2u);
  EXPECT_EQ(heard[0].first, 1);
  EXPECT_EQ(heard[0].second.hash, keys[1].hash);
  EXPECT_EQ(heard[0].second.tokens, keys[1].tokens);
  EXPECT_EQ(heard[1].first, 0);
  EXPECT_EQ(heard[1].second.tokens, keys[0].tokens);
  EXPECT_FALSE(manager.registered(0));
  EXPECT_FALSE(manager.registered(1));
}

// Random allocations, releases, registrations and shares against a model of
// who holds what and which key finds which block: no block is lost, and a
// key finds its block exactly while the block is registered under it (never
// once it has been handed to a new owner).
TEST(PrefixCache, RandomUseNeverLosesABlockNorFindsAStaleOne) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  constexpr int32_t kBlocks = 24;
  BlockManager manager(kBlocks);
  std::vector<std::vector<int32_t>> owners;
  std::vector<TestKey> keys;
  std::map<size_t, int32_t> block_of_key;  // key index -> its registered block
  std::map<int32_t, size_t> key_of_block;  // the reverse
  for (int round = 0; round < 3000; ++round) {
    const int action = int(rng() % 4);
    if (action == 0) {
      auto got = manager.allocate(int32_t(rng() % 4));
      if (got.is_ok()) {
        for (int32_t b : *got) {  // a new owner: its registration, if any, is gone
          if (auto it = key_of_block.find(b); it != key_of_block.end()) {
            block_of_key.erase(it->second);
            key_of_block.erase(it);
          }
        }
        owners.push_back(*got);
      }
    } else if (action == 1 && !owners.empty()) {
      const size_t i = rng() % owners.size();
      manager.release(owners[i]);
      owners.erase(owners.begin() + ptrdiff_t(i));
    } else if (action == 2 && !owners.empty() && !owners.back().empty()) {
      const int32_t b = owners.back().back();
      keys.push_back(TestKey{uint64_t(keys.size() + 1), {int32_t(rng() % 50)}});
      manager.register_block(b, keys.back().key());
      if (!key_of_block.contains(b)) {  // a registered block keeps its first key
        block_of_key[keys.size() - 1] = b;
        key_of_block[b] = keys.size() - 1;
      }
    } else if (action == 3 && !keys.empty()) {
      if (auto block = manager.find(keys[rng() % keys.size()].key())) {
        manager.add_ref(*block);
        owners.push_back({*block});
      }
    }
    std::vector<int32_t> held(kBlocks, 0);
    for (const auto& o : owners)
      for (int32_t b : o) ++held[size_t(b)];
    int32_t free = 0;
    for (int32_t b = 0; b < kBlocks; ++b) {
      ASSERT_EQ(manager.ref_count(b), held[size_t(b)]) << "round " << round << ", block " << b;
      ASSERT_EQ(manager.registered(b), key_of_block.contains(b)) << "round " << round;
      free += held[size_t(b)] == 0 ? 1 : 0;
    }
    ASSERT_EQ(manager.num_free(), free);
    ASSERT_EQ(manager.num_cached(), int32_t(block_of_key.size()));
    for (size_t k = 0; k < keys.size(); ++k) {
      const auto it = block_of_key.find(k);
      ASSERT_EQ(manager.find(keys[k].key()),
                it == block_of_key.end() ? std::nullopt : std::optional<int32_t>(it->second))
          << "round " << round << ", key " << k;
    }
  }
}

}  // namespace
}  // namespace baton::engine
