// Codecs, run merging and lane-table parsing, in-process (no UCX traffic).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>
#include <string>

#include <xxhash.h>

#include "kv_transfer/block_runs.h"
#include "kv_transfer/transfer_config.h"
#include "kv_transfer/ucx_probe.h"
#include "kv_transfer/wire.h"

namespace baton::kv_transfer {
namespace {

KvLayout layout() {
  KvLayout l;
  l.num_layers = 3;
  l.num_blocks = 10;
  l.block_size = 16;
  l.num_kv_heads = 2;
  l.head_dim = 8;
  l.dtype = DType::kBF16;
  return l;
}

PoolDescriptor descriptor() {
  PoolDescriptor d;
  d.worker_address = {1, 2, 3, 4, 5};
  d.pool_base = 0x7f0012345000;
  d.layout = layout();
  d.pool_bytes = d.layout.total_bytes();
  d.rkey = {9, 8, 7};
  return d;
}

TEST(WireTest, DescriptorRoundTrips) {
  auto bytes = encode_descriptor(descriptor());
  auto d = decode_descriptor(bytes);
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ(d->worker_address, descriptor().worker_address);
  EXPECT_EQ(d->pool_base, descriptor().pool_base);
  EXPECT_EQ(d->rkey, descriptor().rkey);
  EXPECT_TRUE(d->layout.same_geometry(layout()));
  EXPECT_EQ(d->layout.num_blocks, 10);
  EXPECT_EQ(d->flags, 0u);
  PoolDescriptor staged = descriptor();
  staged.flags = kPoolFlagStaged;
  auto staged_back = decode_descriptor(encode_descriptor(staged));
  ASSERT_TRUE(staged_back.is_ok()) << staged_back.status().to_string();
  EXPECT_EQ(staged_back->flags, kPoolFlagStaged);

  // The key order travels too: a GPU pool never pairs with a CPU one unseen.
  PoolDescriptor rows = descriptor();
  rows.layout.key_order = KeyOrder::kTokenMajor;
  auto back = decode_descriptor(encode_descriptor(rows));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->layout.key_order, KeyOrder::kTokenMajor);
  EXPECT_FALSE(back->layout.same_geometry(layout()));
  auto bad = encode_descriptor(descriptor());
  bad[bad.size() - 5] = 7;  // the key order byte, before the flags
  EXPECT_FALSE(decode_descriptor(bad).is_ok());

