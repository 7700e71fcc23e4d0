// The prefix cache's SSD tier on its own: blocks of random pools go out and
// come back byte for byte into other blocks, slots are reused least recently
// used first, and a damaged slot is refused with a message naming the file
// and the slot, then forgotten.
#include "engine/ssd_kv_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <fstream>
#include <list>
#include <map>
#include <numeric>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>
#include <random>

#include "engine/kv_pool.h"
#include "tests/engine/io_uring_probe.h"
#include "tests/engine/temp_model.h"

namespace baton::engine {
namespace {

// Every way a store does its I/O: io_uring as this kernel runs it, io_uring
// without IOSQE_ASYNC (as kernels before 5.6 run it), preadv/pwritev.
constexpr SsdIo kEveryIo[] = {SsdIo::kIoUring, SsdIo::kIoUringInline, SsdIo::kPlain};

const char* io_name(SsdIo io) {
  switch (io) {
    case SsdIo::kIoUring:
      return "io_uring";
    case SsdIo::kIoUringInline:
      return "io_uring without IOSQE_ASYNC";
    case SsdIo::kPlain:
      return "preadv/pwritev";
  }
  return "?";
}

// IOSQE_ASYNC came with Linux 5.6.
bool kernel_takes_iosqe_async() {
  utsname u{};
  int major = 0, minor = 0;
  if (::uname(&u) != 0 || std::sscanf(u.release, "%d.%d", &major, &minor) != 2) return false;
  return major > 5 || (major == 5 && minor >= 6);
}

class SsdKvStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }

  static KvLayout layout_of(DType dtype, int32_t layers, int32_t kv_heads, int32_t head_dim,
                            int32_t block_size, int32_t blocks) {
    return KvLayout{.num_layers = layers,
                    .num_blocks = blocks,
                    .block_size = block_size,
                    .num_kv_heads = kv_heads,
                    .head_dim = head_dim,
                    .dtype = dtype};
  }

  KvPool random_pool(const KvLayout& layout) {
    auto pool = KvPool::create(layout);
    EXPECT_TRUE(pool.is_ok());
    auto* bytes = static_cast<uint8_t*>(pool->data());
    for (size_t i = 0; i < pool->bytes(); ++i) bytes[i] = uint8_t(rng_());
    return std::move(pool).value();
  }

  // A key of random tokens; keeps the tokens alive in `tokens_`.
  BlockKey random_key(int32_t block_size) {
    auto& tokens = tokens_.emplace_back(size_t(block_size));
    for (auto& t : tokens) t = int32_t(rng_() % 50000);
    return BlockKey{.hash = rng_(), .parent = rng_(), .tokens = tokens};
  }

  std::unique_ptr<SsdKvStore> make_store(const KvLayout& layout, int64_t slots,
                                         SsdIo io = SsdIo::kIoUring) {
    const uint64_t slot_bytes = SsdKvStore::slot_bytes_for(layout);
    // A little over: the capacity is whole slots.
    auto store = SsdKvStore::create(dir_.path(), uint64_t(slots) * slot_bytes + 100, layout, io);
    EXPECT_TRUE(store.is_ok()) << store.status().to_string();
    return std::move(store).value();
  }

  // Saves `block` of `pool` under a new random key, which it returns.
  BlockKey save_one(SsdKvStore& store, const KvPool& pool, int32_t block) {
    const BlockKey key = random_key(pool.layout().block_size);
    store.save(std::span(&key, 1), pool.data(), std::span(&block, 1));
    return key;
  }

  // start_load, then finish_loads until that load is handed back.
  static SsdLoad load_async(SsdKvStore& store, std::span<const BlockKey> keys, void* pool,
                            std::span<const int32_t> blocks) {
    const int64_t id = store.start_load(keys, pool, blocks);
    for (;;) {
      for (SsdKvStore::LandedLoad& landed : store.finish_loads(/*wait=*/true)) {
        if (landed.id == id) return std::move(landed.result);
      }
    }
  }

