// engine/ssd_kv_store.h — the prefix cache's second tier, on SSD.
//
// When the prefix cache evicts a registered block from the KV pool (its
// memory is needed for another one), the block's K/V of every layer is
// written here under its BlockKey instead of being lost. A later prompt
// whose leading blocks are no longer in the pool but are here gets them
// read back into fresh pool blocks, which is far cheaper than computing them
// again: one block of smollm2-135m in BF16 is 360 KiB to read, against
// 16 tokens through 30 layers to compute.
//
// One file of fixed-size slots, created in the given directory and removed
// when the store is destroyed (it holds KV of this process's model and pool
// geometry only); files that killed processes left there are removed when a
// store is created. A slot is a 4 KiB header — magic, geometry, the key, an
// XXH3 checksum of the payload — followed by the payload: the block's bytes
// of layer 0, 1, ... exactly as the pool holds them (common/kv_layout.h),
// so a save or a load is one vectored I/O per block, straight between the
// pool and the file, with no staging copy. Reads and writes of a batch of
// blocks are submitted together through io_uring (plain preadv/pwritev where
// the kernel refuses io_uring), so an SSD sees them all at once.
//
// Loads also run asynchronously (start_load, finish_loads) on a ring of
// their own, so that the scheduler keeps computing while blocks are read:
// a synchronous restore of a long prompt would stall every running
// sequence for as long as the reads take. Slots being read are pinned: a
// save never reuses them until their load has landed.
//
// The index (key to slot) lives in memory; slots are reused least recently
// used first. A slot whose header or checksum does not match on reading is
// reported (naming the file and the slot) and dropped, and the caller
// computes that block instead: the store is a cache, and none of its
// failures (a full disk, an I/O error, a corrupt slot) is fatal.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/kv_layout.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "engine/block_manager.h"

namespace baton::engine {

struct SsdKvStoreStats {
  int64_t capacity_blocks = 0;
  int64_t stored_blocks = 0;
  int64_t saved_blocks = 0;    // written (a key already stored is not written again)
  int64_t loaded_blocks = 0;   // read back and verified
  int64_t dropped_blocks = 0;  // failed to write, or failed verification on reading
  int64_t failed_writes = 0;   // of those, failed to write
};

// What a load brought back: the first `restored` keys are in their blocks;
// `problem` says why the next one is not, when it failed (not OK only then).
struct SsdLoad {
  int32_t restored = 0;
  Status problem;
};

// Where the blocks a store writes from or reads into lie: layer l of block b
// at base + l * layer_stride + b * block_stride (a block's bytes of one
// layer are contiguous, common/kv_layout.h).
struct BlockMemory {
  std::byte* base = nullptr;
  size_t layer_stride = 0;
  size_t block_stride = 0;

  // The pool of `layout` at `pool`.
  static BlockMemory of_pool(const KvLayout& layout, const void* pool);
  std::byte* at(int32_t layer, int32_t block) const {
    return base + size_t(layer) * layer_stride + size_t(block) * block_stride;
  }
};

// How a store does its I/O; tests run every way.
enum class SsdIo {
  // io_uring where the kernel allows it, else preadv/pwritev. The copies go
  // to the kernel's workers (IOSQE_ASYNC) where the kernel takes that flag
  // (Linux 5.6 and later), else run as the kernel chooses.
  kIoUring,
  // io_uring without IOSQE_ASYNC, as kernels before 5.6 run it.
  kIoUringInline,
  kPlain,  // preadv/pwritev
};

class SsdKvStore {
 public:
  // Creates the store's file in `dir` (which must exist) for blocks of
  // `layout`'s geometry, holding up to `capacity_bytes` of slots.
  static Result<std::unique_ptr<SsdKvStore>> create(const std::filesystem::path& dir,
                                                    uint64_t capacity_bytes, const KvLayout& layout,
                                                    SsdIo io = SsdIo::kIoUring);
  ~SsdKvStore();
  SsdKvStore(const SsdKvStore&) = delete;
  SsdKvStore& operator=(const SsdKvStore&) = delete;

  // I/Os the store keeps in flight at most: the reads of its loads, the
  // writes of one batch of a save.
  static constexpr int32_t kIoDepth = 64;

  const std::filesystem::path& path() const { return path_; }
  // Bytes of one slot: the header and one block of every layer, 4 KiB aligned.
  static uint64_t slot_bytes_for(const KvLayout& layout);
  uint64_t slot_bytes() const { return slot_bytes_; }
  SsdKvStoreStats stats() const;
  bool uses_io_uring() const { return ring_ != nullptr; }
  // Whether its io_uring entries carry IOSQE_ASYNC.
  bool hands_copies_to_kernel_workers() const;

