// kv_transfer/byte_mover.h — the ways a sender moves a run of KV bytes into
// its peer's pool, behind one interface. The engine picks one per peer when
// the endpoint is ready (make_byte_mover) and hands it every run of every
// layer; the transfer's state machine does not care which it is.
//
//   mapped copy  RMA into a pool mapped into this process (a peer on this
//                host): a memcpy, done at once, each block hashed as copied
//   RMA put      ucp_put_nbx into the registered remote pool (RDMA)
//   tagged send  ucp_tag_send_nbx; the receiver lands it in the reserved blocks
//   AM send      ucp_am_send_nbx with a data header (wire.h); likewise
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "kv_transfer/block_runs.h"
#include "kv_transfer/transfer_engine.h"
#include "kv_transfer/wire.h"

namespace baton::kv_transfer {

// One run of adjacent blocks of one layer, as the sender moves it.
struct RunToMove {
  uint64_t transfer_id = 0;
  int32_t layer = 0;
  int32_t dst_block = 0;         // the run's first block in the peer's pool
  int32_t count = 0;             // blocks
  const uint8_t* src = nullptr;  // the run's bytes in our pool
  size_t block_bytes = 0;
  // A mover that copies in place hashes each block into these as it copies
  // it (null: no checksum); the pairs are first_pair, first_pair + 1, ...
  BlockHashes* hashes = nullptr;
  int32_t first_pair = 0;
};

class ByteMover {
 public:
  virtual ~ByteMover() = default;
  // The call it makes, for error messages.
  virtual const char* call() const = 0;
  // Done at once by the copy itself, with no UCX request to wait for.
  virtual bool copies_in_place() const { return false; }
  // Moves the run. `param` is the request's (callback and context);
  // `header` is storage that lives until the request completes. Returns
  // UCX's request: null when done at once, an error pointer when refused.
  virtual ucs_status_ptr_t move(const RunToMove& run, const ucp_request_param_t& param,
                                std::vector<uint8_t>& header) = 0;
};

// The mover for `mode` (kRma, kTag or kAm) to a peer: over `ep`, into the
// pool `remote` describes, through `rkey` (RMA), or into `mapped_pool`, the
// peer's pool mapped here (RMA; null: not mapped).
std::unique_ptr<ByteMover> make_byte_mover(TransferMode mode, ucp_ep_h ep,
                                           const PoolDescriptor& remote, ucp_rkey_h rkey,
                                           uint8_t* mapped_pool);

}  // namespace baton::kv_transfer
