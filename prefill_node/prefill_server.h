// prefill_node/prefill_server.h — the prefill node: computes prompts and
// pushes their KV into decode nodes' pools while it computes.
//
// A Prefill job names the decode node and the blocks reserved there. The job
// runs through the engine's scheduler like any request with max_tokens 1
// (batched with other prefills under the token budget, chunked when long), its
// blocks retained after it finishes. During the step that computes the
// prompt's last chunk, the scheduler's layer observer fires after each layer:
// the first call opens the transfer (every prompt block -> its reserved
// block) and each call releases that layer to the transfer engine, so layer l
// travels while layer l+1 computes. (Earlier chunks' layers are complete by
// then and travel with them.) When the transfer is acknowledged and the first
// token is sampled, the node releases its blocks and sends PrefillDone.
//
// A staged pool (a GPU's) sends through a few host slots, a slot per block
// from the first layer until the callback: a job starts only when its
// blocks' slots are not promised to the jobs before it, first come, first
// served, so no send of a computed prompt queues for slots.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <unordered_map>

#include "node/node_runtime.h"

namespace baton::prefill_node {

class PrefillServer {
 public:
  static Result<std::unique_ptr<PrefillServer>> create(const node::NodeSettings& settings);
  Status run(const std::atomic<bool>& stop);

 private:
  struct Job {
    control::Prefill prefill;  // the request (prompt moved out once queued)
    int32_t prompt_len = 0;
    int64_t sequence_id = -1;
    kv_transfer::PeerId peer = 0;
    bool transfer_started = false;
    bool transfer_done = false;
    Status transfer_status;
    std::unique_ptr<engine::Sequence> finished;  // sampled, blocks retained
    bool aborted = false;
    int32_t slots = 0;  // staging slots its send may hold (a staged pool)
  };

  explicit PrefillServer(std::unique_ptr<node::NodeRuntime> runtime)
      : runtime_(std::move(runtime)) {}

  void handle(control::Message& message);
  void on_peer_info(const control::PeerInfo& info);
  void on_prefill(control::Prefill& prefill);
  // Starts held prefills, first come first served, while the staging slots
  // their sends will hold are not promised to running jobs, and reports
  // those still held in the node's load.
  void admit_held();
  // Hands a checked prefill to the scheduler as a job.
  void start(control::Prefill& prefill);
  void fail_unknown_peer(const control::Prefill& prefill);
  void on_abort(const control::Abort& abort);
  // Drops every prefill (NodeRuntime::take_registration_lost).
  void drop_all();
  // The job whose prompt's last chunk this is, with a transfer to stream
  // layer by layer; null if none.
  Job* streaming_job(const engine::StepSequenceInfo& info);
  void on_layer(int32_t layer, std::span<const engine::StepSequenceInfo> step);
  void on_transfer(const kv_transfer::TransferResult& result);
  void collect_finished();
  // Sends PrefillDone and forgets the job once its transfer and sampling are
  // both over; releases its blocks.
  void maybe_complete(uint64_t request_id);
  // Tells the router the prefill failed (and logs it under the client's id).
  void fail(uint64_t request_id, const std::string& client_id, const std::string& error);

  std::unique_ptr<node::NodeRuntime> runtime_;
  struct KnownPeer {
    kv_transfer::PeerId id;
    std::vector<uint8_t> descriptor;  // as the router sent it
  };
  std::map<std::string, KnownPeer, std::less<>> peers_;  // decode node -> transfer peer
  // Decode nodes whose pools this node cannot fill (another KV format or
  // geometry) -> why, for the requests routed to them.
  std::map<std::string, std::string, std::less<>> refused_peers_;
  std::unordered_map<uint64_t, Job> jobs_;  // by request id
  // A staged pool's prefills wait here until their sends' slots are sure:
  // a prompt computed whose send then waits for slots holds its blocks
  // meanwhile, and fails if it waits past the transfer deadline.
  std::deque<control::Prefill> held_;
  int64_t slots_committed_ = 0;  // Job::slots of jobs_
  std::unordered_map<int64_t, uint64_t> by_sequence_;
  std::unordered_map<uint64_t, uint64_t> by_transfer_;
};

}  // namespace baton::prefill_node
