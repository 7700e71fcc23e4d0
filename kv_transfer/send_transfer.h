// kv_transfer/send_transfer.h — the sender's side of one transfer: its state
// machine and the bookkeeping the progress thread keeps for it.
//
//   kPosting --start_flush--> kFlushing --notice_sent--> kAwaitingAck --acked--> kAcked
//
// kPosting issues layers as the caller posts them (and, with RMA, as the
// receiver grants them). Once every layer is issued a flush makes them
// land; the notice goes out when the flush, every operation and the
// source's hashing are done (ready_for_notice), and the receiver's ack ends
// it. In any phase fail() records the first failure: nothing new is posted,
// and the transfer ends once its operations have drained; a failed RMA
// send that the receiver granted puts, and that sent no notice, first
// reports that its puts stopped (owes_stop_report). Progress thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "kv_transfer/block_runs.h"
#include "kv_transfer/transfer_engine.h"

namespace baton::kv_transfer {

class SendTransfer {
 public:
  enum class Phase { kPosting, kFlushing, kAwaitingAck, kAcked };
  // The stop report of a failed RMA send: a flush, then kPutsStopped.
  enum class StopReport { kNone, kFlushing, kSent };

  Phase phase() const { return phase_; }
  bool failed() const { return !failure_.is_ok(); }
  // The first failure, or the receiver's rejection; OK otherwise.
  const Status& failure() const { return failure_; }
  bool cancelled() const { return cancelled_; }
  bool notice_sent() const { return phase_ == Phase::kAwaitingAck || phase_ == Phase::kAcked; }
  StopReport stop_report() const { return stop_report_; }

  // kPosting -> kFlushing: every layer is issued and the flush posted.
  void start_flush();
  // The flush posted by start_flush completed.
  void flush_completed() { flush_done_ = true; }
  // kFlushing -> kAwaitingAck: the notice is out (or lost on the way).
  void notice_out();
  // kAwaitingAck -> kAcked: a verdict other than OK is the transfer's failure.
  void acked(const Status& verdict, uint64_t transfer_id);
  // Records the first failure, in any phase.
  void fail(Status why, bool cancelled = false);
  void stop_report_flushing() { stop_report_ = StopReport::kFlushing; }
  void stop_report_sent() { stop_report_ = StopReport::kSent; }

  // The notice may go: flushed, nothing in flight, the source hashed.
  bool ready_for_notice() const {
    return !failed() && phase_ == Phase::kFlushing && flush_done_ && outstanding == 0 &&
           hash_jobs == 0;
  }
  // A failed RMA send granted puts and that sent no notice (which would say
  // the same) leaves a receiver waiting for its kPutsStopped.
  bool owes_stop_report() const {
    return failed() && mode == TransferMode::kRma && granted_end > spec.layer_begin &&
           !notice_sent() && stop_report_ != StopReport::kSent;
  }
  // Waiting for nothing but layers its caller has not posted yet: every
  // layer posted is out and landed, no grant is asked for. Its deadline
  // passing then says the producer is slow, not the peer.
  bool waits_for_producer() const {
    return phase_ == Phase::kPosting && issued_end == posted_end && !asking && outstanding == 0;
  }
  // Nothing in flight, and failed or acked: the callback may run.
  bool finished() const { return outstanding == 0 && (failed() || phase_ == Phase::kAcked); }

  // Bookkeeping the engine keeps up to date.
  uint64_t serial = 0;  // this instance, so that late callbacks of an earlier one miss
  SendSpec spec;
  PeerId peer = 0;
  TransferCallback on_done;
  Clock::time_point started, deadline;
  std::vector<BlockRun> runs;
  // A staged pool's send not yet given its slots (its runs are empty).
  bool awaiting_slots = false;
  int32_t posted_end = 0;  // layers the caller has handed over
  int32_t issued_end = 0;  // layers given to UCX
  BlockHashes hashes;
  // Chosen when the endpoint is ready; kAuto: the transfer ended before.
  TransferMode mode = TransferMode::kAuto;
  uint32_t ops = 0;
  uint64_t bytes = 0;
  int outstanding = 0;  // UCX operations posted and not completed
  // Bumped where the engine writes its operations in flight off, so that
  // their late completions do not count again.
  uint32_t op_epoch = 0;
  // The engine stops waiting for the operations in flight.
  void write_off_ops() {
    outstanding = 0;
    ++op_epoch;
  }
  // RMA: layers are put only once the receiver granted them (kPutAsk ->
  // kPutGrant), so a receiver that gives its blocks up stops us by refusing.
  int32_t granted_end = 0;  // layers [layer_begin, granted_end) may be put
  bool asking = false;      // a kPutAsk awaits its grant
  // When the last kPutAsk went: its grant was given after that, and the
  // receiver writes a grant off close_timeout after giving it.
  Clock::time_point asked_at;
  int hash_jobs = 0;  // queued hashing of its source blocks; the notice waits
  // RMA into a staged pool: layers whose puts a flush saw land, and those
  // announced to the receiver since (index: layer - spec.layer_begin).
  std::vector<bool> layer_flushed, layer_announced;
  uint64_t digest = 0;

 private:
  Phase phase_ = Phase::kPosting;
  bool flush_done_ = false;
  Status failure_;
  bool cancelled_ = false;  // cancel_send: nothing new is posted, in-flight ops drain
  StopReport stop_report_ = StopReport::kNone;
};

}  // namespace baton::kv_transfer
