// kv_transfer/transfer_engine.h — the data plane of Baton: KV blocks from a
// prefill node's pool straight into a decode node's pool over UCX.
//
// Module map: kv_transfer depends on common/ only (status, logging, the paged
// KvLayout). The engine owns one UCP context and worker per node, registers the
// node's whole KV pool once, and publishes a PoolDescriptor (worker address,
// pool address, packed rkey, layout) that the control plane carries to peers.
//
//  * Sender: begin_send() opens a transfer of (src block -> dst block) pairs;
//    post_layers() hands over layers as the prefill computes them (layer-wise
//    streaming); write_blocks() does both at once. Adjacent blocks on both
//    sides merge into one operation per layer. After the last layer the engine
//    flushes (remote completion), then sends a notice with request id,
//    transfer id and xxhash of the bytes; the receiver's ack completes the
//    transfer. The completion callback is the moment the source blocks may be
//    reused: no UCX operation reads them afterwards.
//  * Receiver: expect() registers which transfer may write which blocks until
//    when. Notices and data for any other transfer are rejected and counted.
//    The callback is the moment the destination blocks are filled (OK) or may
//    be freed (error): no UCX operation of ours writes them afterwards. (One
//    exception, logged: a rendezvous receive still pending close_timeout past
//    the deadline or a cancel is abandoned, as UCX 1.13 cannot cancel it; a
//    live sender completes its receives long before that, so it can only
//    complete if a vanished sender comes back.)
//  * Cancellation: cancel_expect() hands a receiver's blocks back without
//    waiting for the deadline (aborted request, dead prefill node): the
//    expectation fails with kAborted, later data and notices for it are
//    rejected like any unknown transfer's (a notice with a negative ack), and
//    the callback runs once its receives in flight have finished or, like a
//    dead sender's, are abandoned close_timeout after the cancel. One-sided
//    puts the receiver cannot stop, so it grants them: a sender puts a batch
//    of layers only after the receiver's kPutGrant (wire.h), which a failed
//    or cancelled expectation no longer gives. Failed before the notice, an
//    expectation that granted puts calls back once the sender reports them
//    stopped and landed (it flushes, then says so), or close_timeout after
//    the last grant if it never does (its granted puts were posted at once).
//    cancel_send() stops posting; its callback waits for what was posted.
//  * Operation: one-sided puts when UCX has a native RMA lane to the peer
//    whose memory domain can register the pool (kv_transfer/ucx_probe.h says
//    how that is read from UCX); otherwise tagged rendezvous straight into the
//    destination blocks (active messages as the alternative), which UCX's own
//    zero-copy protocols (CMA, TCP zcopy) serve, where emulated puts would
//    crawl. Overridable (TransferConfig::mode) for benchmarks.
//  * Device pools: a pool UCX cannot register (GPU memory; Debian's UCX has
//    no CUDA support) is staged through registered host slots of its block
//    geometry (TransferConfig::staging_blocks of them) by a PoolCopier
//    (common/pool_copier.h). A transfer holds a slot per block: a receiver's
//    expect() takes them at once (the sender writes them, not the pool's
//    blocks), a send takes them when it starts or, with too few free,
//    waits for them in order. Layers are copied out of the pool into the
//    send's slots as they are posted, on copy-out threads while the caller
//    computes the next, and a received layer is copied from its slots into
//    the pool once it has landed and matched its sender's hash of it (the
//    rest once the transfer is verified, before the ack), on copy-in
//    threads; different transfers' copies run side by side
//    (kv_transfer/engine_staging.cc).
//  * Failure: deadlines on both sides; UCX peer error handling where the
//    transports support it; a receiver ack closes every transfer, so a dead
//    receiver is noticed even on shared memory. A failed endpoint is torn down
//    and recreated on next use. One progress thread owns the worker and never
//    waits without a timeout.
//
// All methods are thread-safe. Callbacks run on the engine's progress thread:
// keep them short; they may call back into the engine, cancel_* included (on
// any transfer, their own being already gone: NotFound). Called from a
// callback, expect() and cancel_*() do not wait for the progress thread; they
// take effect before the engine next progresses UCX.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/kv_layout.h"
#include "common/pool_copier.h"
#include "common/status.h"
#include "kv_transfer/transfer_config.h"

