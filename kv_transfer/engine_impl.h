// kv_transfer/engine_impl.h — internals of TransferEngine, shared by its .cc files.
//
// Threading: API calls validate what they can under `api_mutex_`, then queue a
// command and wake the progress thread with ucp_worker_signal. Everything UCX
// (the worker, endpoints, requests, AM handlers) and every map below marked
// "progress thread" is touched by that thread only. UCX callbacks only record
// what happened and mark a transfer dirty; the loop acts on it afterwards, so
// no callback re-enters a half-updated map (force-closing an endpoint completes
// its requests from inside ucp_ep_close_nbx).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/slot_free_list.h"
#include "kv_transfer/block_runs.h"
#include "kv_transfer/byte_mover.h"
#include "kv_transfer/expectation.h"
#include "kv_transfer/send_transfer.h"
#include "kv_transfer/serial_worker.h"
#include "kv_transfer/transfer_engine.h"
#include "kv_transfer/ucx_handles.h"
#include "kv_transfer/ucx_probe.h"
#include "kv_transfer/wire.h"

namespace baton::kv_transfer {

// user_data of every UCX request we post.
struct OpContext {
  enum Kind : uint8_t {
    kSendData,
    kFlush,
    kLayerFlush,  // one layer's puts, for a staged receiver (layer: which)
    kNotice,
    kRecvData,
    kAck,
    kConnect,
    kDiscard,
    kDiscardTag
  };
  OpContext(TransferEngine::Impl* e, uint64_t id, Kind k, uint32_t p = 0, uint64_t g = 0)
      : engine(e), transfer_id(id), kind(k), peer(p), generation(g) {}
  TransferEngine::Impl* engine = nullptr;
  uint64_t transfer_id = 0;
  Kind kind = kSendData;
  uint32_t peer = 0;
  uint64_t generation = 0;
  uint64_t serial = 0;  // the SendTransfer/Expectation instance, so late callbacks miss
  // Its op_epoch when posted: an operation written off since (the engine
  // stopped waiting for it) no longer counts when it completes.
  uint32_t epoch = 0;
  uint64_t bytes = 0;
  int32_t layer = 0, first_block = 0, block_count = 0;  // a receive's destination run
  std::vector<uint8_t> header;  // AM header alive until the send completes; discard scratch
};

// err_handler argument of an endpoint.
struct EndpointTag {
  TransferEngine::Impl* engine = nullptr;
  uint32_t peer = 0;
  uint64_t generation = 0;
};

struct PeerState {  // progress thread
  PoolDescriptor descriptor;
  enum class Phase { kIdle, kConnecting, kReady } phase = Phase::kIdle;
  ucp_ep_h ep = nullptr;
  RkeyPtr rkey;
  uint64_t generation = 0;
  TransferMode mode = TransferMode::kAm;
  bool no_failure_detection = false;  // endpoint runs without UCP peer error handling
  EndpointCaps caps;
  // The peer's pool mapped into this process (ucp_rkey_ptr succeeded: UCX
  // allocated it from shared memory on this host), else null.
  uint8_t* mapped_pool = nullptr;
  // How runs reach the peer's pool, chosen with `mode` once it is ready.
  std::unique_ptr<ByteMover> mover;
  std::vector<uint64_t> waiting;  // transfers queued until connected
};

// Hashing the loop does between progress calls, a slice at a time
// (engine_hash.cc): hashing a whole layer at once would starve the wire (TCP
// moves bytes only while the worker is progressed), and on busy cores the
// slices fill the time the loop would otherwise spend polling.
struct HashJob {
  uint64_t transfer_id = 0;
  uint64_t serial = 0;  // of the send or expectation it belongs to
  bool sender = false;  // source blocks of a send, else blocks landed here
  int32_t layer = 0;
  std::vector<uint32_t> pairs;  // block pairs of the transfer to hash
  size_t next = 0;
};

// The registered host slots of a staged pool of `pool` geometry: `blocks`
// of them (0: as many as the pool has).
inline KvLayout staging_slot_layout(const KvLayout& pool, int32_t blocks) {
  KvLayout slots = pool;
  if (blocks > 0) slots.num_blocks = blocks;
  return slots;
}

// Pairs 0..n-1: a whole layer of a transfer.
inline std::vector<uint32_t> every_pair(size_t n) {
  std::vector<uint32_t> pairs(n);
  for (size_t i = 0; i < n; ++i) pairs[i] = uint32_t(i);
  return pairs;
}

class TransferEngine::Impl {
 public:
  Impl(const TransferConfig& config, const KvLayout& layout, uint8_t* pool, size_t pool_bytes,
       std::unique_ptr<PoolCopier> staging)
      : config_(config),
        pool_layout_(layout),
        layout_(staging == nullptr ? layout : staging_slot_layout(layout, config.staging_blocks)),
        pool_(staging == nullptr ? pool : nullptr),
        pool_bytes_(staging == nullptr ? pool_bytes : layout_.total_bytes()),
        staged_pool_(staging == nullptr ? nullptr : pool),
        staging_(std::move(staging)),
        slots_(0, staged_pool_ == nullptr ? 0 : layout_.num_blocks) {}
  ~Impl();

