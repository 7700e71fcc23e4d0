#include "engine/ssd_staging.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <numeric>
#include <utility>

#include "common/check.h"

namespace baton::engine {

Result<std::unique_ptr<SsdStaging>> SsdStaging::create(const KvLayout& pool_layout,
                                                       std::unique_ptr<PoolCopier> copier,
                                                       int32_t load_slots, int32_t save_slots) {
  if (copier == nullptr) return invalid_argument("SSD staging needs the pool's copier");
  if (load_slots < 1 || save_slots < 1) {
    return invalid_argument("SSD staging needs a load slot and a save slot at least");
  }
  KvLayout slot_layout = pool_layout;
  slot_layout.num_blocks = load_slots + save_slots;
  BATON_ASSIGN_OR_RETURN(KvPool slots, KvPool::create(slot_layout));
  const Status pinned = copier->pin(slots.data(), slots.bytes());
  // Once, at start: every block the tier moves pays for pageable copies.
  spdlog::info("ssd cache: blocks of the pool in {} pass through {} slots of {} KiB, {}",
               copier->name(), slot_layout.num_blocks,
               (size_t(pool_layout.num_layers) * pool_layout.block_bytes()) >> 10,
               pinned.is_ok() ? std::string("pinned") : "pageable (" + pinned.message() + ")");
  return std::unique_ptr<SsdStaging>(
      new SsdStaging(pool_layout, std::move(slots), std::move(copier), load_slots, pinned.is_ok()));
}

SsdStaging::SsdStaging(const KvLayout& pool_layout, KvPool slots,
                       std::unique_ptr<PoolCopier> copier, int32_t load_slots, bool pinned)
    : pool_layout_(pool_layout),
      slots_(std::move(slots)),
      copier_(std::move(copier)),
      free_(0, load_slots),
      pinned_(pinned) {
  save_slots_.resize(size_t(slots_.layout().num_blocks - load_slots));
  std::iota(save_slots_.begin(), save_slots_.end(), load_slots);
}

BlockMemory SsdStaging::memory() const {
  return BlockMemory::of_pool(slots_.layout(), slots_.data());
}

Status SsdStaging::copy_out(std::span<const int32_t> blocks, std::span<const int32_t> slots) {
  if (blocks.empty()) return Status::ok();
  return copier_->to_host(slots_.data(), ranges(blocks, slots));
}

Status SsdStaging::copy_in(std::span<const int32_t> slots, std::span<const int32_t> blocks) {
  if (blocks.empty()) return Status::ok();
  return copier_->to_device(slots_.data(), ranges(blocks, slots));
}

}  // namespace baton::engine