  // More blocks or layers than the data tags can name: refused, not aliased.
  for (const auto& [blocks, layers] :
       {std::pair{kMaxBlocks + 1, 2}, std::pair{10, kMaxLayers + 1}}) {
    PoolDescriptor huge = descriptor();
    huge.layout.num_blocks = blocks;
    huge.layout.num_layers = layers;
    huge.pool_bytes = huge.layout.total_bytes();
    auto refused = decode_descriptor(encode_descriptor(huge));
    EXPECT_EQ(refused.status().code(), StatusCode::kDataLoss) << blocks << " blocks, " << layers;
  }
  PoolDescriptor largest = descriptor();
  largest.layout.num_blocks = kMaxBlocks;
  largest.layout.num_layers = kMaxLayers;
  largest.pool_bytes = largest.layout.total_bytes();
  EXPECT_TRUE(decode_descriptor(encode_descriptor(largest)).is_ok());
}

TEST(WireTest, NoticeAndAckRoundTrip) {
  Notice n{WireKind::kNotice, 7, 8, 1, 3, 4, 6, 12345, 0xdeadbeefcafeull, 0, kNoticeFlagAmData};
  auto back = decode_notice(encode_notice(n));
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ(back->kind, WireKind::kNotice);
  EXPECT_EQ(back->checksum, n.checksum);
  EXPECT_EQ(back->flags, kNoticeFlagAmData);
  n.kind = WireKind::kAck;
  n.status_code = uint32_t(StatusCode::kDataLoss);
  back = decode_notice(encode_notice(n));
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ(back->kind, WireKind::kAck);
  EXPECT_EQ(back->status_code, uint32_t(StatusCode::kDataLoss));
  // The put grants and layer messages share the layout and keep their kind.
  for (WireKind kind : {WireKind::kPutAsk, WireKind::kPutGrant, WireKind::kPutsStopped,
                        WireKind::kLayerLanded, WireKind::kLayerHash}) {
    n.kind = kind;
    n.status_code = uint32_t(StatusCode::kAborted);
    back = decode_notice(encode_notice(n));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(back->kind, kind);
    EXPECT_EQ(back->transfer_id, n.transfer_id);
    EXPECT_EQ(back->layer_end, n.layer_end);
    EXPECT_EQ(back->status_code, uint32_t(StatusCode::kAborted));
  }
  // An unknown kind in the same layout is refused, named as a notice.
  auto bytes = encode_notice(n);
  bytes[6] = 10;
  EXPECT_FALSE(decode_notice(bytes).is_ok());
}

TEST(WireTest, RejectsTruncationAndCorruptionNamingTheMessage) {
  auto bytes = encode_descriptor(descriptor());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto d = decode_descriptor(std::span(bytes).first(n));
    ASSERT_FALSE(d.is_ok()) << n;
    EXPECT_EQ(d.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(d.status().message().find("pool descriptor"), std::string::npos);
  }
  auto bad = bytes;
  bad[0] ^= 1;
  EXPECT_NE(decode_descriptor(bad).status().message().find("magic"), std::string::npos);
  bad = bytes;
  bad[4] = 9;  // version
  EXPECT_NE(decode_descriptor(bad).status().message().find("version"), std::string::npos);
  bad = bytes;
  bad.push_back(0);
  EXPECT_NE(decode_descriptor(bad).status().message().find("trailing"), std::string::npos);
  auto notice = encode_notice(Notice{});
  notice.pop_back();
  EXPECT_NE(decode_notice(notice).status().message().find("truncated"), std::string::npos);
}

// Thousands of random and mutated byte strings: every one decodes to a value
// or an error, none crashes (run under the sanitizer build too), and what
// decodes is what its bytes say: encoded again, it gives the same bytes.
TEST(WireTest, FuzzedBytesNeverCrash) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint8_t>> seeds = {encode_descriptor(descriptor()),
                                             encode_notice(Notice{}),
                                             encode_data_header(DataHeader{1, 2, 3, 4})};
  int accepted = 0;
  for (int i = 0; i < 6000; ++i) {
    std::vector<uint8_t> b;
    if (i % 3 == 0) {
      b.resize(rng() % 96);
      for (auto& x : b) x = uint8_t(rng());
    } else {
      b = seeds[rng() % seeds.size()];
      int flips = 1 + int(rng() % 4);
      for (int f = 0; f < flips && !b.empty(); ++f) b[rng() % b.size()] = uint8_t(rng());
      if (rng() % 2) b.resize(rng() % (b.size() + 1));
    }
    if (auto d = decode_descriptor(b); d.is_ok()) {
      ++accepted;
      EXPECT_EQ(encode_descriptor(*d), b) << "descriptor, input " << i;
    }
    if (auto n = decode_notice(b); n.is_ok()) {
      ++accepted;
      EXPECT_EQ(encode_notice(*n), b) << "notice, input " << i;
    }
    if (auto h = decode_data_header(b); h.is_ok()) {
      ++accepted;
      EXPECT_EQ(encode_data_header(*h), b) << "data header, input " << i;
    }
  }
  // Mutations that keep a message valid (a changed id or count) are common.
  EXPECT_GT(accepted, 100) << "the round trip was checked on too few inputs";
}

TEST(BlockRunsTest, MergesOnlyWhereBothSidesAreAdjacent) {
  std::vector<int32_t> src = {4, 5, 6, 9, 10, 2};
  std::vector<int32_t> dst = {0, 1, 3, 4, 5, 6};
  auto runs = merge_block_runs(src, dst);
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0].count, 2);  // 4,5 -> 0,1
  EXPECT_EQ(runs[1].count, 1);  // 6 -> 3 (dst jumps)
  EXPECT_EQ(runs[2].count, 2);  // 9,10 -> 4,5
  EXPECT_EQ(runs[3].src_block, 2);
}