  Status init();          // context, worker, registration, descriptor, handlers, thread
  Status init_staging();  // pins a staged pool's slots; logs the staging once

  // API side (any thread).
  Result<PeerId> add_peer(std::span<const uint8_t> bytes);
  void remove_peer(PeerId id);
  // `all_posted`: every layer is ready now (write_blocks), no post_layers to follow.
  Status begin_send(PeerId peer, SendSpec spec, TransferCallback on_done, bool all_posted);
  Status post_layers(uint64_t transfer_id, int32_t layer_end);
  // On copy_out_: layers [from, to) of send `id`'s staged source blocks out
  // of the pool into its slots, then their release to the wire (or the
  // send's failure).
  void copy_out_layers(uint64_t id, const std::vector<int32_t>& blocks,
                       const std::vector<int32_t>& slots, int32_t from, int32_t to);
  // Progress thread: layers [.., layer_end) of send `id` may go on the wire.
  void release_layers(uint64_t id, int32_t layer_end);
  Status expect(RecvSpec spec, TransferCallback on_done, std::vector<int32_t>* wire_blocks);
  Status cancel_expect(uint64_t transfer_id);
  Status cancel_send(uint64_t transfer_id);
  Status send_control_bytes(PeerId peer, std::vector<uint8_t> bytes);
  EngineStats stats() const;
  int32_t staging_slots_free() const;
  std::string peer_path(PeerId peer) const;  // TransferEngine::peer_path
  // What begin_send and expect check alike: the id fits the wire, the layer
  // range (layer_end -1: every layer, filled in) lies in the pool, the
  // deadline is in range.
  Status check_transfer(uint64_t transfer_id, int32_t layer_begin, int32_t& layer_end,
                        const std::optional<std::chrono::milliseconds>& deadline) const;

  // UCX callbacks (progress thread).
  void on_op_complete(OpContext* op, ucs_status_t status);
  void on_endpoint_error(EndpointTag* tag, ucs_status_t status);
  ucs_status_t on_control(const void* header, size_t header_length, ucp_ep_h reply_ep);
  ucs_status_t on_data(const void* header, size_t header_length, void* data, size_t length,
                       const ucp_am_recv_param_t* param);

  const TransferConfig config_;
  uint32_t notices_to_drop_ = config_.drop_notices;  // progress thread
  // The caller's pool, whose block ids begin_send and expect take.
  const KvLayout pool_layout_;
  // The registered memory every transfer reads and writes, whose blocks
  // the wire names: the pool itself, or a staged pool's slots.
  const KvLayout layout_;
  // The registered memory: the caller's pool, or one UCX allocates (set by
  // init()), or a staged pool's slots.
  uint8_t* pool_;
  const size_t pool_bytes_;
  // A pool UCX does not register (device memory), moved through the slots
  // in pool_ by staging_; null when the pool is registered in place.
  uint8_t* const staged_pool_;
  std::vector<uint8_t> descriptor_bytes_;
  std::vector<std::string> transports_;
  std::string staging_path_;                      // TransferEngine::staging(); set once, at start
  std::vector<std::string> registering_domains_;  // UCT domains that register user memory