  static bool same_block(const KvPool& a, int32_t block_a, const KvPool& b, int32_t block_b) {
    const KvLayout& l = a.layout();
    for (int32_t layer = 0; layer < l.num_layers; ++layer) {
      const auto* pa = static_cast<const uint8_t*>(a.data()) + l.block_byte_offset(layer, block_a);
      const auto* pb = static_cast<const uint8_t*>(b.data()) + l.block_byte_offset(layer, block_b);
      if (std::memcmp(pa, pb, l.block_bytes()) != 0) return false;
    }
    return true;
  }

  // Flips one byte of the store's file at `offset`.
  static void flip_byte(const std::filesystem::path& file, uint64_t offset) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekg(std::streamoff(offset));
    char c = 0;
    f.read(&c, 1);
    c = char(c ^ 0x5a);
    f.seekp(std::streamoff(offset));
    f.write(&c, 1);
  }

  // Six blocks saved into a file that may grow to three slots: exits 0 if
  // the first three are stored and come back, the rest dropped; else 10+.
  [[noreturn]] void save_past_a_size_limit(SsdIo io) {
    const KvLayout layout = layout_of(DType::kF32, 2, 1, 64, 4, 8);
    std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of a signal
    const auto limit = rlim_t(3 * SsdKvStore::slot_bytes_for(layout));
    const rlimit r{limit, limit};
    if (::setrlimit(RLIMIT_FSIZE, &r) != 0) ::_exit(10);
    KvPool pool = random_pool(layout);
    auto store = make_store(layout, 8, io);
    std::vector<BlockKey> keys;
    for (int i = 0; i < 6; ++i) keys.push_back(random_key(4));
    const std::vector<int32_t> blocks = {0, 1, 2, 3, 4, 5};
    store->save(keys, pool.data(), blocks);
    const SsdKvStoreStats stats = store->stats();
    if (stats.saved_blocks != 3 || stats.failed_writes != 3 || stats.stored_blocks != 3)
      ::_exit(11);
    for (size_t i = 0; i < 6; ++i) {
      if (store->contains(keys[i]) != (i < 3)) ::_exit(12);
    }
    KvPool target = random_pool(layout);
    const std::vector<int32_t> into = {5, 6, 7};
    if (store->load(std::span(keys).first(3), target.data(), into).restored != 3) ::_exit(13);
    for (size_t i = 0; i < 3; ++i) {
      if (!same_block(target, into[i], pool, blocks[i])) ::_exit(14);
    }
    ::_exit(0);
  }

  uint32_t seed_ = 0;
  std::mt19937_64 rng_;
  testing::TempDir dir_;
  std::list<std::vector<int32_t>> tokens_;
};

