// kv_transfer/engine_staging.cc — a KV pool UCX does not register (device
// memory; common/pool_copier.h) moved through a registered host mirror.
//
// The mirror has the pool's layout, so every transfer path works on it
// unchanged: the sender's layers are copied out to it as they are posted (on
// a thread of their own, while the caller computes the next layer), the
// receiver's blocks copied in from it once they are verified (before its
// callback says they are filled).
#include "common/logging.h"
#include "kv_transfer/engine_impl.h"

namespace baton::kv_transfer {

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
  staging_path_ = std::string(staging_->name()) + " through a " +
                  (pinned.is_ok() ? "pinned" : "pageable") + " host mirror";
  copy_in_ = std::make_unique<SerialWorker>();
  copy_out_ = std::make_unique<SerialWorker>();
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  const bool ucx_cuda = ucp_context_query(context_.get(), &attr) == UCS_OK &&
                        (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  // Logged once, at start: every transfer of this node pays the copies.
  spdlog::info(
      "kv_transfer[{}]: KV pool in {} is staged through a {} host mirror of {} MiB ({}; the "
      "checksum is hashed on the host){}",
      config_.node_name, staging_->name(), pinned.is_ok() ? "pinned" : "pageable",
      pool_bytes_ >> 20,
      ucx_cuda ? "UCX could register CUDA memory" : "this UCX has no CUDA memory support",
      pinned.is_ok() ? "" : ": pinning failed: " + pinned.to_string());
  return Status::ok();
}

Status TransferEngine::Impl::stage(StageCopy copy, const std::vector<int32_t>& blocks,
                                   int32_t layer_begin, int32_t layer_end) {
  std::vector<PoolCopier::Range> ranges =
      block_byte_ranges(layout_, blocks, layer_begin, layer_end);
  const bool out = copy == StageCopy::kOutOfPool;
  Status s = out ? staging_->to_host(pool_, ranges) : staging_->to_device(pool_, ranges);
  return s.with_context("copying layers [" + std::to_string(layer_begin) + ", " +
                        std::to_string(layer_end) + (out ? ") out of" : ") into") +
                        " the staged pool");
}

}  // namespace baton::kv_transfer