// The byte ranges a staged pool copies between its blocks and its host
// slots: a map from each pool byte to its host byte, built block by block
// (independently of the merging), must equal the ranges', which must not
// overlap on either side and be maximal (no two in a row adjacent on both
// sides). Slots drawn at random, and in the blocks' order (runs merge).
TEST(BlockRunsTest, ByteRangesPairEachBlockWithItsSlotMergedMaximally) {
  const KvLayout l = layout();
  std::mt19937_64 rng(std::random_device{}());
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> blocks(l.num_blocks);
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    blocks.resize(1 + rng() % l.num_blocks);
    KvLayout host = l;
    host.num_blocks = int32_t(blocks.size() + rng() % 4);
    std::vector<int32_t> slots(host.num_blocks);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    slots.resize(blocks.size());
    if (trial % 2 == 0) {  // slot order = block order: adjacent blocks, adjacent slots
      std::vector<int32_t> sorted = blocks;
      std::sort(sorted.begin(), sorted.end());
      for (size_t i = 0; i < blocks.size(); ++i)
        slots[i] =
            int32_t(std::lower_bound(sorted.begin(), sorted.end(), blocks[i]) - sorted.begin());
    }
    const int32_t lb = int32_t(rng() % l.num_layers);
    const int32_t le = lb + 1 + int32_t(rng() % (l.num_layers - lb));
    std::vector<int64_t> want(l.total_bytes(), -1), got(l.total_bytes(), -1);
    for (int32_t layer = lb; layer < le; ++layer) {
      for (size_t i = 0; i < blocks.size(); ++i) {
        const size_t at = l.block_byte_offset(layer, blocks[i]);
        const size_t to = host.block_byte_offset(layer, slots[i]);
        for (size_t k = 0; k < l.block_bytes(); ++k) want[at + k] = int64_t(to + k);
      }
    }
    auto ranges = block_byte_ranges(l, blocks, host, slots, lb, le);
    std::vector<bool> host_used(host.total_bytes(), false);
    for (size_t r = 0; r < ranges.size(); ++r) {
      const PoolCopier::Range& range = ranges[r];
      ASSERT_LE(range.offset + range.bytes, l.total_bytes());
      ASSERT_LE(range.host_offset + range.bytes, host.total_bytes());
      if (r > 0) {
        const PoolCopier::Range& prev = ranges[r - 1];
        ASSERT_FALSE(prev.offset + prev.bytes == range.offset &&
                     prev.host_offset + prev.bytes == range.host_offset)
            << "ranges " << r - 1 << " and " << r << " could be one";
      }
      for (size_t k = 0; k < range.bytes; ++k) {
        ASSERT_EQ(got[range.offset + k], -1) << "pool byte copied twice";
        ASSERT_FALSE(host_used[range.host_offset + k]) << "host byte written twice";
        got[range.offset + k] = int64_t(range.host_offset + k);
        host_used[range.host_offset + k] = true;
      }
    }
    ASSERT_EQ(got, want) << "trial " << trial;
  }
}

// A copy that would reach past the pool, or past the host memory once pin()
// named it, is refused naming where, and copies nothing.
TEST(BlockRunsTest, HostPoolCopierRefusesRangesPastEitherSide) {
  std::vector<uint8_t> pool(4096, 1), host(1024, 2);
  auto copier = make_host_pool_copier(pool.data(), pool.size());
  (void)copier->pin(host.data(), host.size());  // refused (no device), but names the host memory
  const PoolCopier::Range ranges[] = {
      {.offset = 4000, .bytes = 97, .host_offset = 0},  // past the pool
      {.offset = 0, .bytes = 25, .host_offset = 1000},  // past the host memory
      {.offset = ~size_t(0), .bytes = 2, .host_offset = 0},
      {.offset = 0, .bytes = 2, .host_offset = ~size_t(0)}};
  for (const PoolCopier::Range& bad : ranges) {
    const Status out = copier->to_host(host.data(), {&bad, 1});
    EXPECT_EQ(out.code(), StatusCode::kOutOfRange) << out.to_string();
    EXPECT_NE(out.message().find(bad.offset == 0 ? "host offset" : "outside the pool"),
              std::string::npos)
        << out.message();
    EXPECT_EQ(copier->to_device(host.data(), {&bad, 1}).code(), StatusCode::kOutOfRange);
  }
  EXPECT_TRUE(std::all_of(host.begin(), host.end(), [](uint8_t b) { return b == 2; }));
  EXPECT_TRUE(std::all_of(pool.begin(), pool.end(), [](uint8_t b) { return b == 1; }));
  const PoolCopier::Range edge{.offset = 4000, .bytes = 96, .host_offset = 928};
  ASSERT_TRUE(copier->to_host(host.data(), {&edge, 1}).is_ok());
  EXPECT_EQ(host[928], 1);
  EXPECT_EQ(host[1023], 1);
}