 private:
  void run();
  // A staged pool's `blocks` in layers [layer_begin, layer_end) into
  // `slots` (the sender, before they are posted) or from them into the
  // device pool (the receiver, once they are verified).
  enum class StageCopy { kOutOfPool, kIntoPool };
  Status stage(StageCopy copy, const std::vector<int32_t>& blocks,
               const std::vector<int32_t>& slots, int32_t layer_begin, int32_t layer_end);
  // Progress thread: gives the sends waiting for slots theirs, in order,
  // while enough are free; each then copies out the layers posted so far.
  void hand_out_slots();
  // False, taking nothing, if fewer are free than `t` has blocks.
  bool give_slots_to(uint64_t id, SendTransfer& t);
  void enqueue(std::function<void()> command);
  // Queues `command` and, unless called on the progress thread (a callback),
  // waits until it has run, at most close_timeout (`what` names it in the log).
  void enqueue_and_wait(std::function<void()> command, uint64_t transfer_id, const char* what);
  void wait_for_events(Clock::time_point now);
  // UCX operations of ours in flight (puts and sends not completed, receives
  // not landed): keep polling. Otherwise the worker sleeps until an event.
  bool busy() const;

  // Peers and endpoints.
  void connect(PeerId id);
  void on_connected(PeerId id, uint64_t generation, ucs_status_t status);
  void tear_down(PeerId id, const Status& why);
  ucs_status_ptr_t post_op(OpContext* op, ucs_status_ptr_t request);
  // A new operation of send `t` (id `id`) on `peer`'s endpoint, tagged with
  // the send's instance and epoch.
  OpContext* send_op(const SendTransfer& t, uint64_t id, OpContext::Kind kind,
                     const PeerState& peer);

  // Sending.
  void start_send(uint64_t transfer_id);
  void pump(SendTransfer& t, uint64_t id);
  void issue_layer(SendTransfer& t, uint64_t id, PeerState& peer, int32_t layer);
  // Puts land unseen: a flush of `layer`'s puts tells a staged receiver
  // that the layer is in its slots (announce_layer_hash).
  void flush_layer(SendTransfer& t, uint64_t id, PeerState& peer, int32_t layer);
  // A staged receiver's notice that `layer` is verifiable: kLayerHash once
  // the sender has hashed it (messages, which the receiver counts as they
  // land), kLayerLanded once it is also flushed (puts).
  void announce_layer_hash(uint64_t id, int32_t layer);
  void maybe_finish_send(uint64_t id);
  void apply_cancel_send(uint64_t id);

