// decode_node/decode_server.h — the decode node: owns each request's lifetime.
//
// For a request the router sends (Generate), the decode node either prefills
// it itself (prompts below the router's threshold) or reserves the KV blocks
// of the whole prompt, makes the transfer engine expect them, and tells the
// router where the prefill node must write (PrefillReady). When the KV has
// landed and the prefill node's first token arrives (PrefillDone, forwarded by
// the router), the request joins the running batch with its KV already
// computed; from then on it is continuous batching with paged attention, and
// every step's new tokens go to the router in one Events message.
//
// Admission: when blocks run short, new requests queue here in arrival order
// and are reserved as blocks free up; running requests that outgrow the pool
// are preempted by recompute (the scheduler's policy).
//
// A prefill that fails (the router forwards its error or reports its prefill
// node dead, or the KV does not arrive whole) is computed here instead: no
// token reached the client yet, and this node holds the prompt.
//
// Every way a request ends frees its blocks: finish, abort (router), an
// expired wait for KV; so does a reservation given up for a fallback. Blocks
// a transfer may still write are freed only when the transfer engine says
// nothing writes them any more (its callback).
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "node/node_runtime.h"

namespace baton::decode_node {

class DecodeServer {
 public:
  static Result<std::unique_ptr<DecodeServer>> create(const node::NodeSettings& settings);
  // Serves until `stop` is set, then aborts what is left.
  Status run(const std::atomic<bool>& stop);

 private:
  enum class State { kQueued, kAwaitingKv, kRunning };
  struct Request {
    uint64_t request_id = 0;
    std::string client_id;  // for logs (control::Generate)
    State state = State::kQueued;
    int64_t sequence_id = -1;
    uint64_t transfer_id = 0;
    bool kv_landed = false;
    bool first_token_known = false;
    int32_t first_token = 0;
    uint64_t rng_draws = 0;
    std::vector<control::TokenLogprobs> first_logprobs;
    bool wants_logprobs = false;
    bool abandoned = false;  // ended for the router; blocks wait for the transfer callback
    // Its prefill failed: computed here once nothing writes its reserved
    // blocks any more (the transfer's callback).
    bool prefill_here = false;
    // When its receive gives up (kv_wait_timeout after the reservation):
    // a receive failing then timed out here, and the router has given up on
    // the request; one timing out earlier (UCX's own) falls back.
    std::chrono::steady_clock::time_point receive_deadline;
    control::Generate generate;  // its prompt and sampling, kept to compute it here
    std::string prefill_node;    // where the KV comes from (for error messages)
    // Staging slots a reservation of it last asked for and did not get: it
    // waits for that many free (a staged pool).
    int32_t slots_refused = 0;
    // KV landed: by when its first token must have come (kv_wait_timeout).
    std::chrono::steady_clock::time_point first_token_deadline;
  };

  explicit DecodeServer(std::unique_ptr<node::NodeRuntime> runtime)
      : runtime_(std::move(runtime)) {}

  void handle(control::Message& message);
  void on_generate(control::Generate& generate);
  void on_prefill_done(const control::PrefillDone& done);
  void on_abort(const control::Abort& abort);
  // Drops every request (NodeRuntime::take_registration_lost).
  void drop_all();
  void on_transfer(const kv_transfer::TransferResult& result);
  // Reserves blocks for queued requests, oldest first, while they fit.
  void admit_queued();
  // Counts the requests still queued among the node's waiting ones.
  void report_queued();
  // False when the pool has no room yet (the request stays queued); true
  // when it was reserved, or failed and was ended (`request` is gone then).
  bool try_reserve(Request& request);
  void activate(Request& request);
  // The prompt computed on this node after its prefill failed (the router
  // says so, or its KV did not arrive whole): nothing reached the client
  // yet, and this node holds the prompt. Logs `why`.
  void prefill_here(Request& request, const std::string& why);
  // Once nothing writes the blocks reserved for the request's KV (at once,
  // or in its transfer's callback), they go back and the prompt runs here.
  void start_here_once_unwritten(Request& request);
  // Runs the request's prompt on this node's scheduler (ends it with the
  // scheduler's refusal).
  void start_here(Request& request);
  // Ends requests whose KV landed but whose first token did not come within
  // kv_wait_timeout: the transfer's own deadline covers the KV, this the
  // first token after it (a prefill node gone after sending, its
  // PrefillDone or the router's abort lost), whose blocks would otherwise
  // stay reserved for good.
  void expire_reservations();
  Status step();
  void collect_finished();
  // Ends a request for the router with `finish_reason` and forgets it (unless
  // a transfer may still write its blocks).
  void end(Request& request, FinishReason finish_reason, std::string error);
  // Adds to the request's event of this step (made if it has none); returns
  // it, for what only the first token's event carries.
  control::TokenEvent& emit(uint64_t request_id, std::vector<int32_t> tokens,
                            FinishReason finish_reason, std::string error,
                            std::vector<control::TokenLogprobs> logprobs = {});
  void flush_events();
  static uint64_t transfer_id_for(uint64_t request_id);

  std::unique_ptr<node::NodeRuntime> runtime_;
  std::unordered_map<uint64_t, Request> requests_;      // by request id
  std::unordered_map<int64_t, uint64_t> by_sequence_;   // sequence id -> request id
  std::unordered_map<uint64_t, uint64_t> by_transfer_;  // transfer id -> request id
  std::deque<uint64_t> queued_;                         // request ids waiting for blocks
  std::unordered_map<uint64_t, size_t> pending_event_;  // request id -> index in events_
  std::chrono::steady_clock::time_point next_expiry_check_;
  control::Events events_;
};

}  // namespace baton::decode_node