TEST(BlockRunsTest, ValidatesIdsAndLengths) {
  KvLayout l = layout();
  std::vector<int32_t> a = {1, 2}, b = {3, 3}, c = {1}, d = {1, 10};
  EXPECT_TRUE(validate_block_lists(a, l, a, l).is_ok());
  EXPECT_FALSE(validate_block_lists(a, l, b, l).is_ok());  // repeated destination
  EXPECT_FALSE(validate_block_lists(a, l, c, l).is_ok());  // length mismatch
  EXPECT_EQ(validate_block_lists(a, l, d, l).code(), StatusCode::kOutOfRange);
  KvLayout other = l;
  other.head_dim = 16;
  EXPECT_FALSE(validate_block_lists(a, l, a, other).is_ok());
}

// Each field of the geometry is named when it is the one that differs,
// with both values in order; equal geometries differ nowhere.
TEST(BlockRunsTest, GeometryDifferenceNamesTheField) {
  const KvLayout l = layout();
  EXPECT_EQ(geometry_difference(l, l), "");
  struct Change {
    void (*apply)(KvLayout&);
    std::string want;
  };
  const Change changes[] = {
      {[](KvLayout& x) { x.num_layers += 1; },
       "layers: " + std::to_string(l.num_layers + 1) + " against " + std::to_string(l.num_layers)},
      {[](KvLayout& x) { x.block_size *= 2; }, "block size: " + std::to_string(l.block_size * 2) +
                                                   " against " + std::to_string(l.block_size)},
      {[](KvLayout& x) { x.num_kv_heads += 1; }, "KV heads: " + std::to_string(l.num_kv_heads + 1) +
                                                     " against " + std::to_string(l.num_kv_heads)},
      {[](KvLayout& x) { x.head_dim *= 2; },
       "head_dim: " + std::to_string(l.head_dim * 2) + " against " + std::to_string(l.head_dim)},
      {[](KvLayout& x) { x.key_order = KeyOrder::kTokenMajor; },
       "key order: token-major (a GPU backend's pool) against grouped (the CPU backend's pool)"},
  };
  for (const Change& c : changes) {
    KvLayout other = l;
    c.apply(other);
    EXPECT_EQ(geometry_difference(other, l), c.want);
    EXPECT_FALSE(other.same_geometry(l));
  }
  KvLayout other = l;
  other.dtype = l.dtype == DType::kF32 ? DType::kBF16 : DType::kF32;
  EXPECT_NE(geometry_difference(other, l).find("KV dtype: "), std::string::npos);
}