TEST_F(SsdKvStoreTest, BlocksComeBackByteForByteIntoOtherBlocks) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  struct Shape {
    DType dtype;
    int32_t layers, kv_heads, head_dim, block_size;
  };
  const Shape shapes[] = {{DType::kF32, 3, 2, 64, 16},
                          {DType::kBF16, 5, 1, 128, 4},
                          {DType::kF16, 2, 3, 64, 1},
                          {DType::kBF16, 30, 3, 64, 16},
                          // 8-bit KV: blocks end with their rows' scales.
                          {DType::kI8, 3, 2, 64, 16},
                          {DType::kFP8E4M3, 2, 1, 128, 4}};
  for (const SsdIo io : kEveryIo)
    for (const Shape& s : shapes) {
      SCOPED_TRACE(std::string(dtype_name(s.dtype)) + " layers " + std::to_string(s.layers) + ", " +
                   io_name(io));
      const KvLayout layout =
          layout_of(s.dtype, s.layers, s.kv_heads, s.head_dim, s.block_size, 40);
      KvPool source = random_pool(layout);
      KvPool target = random_pool(layout);  // random bytes: anything unwritten shows
      KvPool untouched_copy = random_pool(layout);
      std::memcpy(untouched_copy.data(), target.data(), target.bytes());
      auto store = make_store(layout, 100, io);
      // The kernel may refuse io_uring (seccomp); then every run takes
      // preadv. Where it offers one, the io_uring rows must use it.
      if (io == SsdIo::kPlain) {
        EXPECT_FALSE(store->uses_io_uring());
      } else if (testing::kernel_offers_io_uring()) {
        ASSERT_TRUE(store->uses_io_uring())
            << "fell back to preadv though the kernel offers io_uring";
      }
      if (io == SsdIo::kIoUringInline) {
        EXPECT_FALSE(store->hands_copies_to_kernel_workers());
      }
      if (io == SsdIo::kIoUring && store->uses_io_uring()) {
        EXPECT_EQ(store->hands_copies_to_kernel_workers(), kernel_takes_iosqe_async());
      }

      // 70 blocks in shuffled order: more than one batch of I/O.
      std::vector<BlockKey> keys;
      std::vector<int32_t> from, to;
      for (int i = 0; i < 70; ++i) {
        keys.push_back(random_key(s.block_size));
        from.push_back(int32_t(rng_() % 40));
      }
      store->save(keys, source.data(), from);
      EXPECT_EQ(store->stats().saved_blocks, 70);
      EXPECT_EQ(store->stats().stored_blocks, 70);
      // Back in pieces, each into distinct random blocks of the other pool
      // (as a sequence's blocks are).
      std::vector<bool> written(40, false);
      std::vector<int32_t> ids(40);
      std::iota(ids.begin(), ids.end(), 0);
      for (size_t begin = 0; begin < keys.size(); begin += 7) {
        const std::span<const BlockKey> some(keys.data() + begin, 7);
        std::shuffle(ids.begin(), ids.end(), rng_);
        const std::vector<int32_t> into(ids.begin(), ids.begin() + 7);
        const SsdLoad loaded = store->load(some, target.data(), into);
        ASSERT_TRUE(loaded.problem.is_ok()) << loaded.problem.to_string();
        ASSERT_EQ(loaded.restored, 7);
        for (size_t i = 0; i < 7; ++i) {
          EXPECT_TRUE(same_block(target, into[i], source, from[begin + i])) << begin + i;
          written[size_t(into[i])] = true;
        }
      }
      for (int32_t b = 0; b < 40; ++b) {
        if (!written[size_t(b)]) {
          EXPECT_TRUE(same_block(target, b, untouched_copy, b)) << b;
        }
      }
      EXPECT_EQ(store->stats().loaded_blocks, 70);
    }
}

TEST_F(SsdKvStoreTest, FullStoreReusesTheLeastRecentlyUsedSlot) {
  const KvLayout layout = layout_of(DType::kF32, 2, 1, 64, 4, 8);
  KvPool pool = random_pool(layout);
  auto store = make_store(layout, 3);
  EXPECT_EQ(store->stats().capacity_blocks, 3);
  std::vector<BlockKey> keys;
  for (int i = 0; i < 5; ++i) keys.push_back(random_key(4));
  const std::vector<int32_t> blocks = {0, 1, 2, 3, 4};
  store->save(std::span(keys).first(3), pool.data(), std::span(blocks).first(3));
  store->touch(std::span(keys).first(1));  // key 0 is now the most recent
  store->save(std::span(keys).subspan(3, 1), pool.data(), std::span(blocks).subspan(3, 1));
  EXPECT_TRUE(store->contains(keys[0]));
  EXPECT_FALSE(store->contains(keys[1])) << "the least recently used slot goes first";
  EXPECT_TRUE(store->contains(keys[2]));
  EXPECT_TRUE(store->contains(keys[3]));
  // Saving a stored key again writes nothing and only refreshes it.
  store->save(std::span(keys).subspan(2, 1), pool.data(), std::span(blocks).subspan(2, 1));
  EXPECT_EQ(store->stats().saved_blocks, 4);
  store->save(std::span(keys).subspan(4, 1), pool.data(), std::span(blocks).subspan(4, 1));
  EXPECT_FALSE(store->contains(keys[0]));
  EXPECT_TRUE(store->contains(keys[2]));
  EXPECT_EQ(store->stats().stored_blocks, 3);
  // Whatever slot each took, each stored key reads back its own block.
  KvPool target = random_pool(layout);
  for (int i : {2, 3, 4}) {
    const int32_t into = 7;
    const SsdLoad loaded =
        store->load(std::span(keys).subspan(size_t(i), 1), target.data(), std::span(&into, 1));
    ASSERT_EQ(loaded.restored, 1) << loaded.problem.to_string();
    EXPECT_TRUE(same_block(target, 7, pool, blocks[size_t(i)]));
  }
}

