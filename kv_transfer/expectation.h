// kv_transfer/expectation.h — the receiver's side of one transfer: its state
// machine and the bookkeeping the progress thread keeps for it.
//
//   kReceiving --accept_notice--> kNoticed --start_copy_in--> kCopyingIn
//   kNoticed | kCopyingIn --conclude--> kJudged
//   kReceiving | kNoticed --fail (deadline, cancel, UCX error, shutdown)--> kFailed
//
// Data lands while it is open (kReceiving or kNoticed; the notice may
// overtake rendezvous data). kNoticed is judged once every byte is in and
// hashed; a staged pool copies the verified blocks in (kCopyingIn) before
// the verdict is recorded and acked: each layer as soon as it has landed and
// matched the sender's hash of it, while the transfer is still open, and
// whatever is left once the whole transfer is verified. kJudged and kFailed
// are final: the caller gets its blocks back (the callback runs) once
// released() says no receive of ours, no put of a sender it granted and no
// copy into the staged pool can still write them.
// Progress thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "kv_transfer/block_runs.h"
#include "kv_transfer/transfer_engine.h"
#include "kv_transfer/wire.h"

struct ucp_ep;

namespace baton::kv_transfer {

class Expectation {
 public:
  enum class State { kReceiving, kNoticed, kCopyingIn, kJudged, kFailed };

  State state() const { return state_; }
  // Deadlines, cancels, data and errors still change it.
  bool open() const { return state_ == State::kReceiving || state_ == State::kNoticed; }
  bool failed() const { return state_ == State::kFailed; }
  bool final() const { return state_ == State::kJudged || state_ == State::kFailed; }
  bool judged() const { return state_ == State::kJudged; }
  bool cancelled() const { return cancelled_; }
  // The verdict (kJudged) or why it failed (kFailed); OK before either.
  const Status& result() const { return result_; }
  // The sender's notice, once it matched (also when the transfer failed after).
  const std::optional<Notice>& notice() const { return notice_; }
  // Where the ack goes: the notice's reply endpoint, until it is closed.
  ucp_ep* reply_ep() const { return reply_ep_; }
  void forget_reply_ep() { reply_ep_ = nullptr; }

  // kReceiving -> kNoticed, with the notice and its reply endpoint.
  void accept_notice(const Notice& notice, ucp_ep* reply_ep);
  // kNoticed -> kCopyingIn: verified, its blocks are being copied in.
  void start_copy_in();
  // kNoticed or kCopyingIn -> kJudged.
  void conclude(Status verdict);
  // An open expectation -> kFailed with `why`; false (nothing changes) if it
  // is not open: a verdict reached stands, and the first failure wins.
  bool fail(Status why, bool cancelled = false);

  // Every byte the notice announces is in: bytes that came as messages
  // were counted as they landed; puts land unseen and are in by the notice.
  bool all_data_landed() const;
  // The notice asks for a checksum and this receiver verifies.
  bool checksummed(bool verify_checksum) const;
  // Failed after granting puts, before a notice: a granted put may still
  // land until the sender says its puts stopped (or time runs out).
  bool awaits_puts_stopped() const { return failed() && granted && !notice_ && !puts_stopped; }
  // Final, and nothing can write its blocks any more (a receive of ours, a
  // put we granted, a copy into the staged pool).
  bool released() const {
    return outstanding == 0 && copies_in_flight == 0 && final() && !awaits_puts_stopped();
  }
  // When the deadline checks next act on it (max: nothing pending).
  Clock::time_point next_timer(Clock::duration close_timeout) const;
  // How the bytes came, as the notice says (RMA without one).
  TransferMode mode() const;

  // Bookkeeping the engine keeps up to date.
  uint64_t serial = 0;  // this instance, so that late callbacks of an earlier one miss
  // Its dst_blocks are where the bytes land: the pool's blocks, or a staged
  // pool's slots, which hold them for pool_blocks.
  RecvSpec spec;
  std::vector<int32_t> pool_blocks;
  TransferCallback on_done;
  Clock::time_point started, deadline;
  // Once failed, receives still pending after this are abandoned: deadline +
  // close_timeout, or cancel time + close_timeout if cancelled earlier.
  Clock::time_point abandon_after;
  std::unordered_map<int32_t, size_t> pair_of;  // destination block -> pair index
  BlockHashes hashes;                           // filled as data lands
  uint64_t expected_bytes = 0;
  uint64_t received_bytes = 0;
  int outstanding = 0;    // receives of ours posted and not landed
  uint32_t op_epoch = 0;  // as SendTransfer's: bumped where the receives are written off
  void write_off_ops() {  // the engine stops waiting for the receives in flight
    outstanding = 0;
    ++op_epoch;
  }
  // RMA: a sender was granted puts. Failed before its notice, the blocks go
  // back only once it says its puts have stopped and landed (kPutsStopped),
  // or once the last grant is close_timeout old (or abandon_after passed):
  // granted puts are posted at once and land within that, and later ones
  // would need a grant it no longer gives.
  bool granted = false;
  Clock::time_point last_grant;
  bool puts_stopped = false;
  // Whole layers queued for hashing: announced by kLayerLanded (mapped
  // copies; puts into a staged pool, flushed), or the rest of them after
  // the notice (other puts land unseen).
  std::vector<bool> layer_hashed;
  int hash_jobs = 0;  // queued hashing of landed blocks; the verdict waits
  // A staged pool's layers (index: layer - spec.layer_begin): the sender's
  // hash of each (kLayerHash, kLayerLanded), and whether its copy into the
  // pool has been posted. A layer is copied in once it has landed, been
  // hashed and matched; one that does not match fails the transfer and is
  // never copied.
  std::vector<std::optional<uint64_t>> sender_layer_hash;
  std::vector<bool> layer_copy_posted;
  int copies_in_flight = 0;  // copies into the pool posted and not done
  Status copy_error;         // the first of them that failed
  bool corrupted = false;    // TransferConfig::corrupt_landed_layer did its work

 private:
  State state_ = State::kReceiving;
  std::optional<Notice> notice_;
  ucp_ep* reply_ep_ = nullptr;
  Status result_;
  bool cancelled_ = false;
};

}  // namespace baton::kv_transfer
