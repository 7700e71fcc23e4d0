#include "engine/block_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
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

}  // namespace
}  // namespace baton::engine