// The checksum (BlockHashes) is XXH3 of every block in (layer, pair) order,
// folded by one more XXH3: the same whether it is filled run by run (the
// sender's order) or block by block in any arrival order (the receiver's),
// from either side's copy of the blocks. That the engines fill it at the
// right pairs is checked end to end by the transfer tests' verdicts.
TEST(BlockRunsTest, ChecksumIsPerBlockXxh3InPairOrderWhateverTheFillOrder) {
  KvLayout l = layout();
  std::vector<uint8_t> src_pool(l.total_bytes()), dst_pool(l.total_bytes(), 0);
  for (size_t i = 0; i < src_pool.size(); ++i) src_pool[i] = uint8_t(i * 31 + 7);
  std::vector<int32_t> src = {3, 4, 5, 8}, dst = {0, 1, 6, 7};
  auto runs = merge_block_runs(src, dst);
  ASSERT_EQ(runs.size(), 3u);  // 3,4->0,1 | 5->6 | 8->7
  EXPECT_EQ(runs[2].first_pair, 3);
  auto block = [&](std::vector<uint8_t>& pool, int32_t layer, int32_t b) {
    return pool.data() + l.block_byte_offset(layer, b);
  };
  // The reference, with the xxhash library itself; layers 1..3.
  std::vector<uint64_t> per_block;
  for (int32_t layer = 1; layer < 3; ++layer) {
    for (int32_t b : src) {
      per_block.push_back(XXH3_64bits(block(src_pool, layer, b), l.block_bytes()));
    }
  }
  const uint64_t want = XXH3_64bits(per_block.data(), per_block.size() * sizeof(uint64_t));
  // Sender side: run by run, as engine_send.cc walks them.
  BlockHashes sender(1, 3, src.size());
  for (int32_t layer = 1; layer < 3; ++layer) {
    for (const auto& run : runs) {
      for (int32_t k = 0; k < run.count; ++k) {
        sender.set(layer, size_t(run.first_pair + k),
                   block_hash(block(src_pool, layer, run.src_block + k), l.block_bytes()));
      }
    }
  }
  EXPECT_EQ(sender.digest(), want);
  // Each layer's digest (the layer messages'): XXH3 of that layer's block
  // hashes, complete once every pair of it is recorded, whatever the order.
  for (int32_t layer = 1; layer < 3; ++layer) {
    const uint64_t* hashes = per_block.data() + size_t(layer - 1) * src.size();
    EXPECT_EQ(sender.layer_digest(layer), XXH3_64bits(hashes, src.size() * sizeof(uint64_t)));
    EXPECT_TRUE(sender.layer_complete(layer));
  }
  BlockHashes partial(1, 3, src.size());
  for (size_t i = src.size(); i-- > 1;) partial.set(2, i, 1);
  partial.set(2, 3, 1);  // twice: still one pair short
  EXPECT_FALSE(partial.layer_complete(2));
  EXPECT_FALSE(partial.layer_complete(1));
  partial.set(2, 0, 1);
  EXPECT_TRUE(partial.layer_complete(2));
  // Receiver side: its own blocks, in reverse arrival order.
  for (int32_t layer = 1; layer < 3; ++layer) {
    for (size_t i = 0; i < src.size(); ++i) {
      std::memcpy(block(dst_pool, layer, dst[i]), block(src_pool, layer, src[i]), l.block_bytes());
    }
  }
  auto receiver_digest = [&] {
    BlockHashes receiver(1, 3, src.size());
    for (int32_t layer = 2; layer >= 1; --layer) {
      for (size_t i = src.size(); i-- > 0;) {
        receiver.set(layer, i, block_hash(block(dst_pool, layer, dst[i]), l.block_bytes()));
      }
    }
    return receiver.digest();
  };
  EXPECT_EQ(receiver_digest(), want);
  block(dst_pool, 2, 7)[5] ^= 1;  // one bit of one landed block
  EXPECT_NE(receiver_digest(), want);
}

// block_hash runs XXH3 through xxhash's dispatcher (AVX2 where the CPU has
// it); it must agree with plain XXH3-64 (the wire format, and what a peer on
// another CPU computes) for every length XXH3 treats differently and any
// alignment.
TEST(BlockHashTest, AgreesWithTheXxhashLibrary) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> bytes(70000);
  for (auto& b : bytes) b = uint8_t(rng());
  std::vector<size_t> lengths = {0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024, 12288, 65536};
  for (int i = 0; i < 200; ++i) lengths.push_back(rng() % 66000);
  for (size_t length : lengths) {
    size_t offset = rng() % 64;
    EXPECT_EQ(block_hash(bytes.data() + offset, length), XXH3_64bits(bytes.data() + offset, length))
        << "length " << length << " offset " << offset;
  }
}

TEST(ProbeTest, ReadsLanesAndRmaRoles) {
  // What UCX 1.13 prints over TCP: no RMA lane, puts would be emulated.
  const char* tcp =
      "#                 lane[0]:  1:tcp/lo.0 md[0]                -> md[0]/tcp/sysdev[255] am "
      "am_bw#0 wireup\n#                  rma_bw: mds #\n";
  auto caps = parse_endpoint_info(tcp, {"cma"});
  EXPECT_FALSE(caps.native_rma);
  ASSERT_EQ(caps.transports.size(), 1u);
  EXPECT_EQ(caps.transports[0], "tcp/lo");
  // Over shared memory: RMA lanes exist, but on domains that cannot register
  // a user buffer (posix/sysv), so a put into a KV pool is still emulated.
  const char* shm =
      "#  lane[0]:  1:sysv/memory.0 md[1] -> md[1]/sysv/sysdev[255] am am_bw#0\n"
      "#  lane[1]:  2:posix/memory.0 md[2] -> md[2]/posix/sysdev[255]\n"
      "#  lane[2]:  3:cma/memory.0 md[3] -> md[3]/cma/sysdev[255] rma_bw#0\n"
      "#                  put[0]: 0..<short>..4294967296..<bcopy>..(inf)\n"
      "#                  put[1]: 0..<short>..4294967296..<bcopy>..(inf)\n";
  caps = parse_endpoint_info(shm, {"cma"});
  EXPECT_FALSE(caps.native_rma);
  EXPECT_EQ(caps.transports.size(), 3u);
  EXPECT_EQ(caps.rma_domains, (std::vector<std::string>{"sysv", "posix"}));
  // An RDMA-like lane whose domain registers memory: native.
  const char* rdma =
      "#  lane[0]:  1:rc_mlx5/mlx5_0:1.0 md[1] -> md[1]/ib/sysdev[255] am rma_bw#0\n"
      "#                  put[0]: 0..<short>..92..<bcopy>..8256..<zcopy>..(inf)\n";
  caps = parse_endpoint_info(rdma, {"ib"});
  EXPECT_TRUE(caps.native_rma);
}

