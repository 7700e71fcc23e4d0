// kv_transfer/engine_hash.cc — the checksum's hashing, done by the progress
// loop a slice at a time between progress calls.
//
// A sender hashes its source blocks after posting a layer, a receiver the
// blocks that landed; both only need the result for the notice or the
// verdict. Done at once, hashing an 8 MiB layer holds the worker for about a
// millisecond in which TCP moves nothing; in slices, it fills the time the
// loop spends polling for the wire.
#include "kv_transfer/engine_impl.h"

namespace baton::kv_transfer {
namespace {
// About 10-25 us of XXH3: short next to a socket buffer's worth of TCP.
constexpr size_t kHashSliceBytes = 256 << 10;
}  // namespace

void TransferEngine::Impl::queue_hash(HashJob job, int& pending) {
  if (job.pairs.empty()) return;
  ++pending;
  hash_jobs_.push_back(std::move(job));
}

bool TransferEngine::Impl::hash_slice() {
  if (hash_jobs_.empty()) return false;
  size_t budget = kHashSliceBytes;
  const size_t block_bytes = layout_.block_bytes();
  while (!hash_jobs_.empty() && budget > 0) {
    HashJob& job = hash_jobs_.front();
    BlockHashes* hashes = nullptr;
    const std::vector<int32_t>* blocks = nullptr;
    int* pending = nullptr;
    if (job.sender) {
      auto it = sends_.find(job.transfer_id);
      if (it != sends_.end() && it->second.serial == job.serial && !it->second.failed()) {
        hashes = &it->second.hashes;
        blocks = &it->second.spec.src_blocks;
        pending = &it->second.hash_jobs;
      }
    } else {
      auto it = expectations_.find(job.transfer_id);
      // A failed expectation's blocks may already belong to someone else.
      if (it != expectations_.end() && it->second.serial == job.serial && !it->second.failed()) {
        hashes = &it->second.hashes;
        blocks = &it->second.spec.dst_blocks;
        pending = &it->second.hash_jobs;
      }
    }
    if (hashes == nullptr) {  // its transfer is over: nobody waits for the hash
      hash_jobs_.pop_front();
      continue;
    }
    while (job.next < job.pairs.size() && budget > 0) {
      uint32_t pair = job.pairs[job.next++];
      const uint8_t* block = pool_ + layout_.block_byte_offset(job.layer, (*blocks)[pair]);
      hashes->set(job.layer, pair, block_hash(block, block_bytes));
      budget -= std::min(budget, block_bytes);
    }
    if (job.next < job.pairs.size()) break;
    const bool sender = job.sender;
    const uint64_t id = job.transfer_id;
    const int32_t layer = job.layer;
    hash_jobs_.pop_front();
    if (sender) announce_layer_hash(id, layer);  // a sender's job is one whole layer
    if (--*pending == 0) (sender ? dirty_sends_ : dirty_recvs_).push_back(id);
  }
  return true;
}

}  // namespace baton::kv_transfer