// A restore read a piece at a time pins its keys: saves of other keys
// (evicted blocks, while the pieces land) take every other slot first;
// unpinned, the slots are least recently used as before. (A save that
// finds only pinned slots skips: AsynchronousLoadsLandByteForByteAndPin-
// TheirSlots.)
TEST_F(SsdKvStoreTest, PinnedSlotsAreNotTakenUntilUnpinned) {
  const KvLayout layout = layout_of(DType::kBF16, 2, 1, 64, 4, 16);
  KvPool pool = random_pool(layout);
  auto store = make_store(layout, 4);
  std::vector<BlockKey> keys;
  for (int i = 0; i < 12; ++i) keys.push_back(random_key(4));
  std::vector<int32_t> blocks(12);
  std::iota(blocks.begin(), blocks.end(), 0);
  store->save(std::span(keys).first(4), pool.data(), std::span(blocks).first(4));
  // Keys 0 and 1 are the least recently used, and pinned (with a key that
  // is not stored, which pins nothing).
  const BlockKey absent = random_key(4);
  const std::vector<BlockKey> wanted = {keys[0], absent, keys[1]};
  const std::vector<int64_t> pinned = store->pin(wanted);
  EXPECT_EQ(pinned.size(), 2u);
  store->save(std::span(keys).subspan(4, 2), pool.data(), std::span(blocks).subspan(4, 2));
  EXPECT_TRUE(store->contains(keys[0]));
  EXPECT_TRUE(store->contains(keys[1]));
  EXPECT_FALSE(store->contains(keys[2])) << "unpinned slots are taken first";
  EXPECT_FALSE(store->contains(keys[3]));
  EXPECT_TRUE(store->contains(keys[4]));
  EXPECT_TRUE(store->contains(keys[5]));
  // Only pinned slots and just-saved ones left: 6 and 7 take 4 and 5's.
  store->save(std::span(keys).subspan(6, 2), pool.data(), std::span(blocks).subspan(6, 2));
  EXPECT_TRUE(store->contains(keys[0]));
  EXPECT_TRUE(store->contains(keys[1]));
  EXPECT_FALSE(store->contains(keys[4]));
  EXPECT_FALSE(store->contains(keys[5]));
  EXPECT_TRUE(store->contains(keys[6])) << "a save skipped while slots were pinned";
  EXPECT_TRUE(store->contains(keys[7]));
  // A batch of more keys than unpinned slots saves as many as there are:
  // the slots it took stay its own until written (taking one again would
  // write two keys into one slot at once), and every key saved is found
  // and reads back whole.
  const std::vector<BlockKey> more = {random_key(4), random_key(4), random_key(4), random_key(4)};
  const std::vector<int32_t> more_blocks = {9, 10, 11, 12};
  const int64_t saved_before = store->stats().saved_blocks;
  store->save(more, pool.data(), more_blocks);
  EXPECT_EQ(store->stats().saved_blocks - saved_before, 2) << "two slots were not pinned";
  for (size_t i = 0; i < more.size(); ++i) {
    EXPECT_EQ(store->contains(more[i]), i < 2) << i;
    if (i >= 2) continue;
    KvPool back = random_pool(layout);
    const int32_t into = 0;
    ASSERT_EQ(store->load(std::span(&more[i], 1), back.data(), std::span(&into, 1)).restored, 1);
    EXPECT_TRUE(same_block(back, 0, pool, more_blocks[i])) << i;
  }
  EXPECT_FALSE(store->contains(keys[6]));
  EXPECT_FALSE(store->contains(keys[7]));
  store->save(std::span(keys).subspan(6, 2), pool.data(), std::span(blocks).subspan(6, 2));
  // The pinned blocks read back whole.
  KvPool target = random_pool(layout);
  const std::vector<int32_t> into = {14, 15};
  const std::vector<BlockKey> both = {keys[0], keys[1]};
  const SsdLoad loaded = store->load(both, target.data(), into);
  ASSERT_EQ(loaded.restored, 2) << loaded.problem.to_string();
  EXPECT_TRUE(same_block(target, 14, pool, 0));
  EXPECT_TRUE(same_block(target, 15, pool, 1));
  // Unpinned, they are slots like any other: four new keys take all four.
  store->unpin(pinned);
  store->save(std::span(keys).subspan(8, 4), pool.data(), std::span(blocks).subspan(8, 4));
  EXPECT_EQ(store->stats().stored_blocks, 4);
  EXPECT_FALSE(store->contains(keys[0]));
  EXPECT_FALSE(store->contains(keys[1]));
  for (int i = 8; i < 12; ++i) EXPECT_TRUE(store->contains(keys[size_t(i)])) << i;
}