  // Whether a block with exactly this key is stored.
  bool contains(const BlockKey& key) const;
  // Makes the stored ones of these keys the most recently used, last key most.
  void touch(std::span<const BlockKey> keys);
  // Keeps the slots of the stored ones of these keys from being taken for
  // other keys until unpin() (a restore that reads them a piece at a time,
  // while saves go on); returns those slots, for unpin(). A pinned slot
  // that fails verification is still dropped.
  std::vector<int64_t> pin(std::span<const BlockKey> keys);
  void unpin(std::span<const int64_t> slots);
  // Writes block blocks[i] of `memory` (every layer) under
  // keys[i], for every i, evicting the least recently used slots when full.
  // A key already stored only becomes most recently used. A failed write is
  // logged and its key dropped.
  void save(std::span<const BlockKey> keys, const BlockMemory& memory,
            std::span<const int32_t> blocks);
  void save(std::span<const BlockKey> keys, const void* pool, std::span<const int32_t> blocks) {
    save(keys, BlockMemory::of_pool(layout_, pool), blocks);
  }
  // Reads the blocks stored under keys[i] into pool blocks blocks[i], in
  // order, stopping at the first key that is not stored or whose slot fails
  // verification (a damaged slot is dropped; one the OS failed to read is
  // kept).
  SsdLoad load(std::span<const BlockKey> keys, const BlockMemory& memory,
               std::span<const int32_t> blocks);
  SsdLoad load(std::span<const BlockKey> keys, void* pool, std::span<const int32_t> blocks) {
    return load(keys, BlockMemory::of_pool(layout_, pool), blocks);
  }

  // Starts reading what load() would read, and returns at once with the
  // load's id. Until finish_loads() hands the load back, the kernel may
  // write its blocks: nobody else may use them (nor free their memory).
  // Without io_uring the reads happen here, and the load is handed back by
  // the next finish_loads().
  int64_t start_load(std::span<const BlockKey> keys, const BlockMemory& memory,
                     std::span<const int32_t> blocks);
  int64_t start_load(std::span<const BlockKey> keys, void* pool, std::span<const int32_t> blocks) {
    return start_load(keys, BlockMemory::of_pool(layout_, pool), blocks);
  }
  struct LandedLoad {
    int64_t id;
    SsdLoad result;  // as load() would have returned it
  };
  // The loads whose reads have all landed and been verified since the last
  // call, in no particular order. `wait`: when loads are in flight and none
  // has landed, waits until one has.
  std::vector<LandedLoad> finish_loads(bool wait);
  int32_t loads_in_flight() const { return int32_t(loads_.size()); }
  // False when start_load reads everything before it returns (no io_uring).
  bool loads_are_asynchronous() const { return load_ring_ != nullptr; }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint64_t parent = 0;
    std::vector<int32_t> tokens;  // empty: the slot is free
    std::list<int64_t>::iterator recency;
    int32_t pins = 0;  // loads reading it, pin()s, the save writing it: not to be reused
  };
  struct Io;  // one block's vectored read or write
  class Ring;
  struct PendingLoad;

  // A process killed before it could remove its file leaves it behind.
  // A store holds a lock (flock) on its file for as long as it lives, so
  // files of the store's name pattern that no one holds locked are removed:
  // the pid in a name says nothing about a process in another PID
  // namespace sharing the directory.
  static void remove_unlocked_files(const std::filesystem::path& dir);
  SsdKvStore(std::filesystem::path path, int fd, const KvLayout& layout, int64_t slots, SsdIo io);
  // A slot for a new key: a dropped one, a never used one, else the least
  // recently used one that no load is reading (evicted); -1 if none is.
  int64_t take_slot();
  void drop(int64_t slot);
  // Takes one pin off `slot`; a slot dropped while pinned goes free here.
  void unpin_slot(int64_t slot);
  void touch(int64_t slot);
  // The stored slot of exactly this key, or -1.
  int64_t find(const BlockKey& key) const;
  // The iovecs of one slot's header and the block's layers.
  void describe(Io& io, int64_t slot, const BlockMemory& memory, int32_t block, void* header) const;
  using IoCallback = std::function<void(Io&)>;
  // Runs every I/O of `ios` (reads or writes): prepare(io) just before it is
  // submitted, complete(io) once its result is in io.result.
  void run(std::span<Io> ios, bool write, const IoCallback& prepare, const IoCallback& complete);
  // The slot header of a write: geometry, key, checksums.
  void write_header(Io& io) const;
  Status verify(const Io& io, int64_t slot, const BlockKey& key) const;
  // The leading I/Os of `ios` that verified, as load() reports them: touches
  // and counts those, drops the first damaged slot.
  SsdLoad account(std::span<Io> ios);
  // Submits queued reads of asynchronous loads while the load ring has room.
  void submit_loads();
  // Reads the not yet submitted I/Os of every asynchronous load with preadv
  // (no load ring, or it failed).
  void read_loads_directly();
  // Stops using the load ring after a failure: waits for the reads in
  // flight through it, destroys it (an entry a failed submit left queued in
  // it dies with it, never sent into memory freed by then), and reads the
  // rest with preadv.
  void give_up_load_ring(const char* why);
  // Verifies a read the load ring completed.
  void complete_ring_load(Io& io);

  std::filesystem::path path_;
  UniqueFd fd_;  // locked (flock) while the store lives
  KvLayout layout_;
  uint64_t slot_bytes_;
  int64_t capacity_;
  std::vector<Slot> slots_;  // those used so far: grows up to capacity_
  std::unordered_map<uint64_t, int64_t> by_hash_;
  std::list<int64_t> recency_;       // stored slots, least recently used first
  std::vector<int64_t> free_slots_;  // dropped ones
  std::unique_ptr<Ring> ring_;       // null: plain preadv/pwritev
  std::unique_ptr<Ring> load_ring_;  // asynchronous loads; null: read at start_load
  std::list<PendingLoad> loads_;     // started, not yet handed back (stable addresses)
  int64_t next_load_id_ = 0;
  int32_t loads_submitted_ = 0;  // reads in flight on load_ring_
  SsdKvStoreStats stats_;
};

}  // namespace baton::engine
