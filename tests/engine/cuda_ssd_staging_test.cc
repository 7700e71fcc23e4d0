// The SSD tier's staging slots under a pool in device memory: blocks saved
// from the device through pinned slots come back into other blocks of it
// byte for byte (the round trip the CPU test runs with host memory).
#include <gtest/gtest.h>

#include <random>

#include "engine/engine.h"
#include "engine/ssd_staging.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/pool_copier.h"
#include "tests/cuda_device_check.h"
#include "tests/engine/greedy_options.h"
#include "tests/engine/ssd_staging_round_trip.h"
#include "tests/engine/temp_model.h"

namespace baton::engine {
namespace {

using kernels::cuda::DeviceBuffer;

class CudaSsdStagingTest : public ::testing::Test {
 protected:
  void SetUp() override { BATON_SKIP_WITHOUT_NVIDIA_GPU(); }
};

// The CUDA backend's pool: BF16, token-major keys; a small geometry and a
// Llama 3 8B block (8 KV heads of 128, 16 tokens, 32 layers: 2 MiB a block).
TEST_F(CudaSsdStagingTest, BlocksOfADevicePoolComeBackThroughPinnedSlots) {
  const uint64_t seed = std::random_device{}();
  for (const KvLayout layout : {KvLayout{.num_layers = 3,
                               .num_blocks = 40,
                               .block_size = 4,
                               .num_kv_heads = 2,
                               .head_dim = 64,
                               .dtype = DType::kBF16,
                               .key_order = KeyOrder::kTokenMajor},
                                KvLayout{.num_layers = 32,
                                .num_blocks = 28,
                                .block_size = 16,
                                .num_kv_heads = 8,
                                .head_dim = 128,
                                .dtype = DType::kBF16,
                                .key_order = KeyOrder::kTokenMajor}}) {
    for (const auto& [load, save] : {std::pair{1, 1}, {3, 2}, {64, 64}}) {
      SCOPED_TRACE(std::to_string(layout.num_layers) + " layers");
      auto pool = DeviceBuffer::allocate(layout.total_bytes());
      ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
      testing::PoolBytes bytes{.write =
                                   [&](const std::vector<uint8_t>& b) {
                                     ASSERT_TRUE(pool->copy_from_host(b.data(), b.size()).is_ok());
                                   },
                               .read =
                                   [&] {
                                     std::vector<uint8_t> b(layout.total_bytes());
                                     EXPECT_TRUE(pool->copy_to_host(b.data(), b.size()).is_ok());
                                     return b;
                                   }};
      auto copier = kernels::cuda::make_pool_copier(pool->data(), layout.total_bytes());
      ASSERT_TRUE(copier.is_ok()) << copier.status().to_string();
      testing::TempDir dir;
      testing::expect_ssd_round_trip_through_slots(layout, bytes, std::move(copier).value(),
                                                   dir.path(), SsdIo::kIoUring, load, save,
                                                   seed + uint64_t(load));
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// The slots are page-locked for the device's DMA.
TEST_F(CudaSsdStagingTest, SlotsArePinned) {
  const KvLayout layout{.num_layers = 2,
                        .num_blocks = 8,
                        .block_size = 16,
                        .num_kv_heads = 2,
                        .head_dim = 64,
                        .dtype = DType::kBF16,
                        .key_order = KeyOrder::kTokenMajor};
  auto pool = DeviceBuffer::allocate(layout.total_bytes());
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  auto copier = kernels::cuda::make_pool_copier(pool->data(), layout.total_bytes());
  ASSERT_TRUE(copier.is_ok()) << copier.status().to_string();
  auto staging = SsdStaging::create(layout, std::move(copier).value(), 4, 4);
  ASSERT_TRUE(staging.is_ok()) << staging.status().to_string();
  EXPECT_TRUE((*staging)->pinned());
}

// A whole engine on the device with an SSD tier: a prompt's blocks evicted
// to SSD and restored through the slots give the same tokens as the same
// blocks found in the pool (the same bytes, so the same computation after
// them).
TEST_F(CudaSsdStagingTest, AnEngineOnTheDeviceRestoresAPrefixFromSsd) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  testing::TempDir dir;
  const auto model = testing::make_preset_model(dir, "smollm2-135m", DType::kBF16, seed);
  auto random_prompt = [&](size_t n) {
    std::vector<int32_t> ids(n);
    for (auto& t : ids) t = int32_t(3 + rng() % 49000);
    return ids;
  };
  const std::vector<int32_t> p = random_prompt(64);
  std::vector<int32_t> w = p;
  for (int32_t t : random_prompt(4)) w.push_back(t);
  const std::vector<int32_t> filler = random_prompt(8 * 16 - 1);

  const GenerationOptions greedy = testing::greedy(12);
  auto run = [&](Engine& engine, const std::vector<int32_t>& prompt) {
    EXPECT_TRUE(engine.scheduler().add(prompt, greedy).is_ok());
    auto done = engine.run_to_completion();
    EXPECT_TRUE(done.is_ok()) << done.status().to_string();
    return done.is_ok() && done->size() == 1 ? (*done)[0]->output : std::vector<int32_t>{};
  };
  auto make = [&](int32_t blocks, bool ssd) {
    EngineConfig config;
    config.device = Device{.kind = Device::Kind::kCuda, .index = 0};
    config.block_size = 16;
    config.kv_cache_blocks = blocks;
    config.max_num_seqs = 1;
    config.enable_prefix_caching = true;
    if (ssd) {
      config.ssd_cache_dir = (dir.path() / "ssd").string();
      std::filesystem::create_directories(config.ssd_cache_dir);
      config.ssd_cache_bytes = uint64_t(256) << 20;
    }
    auto engine = Engine::create(model, config);
    EXPECT_TRUE(engine.is_ok()) << engine.status().to_string();
    return std::move(engine).value();
  };

  // p's blocks found in the pool.
  auto roomy = make(64, false);
  run(*roomy, p);
  const std::vector<int32_t> from_pool = run(*roomy, w);
  EXPECT_EQ(roomy->scheduler().stats().prefix_hit_tokens, 64);

  // p's blocks pushed out of an 8-block pool to SSD by a prompt that needs
  // every block, then read back.
  auto tight = make(8, true);
  ASSERT_NE(tight->scheduler().ssd_store(), nullptr);
  run(*tight, p);
  run(*tight, filler);
  const std::vector<int32_t> from_ssd = run(*tight, w);
  EXPECT_EQ(tight->scheduler().stats().prefix_ssd_hit_tokens, 64);
  EXPECT_EQ(from_ssd, from_pool);
  EXPECT_EQ(from_ssd.size(), 12u);
}

}  // namespace
}  // namespace baton::engine
