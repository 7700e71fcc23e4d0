// engine.memory_fraction: a node's KV pool is its share of the memory it
// computes in, less its weights and its largest step's workspace.
#include "engine/memory_share.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>

#include "engine/engine.h"
#include "engine/host_memory.h"
#include "engine/make_model.h"
#include "tests/engine/temp_model.h"

namespace baton::engine {
namespace {

TEST(MemoryShare, ThePoolGetsWhatTheWeightsAndWorkspaceLeave) {
  const uint32_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 1000; ++i) {
    MemoryShare share;
    share.fraction = std::uniform_real_distribution<double>(1e-3, 1.0)(rng);
    share.memory = std::uniform_int_distribution<uint64_t>(1, uint64_t(200) << 30)(rng);
    const long double budget = std::floor((long double)share.fraction * share.memory);
    share.weights = std::uniform_int_distribution<uint64_t>(0, uint64_t(budget))(rng);
    share.workspace = std::uniform_int_distribution<uint64_t>(0, uint64_t(budget))(rng);
    const long double left = budget - share.weights - share.workspace;
    auto pool = pool_bytes_of_share(share, "cuda:0");
    if (left > 1) {
      ASSERT_TRUE(pool.is_ok()) << pool.status().to_string() << " seed " << seed;
      // The double product may round the last byte either way.
      EXPECT_NEAR(double(*pool), double(left), 1.0) << "seed " << seed;
    } else if (left < -1) {
      ASSERT_FALSE(pool.is_ok()) << "seed " << seed;
      const std::string message = pool.status().message();
      for (const std::string& said :
           {std::string("engine.memory_fraction"), std::string("cuda:0's"),
            bytes_text(share.memory), bytes_text(share.weights), bytes_text(share.workspace),
            std::string("nothing is left for the KV pool")})
        EXPECT_NE(message.find(said), std::string::npos) << said << " in " << message;
    }
  }
}

// The bytes of every tensor the checkpoint's safetensors files hold: each
// file less its 8-byte length and its JSON header.
uint64_t tensor_bytes_in(const std::filesystem::path& dir) {
  uint64_t bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    uint64_t header = 0;
    in.read(reinterpret_cast<char*>(&header), sizeof header);
    bytes += entry.file_size() - sizeof header - header;
  }
  return bytes;
}

class MemoryFractionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_dir_ = testing::make_preset_model(dir_, "tiny", DType::kF32, std::random_device{}());
    config_.threads = 1;
    config_.huge_page_weights = false;
    config_.block_size = 16;
    config_.max_num_batched_tokens = 512 + int32_t(std::random_device{}() % 1024);
    config_.max_num_seqs = 8;
    // Pools of a block hold a request.
    config_.max_model_len = 16;
    // The shape the engine reads, for the numbers below.
    EngineConfig probe = config_;
    probe.kv_cache_blocks = 1;
    auto engine = Engine::create(model_dir_, probe);
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    const ModelConfig& c = (*engine)->model().config();
    const uint64_t q = uint64_t(c.num_heads) * c.head_dim;
    const uint64_t kv = uint64_t(c.num_kv_heads) * c.head_dim;
    // F32 activations of the largest step: residual and normed rows, q, k,
    // v, attention output, gate and up.
    workspace_ =
        uint64_t(config_.max_num_batched_tokens) *
        (2 * uint64_t(c.hidden_size) + 2 * q + 2 * kv + 2 * uint64_t(c.intermediate_size)) *
        sizeof(float);
    block_bytes_ = 2 * uint64_t(c.num_layers) * kv * uint64_t(config_.block_size) * sizeof(float);
    weights_ = tensor_bytes_in(model_dir_);
    memory_ = host_memory_bytes();
    ASSERT_GT(memory_, 0u);
  }

  // The fraction of the host's memory that comes to `bytes`, give or take
  // a byte.
  double fraction_of(double bytes) const { return bytes / double(memory_); }

  testing::TempDir dir_;
  std::filesystem::path model_dir_;
  EngineConfig config_;
  uint64_t workspace_ = 0, block_bytes_ = 0, weights_ = 0, memory_ = 0;
};

