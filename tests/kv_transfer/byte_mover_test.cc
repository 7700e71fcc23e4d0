// The sender's byte movers without UCX traffic: which one each mode gets,
// and the in-place copy into a mapped pool, byte for byte and hashed. The
// movers that post UCX requests run in transfer_test.cc over real UCX, in
// every mode.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kv_transfer/byte_mover.h"

namespace baton::kv_transfer {
namespace {

// Three layers of eight BF16 blocks: small enough to check byte by byte.
constexpr KvLayout kLayout{.num_layers = 3,
                           .num_blocks = 8,
                           .block_size = 4,
                           .num_kv_heads = 2,
                           .head_dim = 8,
                           .dtype = DType::kBF16};

TEST(ByteMover, EachModeGetsItsOwnWayOfMovingBytes) {
  PoolDescriptor remote;
  remote.layout = kLayout;
  uint8_t mapped = 0;
  EXPECT_STREQ(make_byte_mover(TransferMode::kRma, nullptr, remote, nullptr, &mapped)->call(),
               "memcpy");
  EXPECT_TRUE(
      make_byte_mover(TransferMode::kRma, nullptr, remote, nullptr, &mapped)->copies_in_place());
  EXPECT_STREQ(make_byte_mover(TransferMode::kRma, nullptr, remote, nullptr, nullptr)->call(),
               "ucp_put_nbx");
  EXPECT_STREQ(make_byte_mover(TransferMode::kTag, nullptr, remote, nullptr, nullptr)->call(),
               "ucp_tag_send_nbx");
  EXPECT_STREQ(make_byte_mover(TransferMode::kAm, nullptr, remote, nullptr, nullptr)->call(),
               "ucp_am_send_nbx");
  for (TransferMode mode : {TransferMode::kRma, TransferMode::kTag, TransferMode::kAm})
    EXPECT_FALSE(make_byte_mover(mode, nullptr, remote, nullptr, nullptr)->copies_in_place());
}

TEST(ByteMover, AMappedCopyWritesTheRunsBlocksAndHashesEach) {
  const KvLayout& layout = kLayout;
  std::mt19937_64 rng(std::random_device{}());
  std::vector<uint8_t> source(layout.total_bytes()), peer_pool(layout.total_bytes());
  for (auto& b : source) b = uint8_t(rng());
  for (auto& b : peer_pool) b = uint8_t(rng());
  const std::vector<uint8_t> before = peer_pool;
  PoolDescriptor remote;
  remote.layout = layout;
  auto mover = make_byte_mover(TransferMode::kRma, nullptr, remote, nullptr, peer_pool.data());

  const int32_t layer = int32_t(rng() % 3), src_block = int32_t(rng() % 4),
                dst_block = int32_t(rng() % 4), count = 1 + int32_t(rng() % 4);
  const int32_t first_pair = 2;
  BlockHashes hashes(0, layout.num_layers, size_t(first_pair + count));
  BlockHashes expected(0, layout.num_layers, size_t(first_pair + count));
  const size_t bb = layout.block_bytes();
  const RunToMove run{.transfer_id = 5,
                      .layer = layer,
                      .dst_block = dst_block,
                      .count = count,
                      .src = source.data() + layout.block_byte_offset(layer, src_block),
                      .block_bytes = bb,
                      .hashes = &hashes,
                      .first_pair = first_pair};
  std::vector<uint8_t> header;
  EXPECT_EQ(mover->move(run, ucp_request_param_t{}, header), nullptr) << "done at once";
  for (int32_t k = 0; k < count; ++k) {
    const uint8_t* src = source.data() + layout.block_byte_offset(layer, src_block + k);
    expected.set(layer, size_t(first_pair + k), block_hash(src, bb));
  }
  EXPECT_EQ(hashes.digest(), expected.digest());
  // The run's blocks hold the source's bytes; every other byte is untouched.
  const size_t dst_begin = layout.block_byte_offset(layer, dst_block);
  const size_t dst_end = dst_begin + size_t(count) * bb;
  const size_t src_begin = layout.block_byte_offset(layer, src_block);
  for (size_t i = 0; i < peer_pool.size(); ++i) {
    const uint8_t want =
        i >= dst_begin && i < dst_end ? source[src_begin + (i - dst_begin)] : before[i];
    ASSERT_EQ(peer_pool[i], want) << "byte " << i;
  }
}

}  // namespace
}  // namespace baton::kv_transfer
