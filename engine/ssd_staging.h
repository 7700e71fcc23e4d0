// engine/ssd_staging.h — the SSD tier's way to a KV pool the CPU cannot
// reach (a device's): a few host slots of one block each, pinned for the
// device's DMA, that blocks pass through. A block is copied out of the pool
// into a save slot before the store writes it, and read by the store into a
// load slot, verified there and then copied into the pool.
//
// Sized by what the store has in flight (SsdKvStore::kIoDepth reads, and a
// save batch of as many writes), not by the pool: a host mirror of the pool
// would take as much host memory as the device has for its pool, and the
// tier touches every block sooner or later.
//
// The slots are themselves a small pool of the device pool's layout (slot i
// is block i of it), so the store reads and writes them as it would the
// pool, and a run of adjacent blocks into adjacent slots is one copy per
// layer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/pool_copier.h"
#include "common/slot_free_list.h"
#include "common/status.h"
#include "engine/kv_pool.h"
#include "engine/ssd_kv_store.h"

namespace baton::engine {

class SsdStaging {
 public:
  // Slots for blocks of `pool_layout` (the device pool's) copied by
  // `copier`: `load_slots` that loads read into, `save_slots` that saves
  // write from (at least one of each).
  static Result<std::unique_ptr<SsdStaging>> create(const KvLayout& pool_layout,
                                                    std::unique_ptr<PoolCopier> copier,
                                                    int32_t load_slots, int32_t save_slots);
  SsdStaging(const SsdStaging&) = delete;
  SsdStaging& operator=(const SsdStaging&) = delete;

  // Where the store reads and writes the slots.
  BlockMemory memory() const;
  size_t bytes() const { return slots_.bytes(); }

  int32_t free_load_slots() const { return free_.free(); }
  // `n` free load slots (at most free_load_slots()), the lowest first.
  std::vector<int32_t> take_load_slots(int32_t n) { return free_.take(n); }
  void give_back(std::span<const int32_t> slots) { free_.give_back(slots); }

  // The save slots, in order: a save of more blocks goes in batches.
  std::span<const int32_t> save_slots() const { return save_slots_; }

  // Pool blocks[i] into slots[i] (copy_out), or back; returns once done.
  Status copy_out(std::span<const int32_t> blocks, std::span<const int32_t> slots);
  Status copy_in(std::span<const int32_t> slots, std::span<const int32_t> blocks);
  const char* copier_name() const { return copier_->name(); }
  // Whether the copier page-locked the slots (a device's copier can).
  bool pinned() const { return pinned_; }

 private:
  SsdStaging(const KvLayout& pool_layout, KvPool slots, std::unique_ptr<PoolCopier> copier,
             int32_t load_slots, bool pinned);
  // The byte ranges between pool blocks[i] and slots[i], every layer.
  std::vector<PoolCopier::Range> ranges(std::span<const int32_t> blocks,
                                        std::span<const int32_t> slots) const {
    return block_byte_ranges(pool_layout_, blocks, slots_.layout(), slots, 0,
                             pool_layout_.num_layers);
  }

  KvLayout pool_layout_;
  // Declared before the copier, so destroyed after it: the copier unpins
  // the slots' memory before it is unmapped.
  KvPool slots_;
  std::unique_ptr<PoolCopier> copier_;
  SlotFreeList free_;  // the load slots
  std::vector<int32_t> save_slots_;
  bool pinned_;
};

}  // namespace baton::engine