TEST_F(MemoryFractionTest, APoolHoldsTheBlocksItsShareLeaves) {
  for (const int32_t blocks : {1, 3, 40}) {
    EngineConfig config = config_;
    config.memory_fraction =
        fraction_of(double(weights_ + workspace_) + (blocks + 0.5) * double(block_bytes_));
    auto engine = Engine::create(model_dir_, config);
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    EXPECT_EQ((*engine)->kv_pool().layout().num_blocks, blocks);
    EXPECT_EQ((*engine)->kv_pool().layout().total_bytes(), uint64_t(blocks) * block_bytes_);
    EXPECT_EQ((*engine)->model().backend().workspace_bytes(), workspace_);
    EXPECT_EQ((*engine)->model().backend().weights_bytes(), weights_);
  }
}

TEST_F(MemoryFractionTest, KvCacheBlocksOverridesIt) {
  EngineConfig config = config_;
  config.memory_fraction = fraction_of(double(weights_ + workspace_) + 20.5 * double(block_bytes_));
  config.kv_cache_blocks = 7;
  auto engine = Engine::create(model_dir_, config);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  EXPECT_EQ((*engine)->kv_pool().layout().num_blocks, 7);
}

// `created` failed, its message saying each of `said`.
void expect_refused_saying(const Result<std::unique_ptr<Engine>>& created,
                           std::initializer_list<std::string> said) {
  ASSERT_FALSE(created.is_ok());
  const std::string& message = created.status().message();
  for (const std::string& part : said)
    EXPECT_NE(message.find(part), std::string::npos) << part << " in " << message;
}

TEST_F(MemoryFractionTest, AShareTheWeightsAndWorkspaceFillIsRefusedWithTheNumbers) {
  EngineConfig config = config_;
  config.memory_fraction = fraction_of(double(weights_ + workspace_) - 4096);
  expect_refused_saying(
      Engine::create(model_dir_, config),
      {"engine.memory_fraction", "nothing is left for the KV pool", bytes_text(memory_)});

  // A pool of blocks that cannot hold one request: refused with the
  // numbers, not capped below what a router would admit.
  config.max_model_len = 100;
  config.memory_fraction = fraction_of(double(weights_ + workspace_) + 6.5 * double(block_bytes_));
  expect_refused_saying(Engine::create(model_dir_, config),
                        {"leaves a KV pool of", "96 tokens", "engine.max_model_len 100"});
  config.max_model_len = 96;
  auto engine = Engine::create(model_dir_, config);
  EXPECT_TRUE(engine.is_ok()) << engine.status().to_string();
  config.max_model_len = 16;

  // Less than a block left: refused, naming the setting.
  config.memory_fraction = fraction_of(double(weights_ + workspace_) + 0.5 * double(block_bytes_));
  expect_refused_saying(Engine::create(model_dir_, config),
                        {"engine.memory_fraction: ", "hold no KV block"});
}

// A step limit whose activations no process could hold is refused at start
// with the setting named, not a crash when the workspace is reserved (where
// the kernel would let a process map any size, it is not refused there).
TEST(EngineWorkspace, AnOutsizedStepIsRefusedNotACrash) {
  std::ifstream overcommit("/proc/sys/vm/overcommit_memory");
  int mode = -1;
  if (!(overcommit >> mode) || mode == 1) GTEST_SKIP() << "this kernel maps any size";
  testing::TempDir dir;
  auto model = model_preset("tiny");
  ASSERT_TRUE(model.is_ok());
  model->intermediate_size = 4096;
  const auto path = testing::make_model(dir, *model, "wide", DType::kF32, 3);
  EngineConfig config;
  config.threads = 1;
  config.huge_page_weights = false;
  config.kv_cache_blocks = 4;
  // 2^24 tokens of 4096 F32 activations: 256 GiB for one buffer.
  config.max_num_batched_tokens = 1 << 24;
  auto engine = Engine::create(path, config);
  ASSERT_FALSE(engine.is_ok());
  EXPECT_EQ(engine.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(engine.status().message().find("engine.max_num_batched_tokens"), std::string::npos)
      << engine.status().message();
}

}  // namespace
}  // namespace baton::engine
