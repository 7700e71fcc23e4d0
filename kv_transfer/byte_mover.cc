#include "kv_transfer/byte_mover.h"

#include <cstring>

#include "common/check.h"

namespace baton::kv_transfer {
namespace {

// UCX's shared-memory put is this same copy, but an endpoint may have no
// shared-memory lane (with peer error handling, UCX 1.13 gives a same-host
// peer TCP lanes only) and would emulate the put over them.
class MappedCopy final : public ByteMover {
 public:
  MappedCopy(uint8_t* pool, const KvLayout& layout) : pool_(pool), layout_(layout) {}
  const char* call() const override { return "memcpy"; }
  bool copies_in_place() const override { return true; }
  ucs_status_ptr_t move(const RunToMove& run, const ucp_request_param_t& /*param*/,
                        std::vector<uint8_t>& /*header*/) override {
    uint8_t* dst = pool_ + layout_.block_byte_offset(run.layer, run.dst_block);
    if (run.hashes == nullptr) {
      std::memcpy(dst, run.src, size_t(run.count) * run.block_bytes);
      return nullptr;
    }
    // Block by block, each hashed while it is still in cache from the copy.
    for (int32_t k = 0; k < run.count; ++k) {
      const size_t at = size_t(k) * run.block_bytes;
      std::memcpy(dst + at, run.src + at, run.block_bytes);
      run.hashes->set(run.layer, size_t(run.first_pair + k),
                      block_hash(run.src + at, run.block_bytes));
    }
    return nullptr;
  }

 private:
  uint8_t* pool_;
  KvLayout layout_;
};

class RmaPut final : public ByteMover {
 public:
  RmaPut(ucp_ep_h ep, uint64_t pool_base, const KvLayout& layout, ucp_rkey_h rkey)
      : ep_(ep), pool_base_(pool_base), layout_(layout), rkey_(rkey) {}
  const char* call() const override { return "ucp_put_nbx"; }
  ucs_status_ptr_t move(const RunToMove& run, const ucp_request_param_t& param,
                        std::vector<uint8_t>& /*header*/) override {
    const uint64_t remote = pool_base_ + layout_.block_byte_offset(run.layer, run.dst_block);
    return ucp_put_nbx(ep_, run.src, size_t(run.count) * run.block_bytes, remote, rkey_, &param);
  }

 private:
  ucp_ep_h ep_;
  uint64_t pool_base_;
  KvLayout layout_;
  ucp_rkey_h rkey_;
};

class TaggedSend final : public ByteMover {
 public:
  explicit TaggedSend(ucp_ep_h ep) : ep_(ep) {}
  const char* call() const override { return "ucp_tag_send_nbx"; }
  ucs_status_ptr_t move(const RunToMove& run, const ucp_request_param_t& param,
                        std::vector<uint8_t>& /*header*/) override {
    return ucp_tag_send_nbx(ep_, run.src, size_t(run.count) * run.block_bytes,
                            make_data_tag(run.transfer_id, run.layer, run.dst_block), &param);
  }

 private:
  ucp_ep_h ep_;
};

class AmSend final : public ByteMover {
 public:
  explicit AmSend(ucp_ep_h ep) : ep_(ep) {}
  const char* call() const override { return "ucp_am_send_nbx"; }
  ucs_status_ptr_t move(const RunToMove& run, const ucp_request_param_t& param,
                        std::vector<uint8_t>& header) override {
    header = encode_data_header(DataHeader{run.transfer_id, run.layer, run.dst_block, run.count});
    return ucp_am_send_nbx(ep_, kAmData, header.data(), header.size(), run.src,
                           size_t(run.count) * run.block_bytes, &param);
  }

 private:
  ucp_ep_h ep_;
};

}  // namespace

std::unique_ptr<ByteMover> make_byte_mover(TransferMode mode, ucp_ep_h ep,
                                           const PoolDescriptor& remote, ucp_rkey_h rkey,
                                           uint8_t* mapped_pool) {
  switch (mode) {
    case TransferMode::kRma:
      if (mapped_pool != nullptr) return std::make_unique<MappedCopy>(mapped_pool, remote.layout);
      return std::make_unique<RmaPut>(ep, remote.pool_base, remote.layout, rkey);
    case TransferMode::kTag:
      return std::make_unique<TaggedSend>(ep);
    case TransferMode::kAm:
      return std::make_unique<AmSend>(ep);
    case TransferMode::kAuto:
      break;
  }
  BATON_CHECK(false && "a peer's transfer mode is chosen before its mover");
  return nullptr;
}

}  // namespace baton::kv_transfer