namespace baton::kv_transfer {

using PeerId = uint32_t;
using Clock = std::chrono::steady_clock;

struct SendSpec {
  uint64_t request_id = 0;
  // Unique among this sender's live transfers and the receiver's expectations;
  // the control plane picks it with the destination blocks. At most 2^32 - 1
  // (it travels in message tags).
  uint64_t transfer_id = 0;
  std::vector<int32_t> src_blocks;  // in this node's pool
  // In the peer's pool, paired with src_blocks: the blocks its expect()
  // said to write (a staged pool's slots).
  std::vector<int32_t> dst_blocks;
  int32_t layer_begin = 0;
  int32_t layer_end = -1;  // exclusive; -1: every layer of the pool
  // Default: config.default_deadline. Counted from begin_send and again from
  // every post_layers() call (whichever ends later), so it bounds the wire's
  // time, not the producer's: a long prefill step between layers is fine.
  std::optional<std::chrono::milliseconds> deadline;
};

struct RecvSpec {
  uint64_t request_id = 0;
  uint64_t transfer_id = 0;
  std::vector<int32_t> dst_blocks;  // in this node's pool, the sender's block order
  int32_t layer_begin = 0;
  int32_t layer_end = -1;
  std::optional<std::chrono::milliseconds> deadline;
};

struct TransferResult {
  Status status;
  uint64_t request_id = 0;
  uint64_t transfer_id = 0;
  uint64_t bytes = 0;
  uint32_t ops = 0;  // puts or messages the sender posted (after merging)
  uint64_t checksum = 0;
  // The one actually used; kAuto for a send that ended before it chose one.
  TransferMode mode = TransferMode::kAuto;
  Clock::time_point started;
  Clock::time_point finished;
};

using TransferCallback = std::function<void(const TransferResult&)>;

// Rejected tagged messages (data for no live expectation) received at once
// at most; later ones wait, probed, until one of these is done.
inline constexpr size_t kMaxRejectedInFlight = 4;

struct EngineStats {
  uint64_t sends_ok = 0;
  uint64_t sends_failed = 0;
  uint64_t receives_ok = 0;
  uint64_t receives_failed = 0;
  uint64_t ops_posted = 0;
  uint64_t bytes_sent = 0;
  uint64_t notices_rejected = 0;  // garbage, late, duplicate or foreign notices/acks
  uint64_t data_rejected = 0;     // data messages for no live expectation
  uint64_t endpoints_torn_down = 0;
  // Staged sends that found too few free staging slots and queued for them.
  uint64_t sends_waited_for_slots = 0;
  // The most bytes of scratch held at once for rejected data received
  // only to be dropped.
  uint64_t discard_scratch_peak_bytes = 0;
};

class TransferEngine {
 public:
  // Registers `pool` (`pool_bytes` = layout.total_bytes()) and starts the
  // progress thread. With `pool` null, UCX allocates the pool (pool() has
  // it, owned by the engine until it is destroyed): from shared
  // memory where UCX can, so that a peer on the same host maps it and its
  // puts are plain stores (see ucx_probe.h), not a copy through the kernel.
  //
  // With `staging`, `pool` is memory UCX does not register (a GPU's: config
  // pool_memory kCuda requires it) and the engine never touches it itself: it
  // registers config.staging_blocks host slots of the pool's block geometry
  // instead, has each sent layer copied out to its send's slots as it is
  // posted (on copy-out threads) and each received layer copied in from
  // its slots once verified (all of them before the callback). The slots
  // cost staging_blocks blocks of host memory, pinned where the copier can.
  static Result<std::unique_ptr<TransferEngine>> create(
      const TransferConfig& config, const KvLayout& layout, void* pool, size_t pool_bytes,
      std::unique_ptr<PoolCopier> staging = nullptr);
  // Fails every unfinished transfer with kAborted (callbacks run) and stops.
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // The pool: the one given to create() (staged or not), or the one UCX allocated.
  void* pool() const;
  // This node's PoolDescriptor, encoded (kv_transfer/wire.h).
  const std::vector<uint8_t>& descriptor() const;
  // Decodes a peer's descriptor; the endpoint is created on first use.
  Result<PeerId> add_peer(std::span<const uint8_t> descriptor);
  // Closes the endpoint to a peer a newer descriptor replaces (its sends in
  // flight fail, as to a dead peer); the id is not used again.
  void remove_peer(PeerId id);