TEST_F(SsdKvStoreTest, KeysMatchOnParentAndTokensNotOnlyTheHash) {
  const KvLayout layout = layout_of(DType::kF32, 1, 1, 64, 4, 4);
  KvPool pool = random_pool(layout);
  auto store = make_store(layout, 4);
  const int32_t block = 1;
  const BlockKey key = save_one(*store, pool, block);
  BlockKey other_parent = key;
  other_parent.parent ^= 1;
  std::vector<int32_t> tokens(key.tokens.begin(), key.tokens.end());
  tokens[3] ^= 1;
  BlockKey other_tokens = key;
  other_tokens.tokens = tokens;
  EXPECT_TRUE(store->contains(key));
  EXPECT_FALSE(store->contains(other_parent));
  EXPECT_FALSE(store->contains(other_tokens));
  EXPECT_EQ(store->load(std::span(&other_tokens, 1), pool.data(), std::span(&block, 1)).restored,
            0);
}

// A pinned slot found damaged is forgotten at once but stays out of use
// until it is unpinned (a restore may still be reading it a piece at a
// time): a save in between takes another slot.
TEST_F(SsdKvStoreTest, ADamagedPinnedSlotIsReusedOnlyOnceUnpinned) {
  const KvLayout layout = layout_of(DType::kBF16, 2, 1, 64, 4, 8);
  KvPool pool = random_pool(layout);
  auto store = make_store(layout, 2);
  const std::vector<BlockKey> keys = {random_key(4), random_key(4), random_key(4), random_key(4)};
  const std::vector<int32_t> blocks = {0, 1, 2, 3};
  store->save(std::span(keys).first(2), pool.data(), std::span(blocks).first(2));
  const std::vector<int64_t> pinned = store->pin(std::span(keys).first(1));
  ASSERT_EQ(pinned, std::vector<int64_t>{0});
  flip_byte(store->path(), 4096);  // slot 0's first payload byte
  KvPool target = random_pool(layout);
  const int32_t into = 7;
  EXPECT_EQ(store->load(std::span(keys).first(1), target.data(), std::span(&into, 1)).restored, 0);
  EXPECT_FALSE(store->contains(keys[0]));
  store->save(std::span(keys).subspan(2, 1), pool.data(), std::span(blocks).subspan(2, 1));
  EXPECT_TRUE(store->contains(keys[2]));
  EXPECT_FALSE(store->contains(keys[1])) << "the pinned slot was taken: key 1's stayed";
  store->unpin(pinned);
  store->save(std::span(keys).subspan(3, 1), pool.data(), std::span(blocks).subspan(3, 1));
  EXPECT_TRUE(store->contains(keys[2])) << "unpinned, the damaged slot is the free one";
  EXPECT_TRUE(store->contains(keys[3]));
  for (int i : {2, 3}) {
    EXPECT_EQ(store->load(std::span(keys).subspan(size_t(i), 1), target.data(), std::span(&into, 1))
                  .restored,
              1);
    EXPECT_TRUE(same_block(target, into, pool, blocks[size_t(i)])) << i;
  }
}

TEST_F(SsdKvStoreTest, LoadStopsAtTheFirstKeyNotStored) {
  const KvLayout layout = layout_of(DType::kBF16, 2, 2, 64, 8, 8);
  KvPool pool = random_pool(layout);
  KvPool target = random_pool(layout);
  auto store = make_store(layout, 8);
  std::vector<BlockKey> keys = {random_key(8), random_key(8), random_key(8)};
  const std::vector<int32_t> blocks = {0, 1, 2};
  store->save(std::span(keys).first(1), pool.data(), std::span(blocks).first(1));
  store->save(std::span(keys).subspan(2), pool.data(), std::span(blocks).subspan(2));
  const std::vector<int32_t> into = {5, 6, 7};
  const SsdLoad loaded = store->load(keys, target.data(), into);
  EXPECT_EQ(loaded.restored, 1);
  EXPECT_TRUE(loaded.problem.is_ok()) << "a key not stored is no problem";
  EXPECT_TRUE(same_block(target, 5, pool, 0));
}