  // Receiving.
  void handle_notice(const Notice& n, ucp_ep_h reply_ep);
  // Put grants (wire.h): the receiver's side, then the sender's.
  void handle_put_ask(const Notice& n, ucp_ep_h reply_ep);
  void handle_puts_stopped(const Notice& n);
  void hash_announced_layer(const Notice& n);
  // The expectation that granted puts to the sender of `n`, else null (and
  // the message is rejected as `what`).
  Expectation* granted_expectation(const Notice& n, const char* what);
  void ask_to_put(SendTransfer& t, uint64_t id, PeerState& peer);
  void handle_put_grant(const Notice& n);
  // Flush, then kPutsStopped, for a failed send that was granted puts; true
  // while that is still under way.
  bool report_puts_stopped(SendTransfer& t, uint64_t id);
  // Sends a control message (fire and forget); false if UCX refused it.
  bool send_control(ucp_ep_h ep, const Notice& n, bool want_reply, const char* what);
  void handle_ack(const Notice& n);
  void send_ack(ucp_ep_h reply_ep, const Notice& n, const Status& verdict);
  void discard_rendezvous(void* data_desc, size_t length);
  // The longest run of blocks a transfer can write: one layer of the pool.
  size_t max_run_bytes() const { return size_t(layout_.num_blocks) * layout_.block_bytes(); }
  // The live expectation a run of KV data may land in, or null with `why`.
  Expectation* accept_run(uint64_t transfer_id, int32_t layer, int32_t dst_block,
                          int64_t block_count, size_t length, std::string& why);
  OpContext* landing_op(Expectation& e, uint64_t transfer_id, int32_t layer, int32_t block,
                        int32_t count, size_t length);
  void landing_started(Expectation& e, uint64_t transfer_id, ucs_status_ptr_t request,
                       const char* call);
  // Probes tagged KV messages, receiving each into its blocks; returns how many.
  int receive_tagged();
  // Receives queued rejected tagged messages one at a time (see
  // pending_discards_).
  void drain_discards();
  void maybe_finish_recv(uint64_t id);
  void apply_cancel_expect(uint64_t id);
  void judge(uint64_t id, Expectation& e);
  // Records the verdict and acks it.
  void conclude(Expectation& e, Status verdict);
  // Records the copies into a staged pool that finished, and concludes the
  // receives whose last copy that was.
  void collect_copied_in();
  // A staged pool's layers of `e` that landed and match the sender's hash of
  // them: posted for copying in now; one that does not match fails `e`.
  void copy_in_verified_layers(uint64_t id, Expectation& e);
  // Posts the copy of `layers` of `e` into the staged pool.
  void post_copy_in(uint64_t id, Expectation& e, std::vector<int32_t> layers);
  // kLayerHash: the sender's hash of one layer, for a staged pool.
  void record_layer_hash(const Notice& n);
  // Keeps the layer hash that `n` (kLayerHash, kLayerLanded) carries for
  // `e`, whose layers it lies within, and has `e` looked at again.
  void note_sender_layer_hash(Expectation& e, const Notice& n);
  // TransferConfig::corrupt_landed_layer: flips a bit of `block` of `layer`.
  void corrupt_for_tests(Expectation& e, int32_t layer, int32_t block);
  // Hashes landed blocks for the verdict: `now` for bytes just copied (still
  // in cache), else queued for the loop.
  void hash_landed(Expectation& e, int32_t layer, int32_t first_block, int32_t count, bool now);
  // Queues every layer of a noticed transfer not yet hashed (puts land unseen).
  void hash_unseen_layers(Expectation& e);
  void hash_layer(Expectation& e, int32_t layer);
  // Queues `job`, counted in `pending` (its transfer's hash_jobs) until done.
  void queue_hash(HashJob job, int& pending);
  // Hashes up to one slice of queued blocks; false if there was nothing to do.
  bool hash_slice();
  void reject_notice(const std::string& why);

  void check_deadlines(Clock::time_point now);
  void process_events();
  void shutdown();
  // The commands enqueued so far, in order; the queue left empty.
  std::vector<std::function<void()>> take_commands();

  UcpContextPtr context_;
  UcpWorkerPtr worker_;
  MemRegistration registration_;
  // After registration_: destroyed first, it unpins the slots before UCX
  // unmaps them.
  std::unique_ptr<PoolCopier> staging_;
  // Held by post_layers (and by a send given its slots) from a staged
  // send's ticket update until its copy is queued: copies run in the order
  // their layers were handed over.
  std::mutex staging_mutex_;
  // Copies a staged send's posted layers out of the pool, off the caller's
  // thread (a GPU's next layer computes meanwhile), then hands them to the
  // progress thread; each send on its lane (SendTicket::copy_lane). After
  // staging_: stopped before the copier goes.
  std::unique_ptr<LaneWorkers> copy_out_;
  size_t next_copy_out_lane_ = 0;  // under api_mutex_
  // Copies verified receives from their slots into a staged pool, off the
  // progress thread, and hands back (transfer id, how the copy went); each
  // receive on the lane its serial picks.
  std::unique_ptr<LaneWorkers> copy_in_;
  std::mutex copied_in_mutex_;
  // A copy into a staged pool that finished.
  struct CopiedIn {
    uint64_t transfer_id;
    uint64_t serial;
    Status status;
  };
  std::vector<CopiedIn> copied_in_;
  // Receives failed on their data (a layer that did not match, a copy into
  // the staged pool) before their notice came, most recent last and a few
  // only: their blocks went back at once, and a sender that asks later (its
  // notice, a put request) is told that verdict rather than "not expected".
  struct DataVerdict {
    uint64_t transfer_id;
    uint64_t request_id;
    Status status;
  };
  std::deque<DataVerdict> data_verdicts_;
  // The recorded verdict for transfer `id` of `request_id`, taken; else null.
  std::optional<Status> take_data_verdict(uint64_t id, uint64_t request_id);
  // What to tell the sender of `n` about its failed receive `it` (or one
  // already released: end()) if it failed on its data; else null.
  std::optional<Status> data_verdict(std::unordered_map<uint64_t, Expectation>::iterator it,
                                     const Notice& n);
  std::atomic<bool> has_copied_in_{false};  // so the loop takes the lock only then
  int event_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> has_commands_{false};