  // A staged pool's send with fewer slots free than it has blocks (or
  // behind sends that wait) waits for them, in order: post_layers() is taken
  // as usual, and its deadline runs meanwhile (restarted by each
  // post_layers() and once it has its slots).
  Status begin_send(PeerId peer, SendSpec spec, TransferCallback on_done);
  // Layers [.., layer_end) of the transfer are computed and may be sent.
  // A staged pool's new layers are copied out on a thread of the engine's,
  // in the order they were posted, while the caller goes on: they must be in
  // the pool when this is called (a device's compute stream synchronised)
  // and stay as they are until the callback. A failed copy fails the
  // transfer (its callback says so).
  Status post_layers(uint64_t transfer_id, int32_t layer_end);
  // begin_send + post_layers(all).
  Status write_blocks(PeerId peer, SendSpec spec, TransferCallback on_done);

  // Returns once the expectation is live: data for it that arrives from then
  // on is accepted, so the caller may now tell the sender to start, naming
  // `wire_blocks`: the blocks it is to write, paired with spec.dst_blocks
  // (those themselves, or a staged pool's slots, which the expectation
  // holds until its callback). A staged pool needs `wire_blocks`, and
  // refuses with kResourceExhausted while fewer slots are free than the
  // transfer has blocks (staging_slots_free()).
  Status expect(RecvSpec spec, TransferCallback on_done,
                std::vector<int32_t>* wire_blocks = nullptr);

  // Cancels a live expectation. Its callback runs with kAborted as soon as no
  // UCX operation of ours can still write its blocks: at once when nothing for
  // it is in flight, otherwise when the in-flight receives finish (or are
  // abandoned as the deadline logic already does, close_timeout after the
  // cancel). Later data/notices for it are rejected (counted) as for any
  // unknown transfer; a late notice gets a negative ack so the sender fails
  // fast. NotFound if no such expectation (never expected, its callback
  // already taken to run, or already cancelled). Returns once data arriving
  // from then on is rejected (a wait bounded like expect()'s); the callback
  // may run before or after it returns. If the expectation had already failed or completed, or
  // is verified and being copied into a staged pool, that verdict stands and the callback
  // reports it (for a copy, once it is done: OK or the copy's error).
  Status cancel_expect(uint64_t transfer_id);
  // Cancels a send: no new operations are posted; the callback runs with
  // kAborted once every posted operation has completed (the source blocks are
  // then free to reuse). The receiver learns nothing from us (its expectation
  // is cancelled or times out). NotFound if no such transfer (or already
  // cancelled); post_layers() on it is NotFound from then on. Operations still
  // pending at the transfer's deadline make its peer's endpoint go, as for a
  // transfer that missed it. If the transfer had already failed, that failure
  // is what the callback reports.
  Status cancel_send(uint64_t transfer_id);

  // Sends raw bytes on the notice channel (control-path tests and tooling).
  Status send_control_bytes(PeerId peer, std::vector<uint8_t> bytes);

  // A staged pool's slots (0 for a pool registered in place), and those no
  // transfer holds (INT32_MAX for a pool registered in place).
  int32_t staging_slots() const;
  int32_t staging_slots_free() const;

  EngineStats stats() const;
  // The transports the UCP context uses, as UCX names them ("tcp/lo").
  std::vector<std::string> transports() const;
  // How the pool meets the wire: "" when UCX registers it in place, else
  // the staging's path ("cuda device 0 through 512 pinned host slots
  // (1.0 GiB)").
  const std::string& staging() const;
  // How transfers reach `peer` while its endpoint is up: the mode and
  // the transports UCX chose ("rma (native) over rc_mlx5/mlx5_0:1 self/memory",
  // "tag over tcp/lo"); "" before it connects (the first transfer) and
  // after it was torn down.
  std::string peer_path(PeerId peer) const;

  class Impl;

 private:
  explicit TransferEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace baton::kv_transfer