TEST_F(SsdKvStoreTest, DamagedSlotsAreRefusedNamingTheFileAndSlotThenForgotten) {
  for (DType dtype : {DType::kF16, DType::kI8}) {
    SCOPED_TRACE("seed " + std::to_string(seed_) + ", " + std::string(dtype_name(dtype)));
    const KvLayout layout = layout_of(dtype, 3, 2, 64, 16, 8);
    struct Damage {
      const char* what;
      uint64_t offset;  // within the slot
      const char* expected;
    };
    const uint64_t header = 4096;
    std::vector<Damage> damages = {
        {"magic", 2, "bad magic"},
        {"a token in the header", 64 + 4 * 5, "header checksum mismatch"},
        {"the first payload byte", header, "payload checksum mismatch"},
        {"the last layer's last byte", header + 3 * layout.block_bytes() - 1,
         "payload checksum mismatch"},
    };
    if (is_quantized(dtype)) {
      // A scale of the second layer's block: the tier checksums them with it.
      damages.push_back(
          {"a scale",
           header + layout.block_bytes() + layout.scale_byte_offset(0, 0, KvPart::kValue, 1, 3),
           "payload checksum mismatch"});
    }
    for (const bool async : {false, true})
      for (const Damage& d : damages) {
        SCOPED_TRACE(std::string(d.what) + (async ? ", asynchronous load" : ""));
        KvPool pool = random_pool(layout);
        auto store = make_store(layout, 4);
        std::vector<BlockKey> keys = {random_key(16), random_key(16)};
        const std::vector<int32_t> blocks = {3, 4};
        store->save(keys, pool.data(), blocks);
        // Slots are taken from the file's start: the second key is in slot 1.
        flip_byte(store->path(), store->slot_bytes() + d.offset);
        KvPool target = random_pool(layout);
        const std::vector<int32_t> into = {0, 1};
        const SsdLoad loaded = async ? load_async(*store, keys, target.data(), into)
                                     : store->load(keys, target.data(), into);
        EXPECT_EQ(loaded.restored, 1);
        EXPECT_TRUE(same_block(target, 0, pool, 3));
        EXPECT_EQ(loaded.problem.code(), StatusCode::kDataLoss);
        const std::string message = loaded.problem.message();
        EXPECT_NE(message.find(store->path().string()), std::string::npos) << message;
        EXPECT_NE(message.find("slot 1"), std::string::npos) << message;
        EXPECT_NE(message.find(d.expected), std::string::npos) << message;
        EXPECT_TRUE(store->contains(keys[0]));
        EXPECT_FALSE(store->contains(keys[1])) << "a damaged slot is forgotten";
        EXPECT_EQ(store->stats().dropped_blocks, 1);
      }
  }
}