TEST(ProbeTest, AsksUctWhichDomainsRegister) {
  auto domains = domains_registering_host_memory();
  // Whatever this machine has, the shared-memory allocators never register
  // user memory; CMA, where present, does.
  for (const auto& d : domains) {
    EXPECT_NE(d, "posix");
    EXPECT_NE(d, "sysv");
  }
}

TEST(ConfigTest, ModesAndValidation) {
  EXPECT_EQ(parse_transfer_mode("rma"), TransferMode::kRma);
  EXPECT_EQ(parse_transfer_mode("tag"), TransferMode::kTag);
  EXPECT_EQ(parse_transfer_mode("am"), TransferMode::kAm);
  EXPECT_EQ(make_data_tag(7, 3, 5) >> 32, 7u);
  EXPECT_FALSE(parse_transfer_mode("fast").has_value());
  TransferConfig c;
  EXPECT_TRUE(validate(c).is_ok());
  c.ucx_env["TLS"] = "tcp";
  EXPECT_NE(validate(c).message().find("TLS"), std::string::npos);
  c.ucx_env.clear();
  c.default_deadline = std::chrono::milliseconds(0);
  EXPECT_FALSE(validate(c).is_ok());
  // Past a day a deadline is a mistake, and near the clock's range it would
  // overflow when added to now.
  c.default_deadline = kMaxDeadline + std::chrono::milliseconds(1);
  EXPECT_EQ(validate(c).code(), StatusCode::kOutOfRange);
  c.default_deadline = kMaxDeadline;
  EXPECT_TRUE(validate(c).is_ok());
  c.close_timeout = std::chrono::milliseconds::max();
  EXPECT_NE(validate(c).message().find("close_timeout_ms"), std::string::npos);
  c.close_timeout = kMinCloseTimeout - std::chrono::milliseconds(1);
  EXPECT_EQ(validate(c).code(), StatusCode::kOutOfRange);
  EXPECT_NE(validate(c).message().find("close_timeout_ms"), std::string::npos);
  c.close_timeout = kMinCloseTimeout;
  EXPECT_TRUE(validate(c).is_ok());
}

// The fuzzer's seeds are frames of this wire version, each accepted by the
// decoder its first byte picks (as fuzz_kv_wire.cc does): seeds the
// decoders refused would leave the fuzzer knocking at the header.
TEST(WireFormat, FuzzSeedsDecode) {
  const std::filesystem::path dir =
      std::filesystem::path(BATON_SOURCE_DIR) / "tests/fuzz/corpus/fuzz_kv_wire";
  int seeds = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    SCOPED_TRACE(entry.path().string());
    std::ifstream in(entry.path(), std::ios::binary);
    const std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), {});
    ASSERT_FALSE(data.empty());
    ++seeds;
    const std::span<const uint8_t> frame(data.data() + 1, data.size() - 1);
    Status decoded = Status::ok();
    switch (data[0] % 3) {
      case 0:
        decoded = decode_descriptor(frame).status();
        break;
      case 1:
        decoded = decode_notice(frame).status();
        break;
      default:
        decoded = decode_data_header(frame).status();
    }
    EXPECT_TRUE(decoded.is_ok()) << decoded.to_string();
  }
  EXPECT_GE(seeds, 4);
}

}  // namespace
}  // namespace baton::kv_transfer
