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
#pragma once

#include <atomic>
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
  };

  explicit PrefillServer(std::unique_ptr<node::NodeRuntime> runtime)
      : runtime_(std::move(runtime)) {}

  void handle(control::Message& message);
  void on_peer_info(const control::PeerInfo& info);
  void on_prefill(control::Prefill& prefill);
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
  std::unordered_map<int64_t, uint64_t> by_sequence_;
  std::unordered_map<uint64_t, uint64_t> by_transfer_;
};

}  // namespace baton::prefill_node