// Asynchronous loads: several in flight at once come back byte for byte
// into the blocks they were given and nowhere else. While they are in
// flight their slots are pinned: a full store saves nothing rather than
// reuse one. A load of a key not stored lands with nothing, and a store
// destroyed with a load in flight waits for it.
TEST_F(SsdKvStoreTest, AsynchronousLoadsLandByteForByteAndPinTheirSlots) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (const SsdIo io : kEveryIo) {
    SCOPED_TRACE(io_name(io));
    const KvLayout layout = layout_of(DType::kBF16, 4, 2, 64, 8, 40);
    KvPool source = random_pool(layout);
    KvPool target = random_pool(layout);
    KvPool untouched_copy = random_pool(layout);
    std::memcpy(untouched_copy.data(), target.data(), target.bytes());
    auto store = make_store(layout, 12, io);
    std::vector<BlockKey> keys;
    std::vector<int32_t> from;
    for (int i = 0; i < 12; ++i) {
      keys.push_back(random_key(8));
      from.push_back(int32_t(rng_() % 40));
    }
    store->save(keys, source.data(), from);
    ASSERT_EQ(store->stats().stored_blocks, 12);

    // Three loads of four keys each into shuffled distinct blocks, and one
    // of a key never stored.
    std::vector<int32_t> ids(40);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);
    std::map<int64_t, size_t> first_key_of;
    for (size_t begin = 0; begin < 12; begin += 4) {
      const int64_t id = store->start_load(std::span(keys).subspan(begin, 4), target.data(),
                                           std::span(ids).subspan(begin, 4));
      first_key_of[id] = begin;
    }
    const BlockKey stranger = random_key(8);
    const int32_t stranger_block = ids[12];
    const int64_t stranger_id =
        store->start_load(std::span(&stranger, 1), target.data(), std::span(&stranger_block, 1));
    EXPECT_EQ(store->loads_in_flight(), 4);

    // Every slot is being read: saves wait for none of them, and take none.
    const BlockKey newcomer = random_key(8);
    const int32_t newcomer_block = 0;
    store->save(std::span(&newcomer, 1), source.data(), std::span(&newcomer_block, 1));
    EXPECT_FALSE(store->contains(newcomer));
    for (const BlockKey& key : keys) EXPECT_TRUE(store->contains(key));
    EXPECT_EQ(store->stats().saved_blocks, 12);

    int landed_loads = 0;
    while (store->loads_in_flight() > 0) {
      for (const SsdKvStore::LandedLoad& landed : store->finish_loads(/*wait=*/true)) {
        ++landed_loads;
        ASSERT_TRUE(landed.result.problem.is_ok()) << landed.result.problem.to_string();
        if (landed.id == stranger_id) {
          EXPECT_EQ(landed.result.restored, 0);
          continue;
        }
        ASSERT_TRUE(first_key_of.contains(landed.id));
        EXPECT_EQ(landed.result.restored, 4);
      }
    }
    EXPECT_EQ(landed_loads, 4);
    for (size_t i = 0; i < 12; ++i) EXPECT_TRUE(same_block(target, ids[i], source, from[i])) << i;
    for (size_t i = 12; i < 40; ++i)
      EXPECT_TRUE(same_block(target, ids[i], untouched_copy, ids[i])) << i;
    EXPECT_EQ(store->stats().loaded_blocks, 12);

    // Landed, the slots are free to be reused again.
    store->save(std::span(&newcomer, 1), source.data(), std::span(&newcomer_block, 1));
    EXPECT_TRUE(store->contains(newcomer));

    // Destroyed with a load in flight: the store waits for its reads.
    store->start_load(std::span(keys).subspan(4, 8), target.data(), std::span(ids).first(8));
    store.reset();
  }
}

// Writes that fail (here: past a file size limit, as a full disk would
// fail them) drop their keys and nothing else: the blocks written before
// still come back. In a child process, whose limit this is.
TEST_F(SsdKvStoreTest, FailedWritesDropOnlyTheirKeys) {
  for (const SsdIo io : kEveryIo) {
    SCOPED_TRACE(io_name(io));
    EXPECT_EXIT(save_past_a_size_limit(io), ::testing::ExitedWithCode(0), "");
  }
}

TEST_F(SsdKvStoreTest, TruncatedFileIsAShortRead) {
  const KvLayout layout = layout_of(DType::kF32, 2, 1, 64, 4, 4);
  KvPool pool = random_pool(layout);
  auto store = make_store(layout, 4);
  const int32_t block = 2;
  const BlockKey key = save_one(*store, pool, block);
  std::filesystem::resize_file(store->path(), 4096 + 100);
  const SsdLoad loaded = store->load(std::span(&key, 1), pool.data(), std::span(&block, 1));
  EXPECT_EQ(loaded.restored, 0);
  EXPECT_NE(loaded.problem.message().find("short read"), std::string::npos)
      << loaded.problem.to_string();
  EXPECT_FALSE(store->contains(key));
}

