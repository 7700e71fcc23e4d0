// kv_transfer/engine_staging.cc — a KV pool UCX does not register (device
// memory; common/pool_copier.h) moved through registered host slots.
//
// The slots are a small pool of the pool's block geometry, registered in
// its place, so every transfer path works on them unchanged; the wire names
// slots. A transfer holds a slot per block until its callback: the sender's
// layers are copied out into its slots as they are posted (on threads of
// their own, while the caller computes the next layer), the receiver's
// copied from its slots into the pool once they are verified (before its
// callback says they are filled). Sized by the transfers in flight, not by
// the pool: a mirror of the whole pool would pin as much host memory as the
// device holds KV.
#include "common/logging.h"
#include "kv_transfer/engine_impl.h"

namespace baton::kv_transfer {
namespace {

// Copies each direction runs at once, one transfer's in order: as many as
// the CUDA copier has streams a direction (kernels/cuda/pool_copier.cc).
constexpr size_t kCopyLanes = 4;

std::string size_text(uint64_t bytes) {
  return bytes >= (uint64_t(1) << 30) ? fmt::format("{:.1f} GiB", double(bytes) / (1 << 30))
                                      : fmt::format("{:.1f} MiB", double(bytes) / (1 << 20));
}

}  // namespace

Status TransferEngine::Impl::init_staging() {
  if (staging_ == nullptr) {
    if (config_.pool_memory == PoolMemory::kCuda) {
      return invalid_argument(
          "kv_transfer: a pool in CUDA memory needs a PoolCopier to stage it through host "
          "memory (kernels/cuda/pool_copier.h)");
    }
    return Status::ok();
  }
  Status pinned = staging_->pin(pool_, pool_bytes_);
  staging_path_ = std::string(staging_->name()) + " through " + std::to_string(layout_.num_blocks) +
                  " " + (pinned.is_ok() ? "pinned" : "pageable") + " host slots (" +
                  size_text(pool_bytes_) + ")";
  copy_in_ = std::make_unique<LaneWorkers>(kCopyLanes);
  copy_out_ = std::make_unique<LaneWorkers>(kCopyLanes);
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  const bool ucx_cuda = ucp_context_query(context_.get(), &attr) == UCS_OK &&
                        (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  // Logged once, at start: every transfer of this node pays the copies.
  spdlog::info(
      "kv_transfer[{}]: KV pool in {} ({} blocks) is staged through {} {} host slots, {} ({}; "
      "the checksum is hashed on the host){}",
      config_.node_name, staging_->name(), pool_layout_.num_blocks, layout_.num_blocks,
      pinned.is_ok() ? "pinned" : "pageable", size_text(pool_bytes_),
      ucx_cuda ? "UCX could register CUDA memory" : "this UCX has no CUDA memory support",
      pinned.is_ok() ? "" : ": pinning failed: " + pinned.to_string());
  return Status::ok();
}

Status TransferEngine::Impl::stage(StageCopy copy, const std::vector<int32_t>& blocks,
                                   const std::vector<int32_t>& slots, int32_t layer_begin,
                                   int32_t layer_end) {
  std::vector<PoolCopier::Range> ranges =
      block_byte_ranges(pool_layout_, blocks, layout_, slots, layer_begin, layer_end);
  const bool out = copy == StageCopy::kOutOfPool;
  Status s = out ? staging_->to_host(pool_, ranges) : staging_->to_device(pool_, ranges);
  return s.with_context("copying layers [" + std::to_string(layer_begin) + ", " +
                        std::to_string(layer_end) + (out ? ") out of" : ") into") +
                        " the staged pool");
}

void TransferEngine::Impl::hand_out_slots() {
  while (true) {
    uint64_t id = 0;
    {
      std::lock_guard lock(api_mutex_);
      if (waiting_for_slots_.empty()) return;
      id = waiting_for_slots_.front();
    }
    auto it = sends_.find(id);
    if (it != sends_.end() && !it->second.failed() && !give_slots_to(id, it->second)) return;
    // Given its slots, or reported, or failing (it finishes without them).
    std::lock_guard lock(api_mutex_);
    waiting_for_slots_.pop_front();
  }
}

bool TransferEngine::Impl::give_slots_to(uint64_t id, SendTransfer& t) {
  // In order with post_layers: layers posted before this are copied now,
  // later ones by their post_layers, behind this copy.
  std::lock_guard in_order(staging_mutex_);
  std::shared_ptr<const std::vector<int32_t>> src, slots;
  const int32_t from = t.spec.layer_begin;
  int32_t to = from;
  size_t lane = 0;
  {
    std::lock_guard lock(api_mutex_);
    // expect() takes slots on the caller's thread: checked and taken at once.
    const auto n = int32_t(t.spec.src_blocks.size());
    if (slots_.free() < n) return false;
    slots = std::make_shared<const std::vector<int32_t>>(slots_.take(n));
    SendTicket& ticket = send_tickets_.at(id);  // held until the send is reported
    ticket.slots = slots;
    src = ticket.staged_src;
    lane = ticket.copy_lane;
    if (!ticket.cancelled) to = ticket.posted;
    if (from < to) ++ticket.copies_pending;
  }
  t.spec.src_blocks = *slots;
  t.runs = merge_block_runs(t.spec.src_blocks, t.spec.dst_blocks);
  t.awaiting_slots = false;
  // Its clock restarts: from here on it bounds the copies and the wire, as
  // for a send that never waited.
  t.deadline =
      std::max(t.deadline, Clock::now() + t.spec.deadline.value_or(config_.default_deadline));
  // Not under api_mutex_: a stopped worker runs the copy here, and it takes the lock.
  if (from < to) {
    copy_out_->post(
        lane, [this, id, src, slots, from, to] { copy_out_layers(id, *src, *slots, from, to); });
  }
  return true;
}

}  // namespace baton::kv_transfer
