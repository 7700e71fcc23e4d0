// The SSD tier's staging slots (engine/ssd_staging.h) on the CPU, with the
// host-memory copier standing in for a device's.
#include "engine/ssd_staging.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "engine/kv_pool.h"
#include "tests/engine/ssd_staging_round_trip.h"
#include "tests/engine/temp_model.h"

namespace baton::engine {
namespace {

KvLayout layout_of(DType dtype, int32_t layers, int32_t blocks) {
  return KvLayout{.num_layers = layers,
                  .num_blocks = blocks,
                  .block_size = 4,
                  .num_kv_heads = 2,
                  .head_dim = 8,
                  .dtype = dtype};
}

// Every format (the 8-bit ones carry their scales in the block), one layer
// and several, with slots from one of each up.
TEST(SsdStagingTest, BlocksComeBackThroughFewSlotsExactly) {
  const uint64_t seed = std::random_device{}();
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kI8, DType::kFP8E4M3}) {
    for (const int32_t layers : {1, 3}) {
      for (const SsdIo io : {SsdIo::kPlain, SsdIo::kIoUring}) {
        for (const auto& [load, save] : {std::pair{1, 1}, {3, 2}, {13, 13}, {64, 64}}) {
          SCOPED_TRACE(std::string(dtype_name(dtype)) + ", " + std::to_string(layers) +
                       " layers, " + (io == SsdIo::kPlain ? "preadv" : "io_uring"));
          const KvLayout layout = layout_of(dtype, layers, 40);
          auto pool = KvPool::create(layout);
          ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
          testing::PoolBytes bytes{.write =
                                       [&](const std::vector<uint8_t>& b) {
                                         std::memcpy(pool->data(), b.data(), b.size());
                                       },
                                   .read =
                                       [&] {
                                         const auto* at = static_cast<const uint8_t*>(pool->data());
                                         return std::vector<uint8_t>(at, at + pool->bytes());
                                       }};
          testing::TempDir dir;
          testing::expect_ssd_round_trip_through_slots(
              layout, bytes, make_host_pool_copier(pool->data(), pool->bytes()), dir.path(), io,
              load, save, seed + uint64_t(load));
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(SsdStagingTest, NeedsACopierAndASlotOfEachKind) {
  const KvLayout layout = layout_of(DType::kBF16, 2, 8);
  auto pool = KvPool::create(layout);
  ASSERT_TRUE(pool.is_ok());
  auto copier = [&] { return make_host_pool_copier(pool->data(), pool->bytes()); };
  EXPECT_EQ(SsdStaging::create(layout, nullptr, 1, 1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SsdStaging::create(layout, copier(), 0, 1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SsdStaging::create(layout, copier(), 1, 0).status().code(),
            StatusCode::kInvalidArgument);
  auto staging = SsdStaging::create(layout, copier(), 2, 3);
  ASSERT_TRUE(staging.is_ok()) << staging.status().to_string();
  EXPECT_EQ((*staging)->bytes(), 5 * size_t(layout.num_layers) * layout.block_bytes());
  EXPECT_EQ((*staging)->free_load_slots(), 2);
  const std::vector<int32_t> taken = (*staging)->take_load_slots(2);
  EXPECT_EQ((*staging)->free_load_slots(), 0);
  EXPECT_EQ(taken, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(std::vector<int32_t>((*staging)->save_slots().begin(), (*staging)->save_slots().end()),
            (std::vector<int32_t>{2, 3, 4}))
      << "save slots apart from the load slots";
  (*staging)->give_back(taken);
  EXPECT_EQ((*staging)->free_load_slots(), 2);
}

}  // namespace
}  // namespace baton::engine
