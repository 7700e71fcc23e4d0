// tests/engine/ssd_staging_round_trip.h — blocks of a pool the CPU reaches
// only through a PoolCopier (a device's, or host memory standing in for
// one) saved to an SSD store through SsdStaging and read back into other
// blocks: the CPU test runs it with the host copier, the CUDA test with a
// device pool.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "common/prefix_hash.h"
#include "engine/ssd_kv_store.h"
#include "engine/ssd_staging.h"

namespace baton::engine::testing {

// How the test reaches the pool's bytes (the pool itself, or a device copy).
struct PoolBytes {
  std::function<void(const std::vector<uint8_t>&)> write;
  std::function<std::vector<uint8_t>()> read;
};

// Fills the pool with random bytes, saves 13 random blocks in batches of
// `save` slots, fills the pool afresh, reads the blocks back into 13 other
// blocks in pieces of `load` slots, and checks that those hold exactly the
// saved bytes and that nothing else of the pool changed.
inline void expect_ssd_round_trip_through_slots(const KvLayout& layout, const PoolBytes& pool,
                                                std::unique_ptr<PoolCopier> copier,
                                                const std::filesystem::path& dir, SsdIo io,
                                                int32_t load, int32_t save, uint64_t seed) {
  SCOPED_TRACE("seed " + std::to_string(seed) + ", " + std::to_string(load) + " load and " +
               std::to_string(save) + " save slots");
  ASSERT_GE(layout.num_blocks, 26);
  std::mt19937_64 rng(seed);
  auto random_bytes = [&] {
    std::vector<uint8_t> bytes(layout.total_bytes());
    for (auto& b : bytes) b = uint8_t(rng());
    return bytes;
  };
  std::vector<int32_t> ids(size_t(layout.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const std::vector<int32_t> saved(ids.begin(), ids.begin() + 13);
  const std::vector<int32_t> restored(ids.begin() + 13, ids.begin() + 26);
  // Keys: one chain of blocks of random tokens.
  std::vector<int32_t> tokens(size_t(13 * layout.block_size));
  for (auto& t : tokens) t = int32_t(rng() % 50000);
  std::vector<BlockKey> keys;
  uint64_t parent = kNoParent;
  for (size_t i = 0; i < 13; ++i) {
    const auto span = std::span<const int32_t>(tokens).subspan(i * size_t(layout.block_size),
                                                               size_t(layout.block_size));
    keys.push_back(
        BlockKey{.hash = prefix_block_hash(parent, span), .parent = parent, .tokens = span});
    parent = keys.back().hash;
  }

  auto store = SsdKvStore::create(dir, uint64_t(64) << 20, layout, io);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  auto staging = SsdStaging::create(layout, std::move(copier), load, save);
  ASSERT_TRUE(staging.is_ok()) << staging.status().to_string();
  SsdStaging& slots = **staging;

  const std::vector<uint8_t> before = random_bytes();
  pool.write(before);
  const std::span<const int32_t> save_slots = slots.save_slots();
  ASSERT_EQ(save_slots.size(), size_t(save));
  for (size_t at = 0; at < saved.size(); at += save_slots.size()) {
    const size_t n = std::min(save_slots.size(), saved.size() - at);
    ASSERT_TRUE(slots.copy_out(std::span(saved).subspan(at, n), save_slots.first(n)).is_ok());
    (*store)->save(std::span(keys).subspan(at, n), slots.memory(), save_slots.first(n));
  }
  ASSERT_EQ((*store)->stats().saved_blocks, 13);

  const std::vector<uint8_t> refilled = random_bytes();
  pool.write(refilled);
  for (size_t at = 0; at < restored.size();) {
    const int32_t n = std::min(slots.free_load_slots(), int32_t(restored.size() - at));
    ASSERT_EQ(n, std::min<int32_t>(load, int32_t(restored.size() - at)));
    const std::vector<int32_t> taken = slots.take_load_slots(n);
    // Asynchronously, as the tier restores (with io_uring the kernel writes
    // the slots after start_load returns).
    const int64_t id =
        (*store)->start_load(std::span(keys).subspan(at, size_t(n)), slots.memory(), taken);
    std::vector<SsdKvStore::LandedLoad> landed;
    while (landed.empty()) landed = (*store)->finish_loads(/*wait=*/true);
    ASSERT_EQ(landed.size(), 1u);
    ASSERT_EQ(landed[0].id, id);
    const SsdLoad& got = landed[0].result;
    ASSERT_TRUE(got.problem.is_ok()) << got.problem.to_string();
    ASSERT_EQ(got.restored, n);
    ASSERT_TRUE(slots.copy_in(taken, std::span(restored).subspan(at, size_t(n))).is_ok());
    slots.give_back(taken);
    at += size_t(n);
  }

  std::vector<uint8_t> want = refilled;
  const size_t block_bytes = layout.block_bytes();
  for (size_t i = 0; i < saved.size(); ++i) {
    for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
      std::copy_n(before.begin() + ptrdiff_t(layout.block_byte_offset(layer, saved[i])),
                  block_bytes,
                  want.begin() + ptrdiff_t(layout.block_byte_offset(layer, restored[i])));
    }
  }
  const std::vector<uint8_t> after = pool.read();
  ASSERT_EQ(after.size(), want.size());
  size_t wrong = 0;
  for (size_t b = 0; b < want.size(); ++b) wrong += after[b] != want[b];
  EXPECT_EQ(wrong, 0u) << "bytes of the pool that differ from the saved blocks in their new "
                          "places and the rest untouched";
}

}  // namespace baton::engine::testing
