// A KV pool in CUDA memory moved over UCX through fewer host slots than it
// has blocks (the staging path; kernels/cuda/pool_copier.h), against a peer process on
// loopback, both directions. Skips on the declared capability check without
// a device.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <optional>
#include <random>

#include "kernels/cuda/device.h"
#include "kernels/cuda/pool_copier.h"
#include "kv_transfer/transfer_engine.h"
#include "tests/cuda_device_check.h"
#include "tests/kv_transfer/kv_test_util.h"

namespace baton::kv_transfer {
namespace {

using namespace std::chrono_literals;
using testing::Child;

KvLayout layout() {
  return KvLayout{.num_layers = 4,
                  .num_blocks = 64,
                  .block_size = 16,
                  .num_kv_heads = 4,
                  .head_dim = 128,
                  .dtype = DType::kBF16};
}

// The host slots the device pool is staged through: fewer than its blocks.
constexpr int32_t kSlots = 40;

// This process's node: a pool in device memory, staged.
struct CudaNode {
  kernels::cuda::DeviceBuffer pool;
  std::unique_ptr<TransferEngine> engine;
  std::mutex mutex;
  std::condition_variable cv;
  std::optional<TransferResult> result;

  Status start(const std::vector<uint8_t>& contents) {
    BATON_ASSIGN_OR_RETURN(pool, kernels::cuda::DeviceBuffer::allocate(contents.size()));
    BATON_RETURN_IF_ERROR(pool.copy_from_host(contents.data(), contents.size()));
    BATON_ASSIGN_OR_RETURN(std::unique_ptr<PoolCopier> copier,
                           kernels::cuda::make_pool_copier(pool.data(), pool.bytes()));
    TransferConfig config;
    config.ucx_env["UCX_TLS"] = "tcp";
    config.ucx_env["UCX_NET_DEVICES"] = "lo";
    config.pool_memory = PoolMemory::kCuda;
    config.node_name = "cuda-node";
    config.staging_blocks = kSlots;
    BATON_ASSIGN_OR_RETURN(engine, TransferEngine::create(config, layout(), pool.data(),
                                                          pool.bytes(), std::move(copier)));
    return Status::ok();
  }
  TransferCallback callback() {
    return [this](const TransferResult& r) {
      std::lock_guard lock(mutex);
      result = r;
      cv.notify_all();
    };
  }
  std::optional<TransferResult> wait() {
    std::unique_lock lock(mutex);
    cv.wait_for(lock, 20s, [&] { return result.has_value(); });
    return result;
  }
};

class CudaStagedTransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BATON_SKIP_WITHOUT_NVIDIA_GPU();
    seed_ = std::random_device{}() | 1;
    std::printf("seed %llu\n", (unsigned long long)seed_);
    rng_.seed(seed_);
  }
  // A staged peer process over TCP; `seed` 0: it receives.
  std::unique_ptr<Child> spawn(uint64_t seed, uint64_t peer_seed) {
    const KvLayout l = layout();
    return std::make_unique<Child>(std::vector<std::string>{
        testing::transfer_peer_binary(BATON_TRANSFER_PEER), "tcp", "auto",
        std::to_string(l.num_layers), std::to_string(l.num_blocks), std::to_string(l.block_size),
        std::to_string(l.num_kv_heads), std::to_string(l.head_dim), "bf16", std::to_string(seed),
        std::to_string(peer_seed), std::to_string(l.num_blocks), "1", "0", "1"});
  }
  PeerId connect(CudaNode& node, Child& child) {
    auto desc = child.wait_for("DESC ");
    EXPECT_TRUE(desc.has_value());
    if (!desc) return 0;
    auto peer = node.engine->add_peer(testing::from_hex(desc->substr(5)));
    EXPECT_TRUE(peer.is_ok()) << peer.status().to_string();
    child.send("PEER " + testing::to_hex(node.engine->descriptor()));
    EXPECT_TRUE(child.wait_for("PEER_OK").has_value());
    return peer.is_ok() ? *peer : 0;
  }
  static std::string join(const std::vector<int32_t>& v) {
    std::string s;
    for (int32_t x : v) {
      s += ' ';
      s += std::to_string(x);
    }
    return s;
  }
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

TEST_F(CudaStagedTransferTest, DevicePoolSendsLayerByLayer) {
  const KvLayout l = layout();
  std::vector<uint8_t> contents(l.total_bytes());
  testing::fill_pattern(contents.data(), contents.size(), seed_);
  CudaNode node;
  ASSERT_TRUE(node.start(contents).is_ok());
  // The slots page-locked for the device's DMA (cudaHostRegister); else
  // every copy runs through pageable memory, slower.
  EXPECT_NE(node.engine->staging().find("through 40 pinned host slots"), std::string::npos)
      << node.engine->staging();
  auto receiver = spawn(0, seed_);
  PeerId peer = connect(node, *receiver);
  auto src = testing::random_blocks(rng_, l.num_blocks, 24);
  auto dst = testing::random_blocks(rng_, l.num_blocks, 24);
  receiver->send("EXPECT 1 1 0 4 10000 24" + join(src) + join(dst));
  ASSERT_TRUE(receiver->wait_for("EXPECT_OK"));
  ASSERT_TRUE(
      node.engine->begin_send(peer, {1, 1, src, dst, 0, 4, 10000ms}, node.callback()).is_ok());
  for (int32_t layer = 1; layer <= 4; ++layer) {
    ASSERT_TRUE(node.engine->post_layers(1, layer).is_ok());
  }
  auto sent = node.wait();
  ASSERT_TRUE(sent.has_value());
  EXPECT_TRUE(sent->status.is_ok()) << sent->status.to_string();
  auto w = testing::split(receiver->wait_for("RECV 1 ").value_or(""));
  ASSERT_EQ(w.size(), 6u);
  EXPECT_EQ(w[2], "0");
  EXPECT_EQ(w[5], "1") << "the receiver's bytes differ from the device pool's";
  receiver->quit();
}

TEST_F(CudaStagedTransferTest, DevicePoolReceivesEveryByteAndNothingElse) {
  const KvLayout l = layout();
  std::vector<uint8_t> poison(l.total_bytes(), testing::kPoison);
  CudaNode node;
  ASSERT_TRUE(node.start(poison).is_ok());
  auto sender = spawn(seed_, 0);
  connect(node, *sender);
  auto src = testing::random_blocks(rng_, l.num_blocks, 24);
  auto dst = testing::random_blocks(rng_, l.num_blocks, 24);
  std::vector<int32_t> slots;
  ASSERT_TRUE(node.engine->expect({2, 2, dst, 1, 4, 10000ms}, node.callback(), &slots).is_ok());
  for (int32_t slot : slots) EXPECT_TRUE(slot >= 0 && slot < kSlots) << slot;
  sender->send("SEND 2 2 0 1 4 10000 0 24" + join(src) + join(slots));
  auto got = node.wait();
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->status.is_ok()) << got->status.to_string();
  std::vector<uint8_t> pool(l.total_bytes());
  ASSERT_TRUE(node.pool.copy_to_host(pool.data(), pool.size()).is_ok());
  std::vector<uint8_t> want = poison, sender_pool(l.total_bytes());
  testing::fill_pattern(sender_pool.data(), sender_pool.size(), seed_);
  for (int32_t layer = 1; layer < 4; ++layer) {
    for (size_t i = 0; i < src.size(); ++i) {
      std::copy_n(sender_pool.begin() + l.block_byte_offset(layer, src[i]), l.block_bytes(),
                  want.begin() + l.block_byte_offset(layer, dst[i]));
    }
  }
  EXPECT_TRUE(pool == want) << "device pool differs from the sender's blocks (or poison)";
  sender->quit();
}

}  // namespace
}  // namespace baton::kv_transfer