TEST_F(SsdKvStoreTest, BadSettingsAreErrorsNamingThem) {
  const KvLayout layout = layout_of(DType::kF32, 2, 1, 64, 4, 4);
  auto small = SsdKvStore::create(dir_.path(), 4096, layout);
  ASSERT_FALSE(small.is_ok());
  EXPECT_NE(small.status().message().find("engine.ssd_cache_bytes"), std::string::npos)
      << small.status().to_string();
  auto missing = SsdKvStore::create(dir_.path() / "nowhere", uint64_t(1) << 30, layout);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("engine.ssd_cache_dir"), std::string::npos)
      << missing.status().to_string();
}

// A store's file is its own for as long as it holds the lock on it. A
// killed process leaves its file behind, unlocked: the next store created in
// the directory removes it, whatever pid its name gives. A file a living
// process holds locked stays, even under the pid of a process that is gone
// here (as one in another PID namespace would look), and so do other files.
TEST_F(SsdKvStoreTest, FilesNoStoreHoldsAreRemoved) {
  const pid_t gone = ::fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);  // gone, and reaped
  const auto file = [&](pid_t pid, int n, const char* suffix = "") {
    return dir_.path() /
           ("baton-kv-" + std::to_string(pid) + "-" + std::to_string(n) + ".bin" + suffix);
  };
  const auto dead = file(gone, 0), held = file(gone, 1), other = file(gone, 0, ".keep");
  const auto unheld_living_pid = file(::getppid(), 3);
  for (const auto& f : {dead, held, other, unheld_living_pid}) std::ofstream(f) << "left behind";

  // A living process holds `held` locked until the pipe `quit` closes.
  int ready[2], quit[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(quit), 0);
  const pid_t holder = ::fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {
    const int fd = ::open(held.c_str(), O_RDONLY);
    char c = fd >= 0 && ::flock(fd, LOCK_EX) == 0 ? 'y' : 'n';
    ::close(quit[1]);
    if (::write(ready[1], &c, 1) == 1) (void)!::read(quit[0], &c, 1);
    ::_exit(0);
  }
  ::close(ready[1]);
  ::close(quit[0]);
  char locked = 0;
  ASSERT_EQ(::read(ready[0], &locked, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(locked, 'y');

  const KvLayout layout = layout_of(DType::kF32, 2, 1, 64, 4, 4);
  {
    auto store = make_store(layout, 2);
    EXPECT_FALSE(std::filesystem::exists(dead));
    EXPECT_FALSE(std::filesystem::exists(unheld_living_pid));
    EXPECT_TRUE(std::filesystem::exists(held));
    EXPECT_TRUE(std::filesystem::exists(other));
    EXPECT_TRUE(std::filesystem::exists(store->path()));
    // A second store of this process leaves the first one's file alone.
    auto second = make_store(layout, 2);
    EXPECT_TRUE(std::filesystem::exists(store->path()));
    EXPECT_NE(second->path(), store->path());
  }
  ::close(quit[1]);
  ASSERT_EQ(::waitpid(holder, nullptr, 0), holder);
  auto later = make_store(layout, 2);
  EXPECT_FALSE(std::filesystem::exists(held));
  EXPECT_TRUE(std::filesystem::exists(other));
  // No staging file is left behind either.
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_.path()))
    files += entry.exists();
  EXPECT_EQ(files, 2);  // `other` and later's file
}

// A FIFO named as a store's file would block the start-up clean-up's open
// for a writer; it is not a store's file, and is left alone.
TEST_F(SsdKvStoreTest, AFifoNamedAsAStoresFileIsLeftAlone) {
  const auto fifo = dir_.path() / "baton-kv-1-1.bin";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto store = make_store(layout_of(DType::kF32, 2, 1, 64, 4, 4), 2);
  EXPECT_TRUE(std::filesystem::exists(fifo));
}

TEST_F(SsdKvStoreTest, FileIsRemovedWithTheStore) {
  const KvLayout layout = layout_of(DType::kF32, 2, 1, 64, 4, 4);
  std::filesystem::path file;
  {
    auto store = make_store(layout, 2);
    file = store->path();
    EXPECT_TRUE(std::filesystem::exists(file));
    EXPECT_EQ(file.parent_path(), dir_.path());
  }
  EXPECT_FALSE(std::filesystem::exists(file));
}

}  // namespace
}  // namespace baton::engine