  // API side, under api_mutex_.
  mutable std::mutex api_mutex_;
  std::vector<KvLayout> peer_layouts_;
  std::vector<bool> peer_removed_;       // remove_peer: refused from then on
  std::vector<std::string> peer_paths_;  // TransferEngine::peer_path, set by the loop
  struct SendTicket {
    int32_t posted = 0, end = 0;  // layers handed over, the transfer's layer_end
    bool cancelled = false;
    // A staged pool's source blocks, copied out layer by layer as they are
    // posted into `slots` (null until the send has its slots).
    std::shared_ptr<const std::vector<int32_t>> staged_src;
    std::shared_ptr<const std::vector<int32_t>> slots;
    // Copies of posted layers queued or running: the callback, which frees
    // the source blocks, waits until none is.
    int32_t copies_pending = 0;
    size_t copy_lane = 0;  // of copy_out_: the send's copies run in order there
  };
  // Live transfers and expectations, from the API call until their callback
  // has been taken to run; `cancelled`: cancel_* accepted for it.
  std::unordered_map<uint64_t, SendTicket> send_tickets_;
  std::unordered_map<uint64_t, bool> recv_tickets_;  // id -> cancelled
  // A staged pool's slots no transfer holds, and the sends waiting for
  // theirs, first come first served (given them by the progress thread).
  SlotFreeList slots_;
  std::deque<uint64_t> waiting_for_slots_;
  std::vector<std::function<void()>> commands_;

  // Progress thread.
  uint64_t next_serial_ = 1;
  // The run of the receive being posted, for one completing in place.
  size_t op_bytes_ = 0;
  int32_t op_layer_ = 0, op_block_ = 0, op_count_ = 0;
  std::vector<PeerState> peers_;
  std::deque<EndpointTag> endpoint_tags_;
  std::unordered_map<uint64_t, SendTransfer> sends_;
  std::unordered_map<uint64_t, Expectation> expectations_;
  std::vector<uint64_t> dirty_sends_, dirty_recvs_;
  std::vector<uint64_t> granted_sends_;  // granted more layers: pumped by the loop
  std::vector<Notice> landed_layers_;    // kLayerLanded to hash, off the callback
  // Layers of sends whose puts a flush saw land (transfer, layer), to
  // announce off the callback.
  std::vector<std::pair<uint64_t, int32_t>> flushed_layers_;
  std::deque<HashJob> hash_jobs_;
  std::vector<std::tuple<PeerId, uint64_t, ucs_status_t>> failed_endpoints_;
  std::vector<std::tuple<PeerId, uint64_t, ucs_status_t>> connected_;

  // Rejected tagged data (a cancelled or failed transfer's later layers)
  // is received kMaxRejectedInFlight messages at a time, each into scratch
  // of its own; the rest wait here, probed. Received all at once, the
  // layers of a cancelled long prompt would each hold a run's worth of
  // scratch.
  struct PendingDiscard {
    ucp_tag_message_h message = nullptr;
    size_t length = 0;
  };
  std::deque<PendingDiscard> pending_discards_;
  size_t tagged_discards_in_flight_ = 0;
  // Bytes of scratch alive for rejected data: the tagged receives above
  // and rejected active-message rendezvous data still arriving (UCX hands
  // their descriptors to the handler, which receives them at once). Its
  // peak is a stat.
  size_t discard_bytes_alive_ = 0;
  void discard_scratch_changed(int64_t bytes);

  struct Counters {
    std::atomic<uint64_t> sends_ok{0}, sends_failed{0}, receives_ok{0}, receives_failed{0},
        ops_posted{0}, bytes_sent{0}, notices_rejected{0}, data_rejected{0}, torn_down{0},
        sends_waited_for_slots{0}, discard_scratch_peak{0};
  } counters_;
};

}  // namespace baton::kv_transfer
