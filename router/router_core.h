// router/router_core.h — the router's dispatcher: requests in, nodes out.
//
// One thread owns the control socket and every request's routing state. Front
// ends (HTTP, ZeroMQ) submit token-level generation requests from their own
// threads; the core picks a decode node (which owns the request) and, for
// prompts the placement rule sends there (router/prefill_placement.h), a
// prefill node; relays
// PrefillReady -> Prefill and PrefillDone between them; and hands each step's
// tokens to the request's sink. It also ends requests: on the router's
// timeout, on cancel (client gone, stop string), when a node involved stops
// heartbeating (the request fails with an error and the surviving node is
// told to abort), or when a node reports an error.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/control_messages.h"
#include "common/control_socket.h"
#include "common/status.h"
#include "router/node_registry.h"
#include "router/prefill_placement.h"

namespace baton::router {

struct RouterCoreConfig {
  std::string control_endpoint;  // bind address, "tcp://127.0.0.1:8002"
  // CURVE keys of the control plane (common/curve_keys.h); none: in the clear.
  std::optional<control::CurveKeys> control_keys;
  std::map<std::string, Role> nodes;  // configured node name -> role
  RoutingPolicy policy = RoutingPolicy::kLeastLoaded;
  int32_t max_queued_requests = 1024;  // requests in the router at once
  std::chrono::milliseconds request_timeout{600000};
  std::chrono::milliseconds heartbeat_timeout{2000};
  PrefillPlacementRule placement;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  control::SamplingSpec sampling;
  // The client's id of the request (X-Request-Id, or the router's own), in
  // the logs of the router and of the nodes serving it: printable ASCII, at
  // most control::kMaxClientIdBytes (client_id_for_logs).
  std::string client_id;
  // Nonzero: the samples of one prompt of one client request (n or best_of
  // above 1) share it. The first dispatched leads; the others wait until
  // its decode node holds the prompt's KV (its first tokens) and are then
  // computed there, where its prefix cache shares the prompt's blocks,
  // rather than each prefilled, sent and stored again.
  uint64_t prompt_group = 0;
};

// `id` as a request id in logs: its printable ASCII characters (no
// spaces), at most control::kMaxClientIdBytes of them.
std::string client_id_for_logs(std::string_view id);

// What a request produced since the last update. The last update of a
// request has `finished` set and a finish_reason (kError: `error` says why,
// with its status code).
struct GenerationUpdate {
  std::vector<int32_t> tokens;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  Status error;
  std::vector<control::TokenLogprobs> logprobs;  // one per token, when asked for
  // With the first tokens, when sampling.prompt_logprobs asked for them: one
  // per prompt token after the first.
  std::vector<control::TokenLogprobs> prompt_logprobs;
  // The nodes serving the request (prefill empty: prefilled on the decode node).
  std::string decode_node;
  std::string prefill_node;
  // With the first tokens: the seconds the prompt waited in the queue of
  // the node that computed it and took there to its first token
  // (engine::Sequence); -1: unknown.
  double queue_seconds = -1;
  double prefill_seconds = -1;
  // With the first tokens: the prompt tokens the prefix cache of the node
  // that computed it held; -1: unknown.
  int32_t cached_tokens = -1;
};
// The last update of a request that failed.
inline GenerationUpdate failed_update(Status error) {
  GenerationUpdate update;
  update.finished = true;
  update.finish_reason = FinishReason::kError;
  update.error = std::move(error);
  return update;
}
// Runs on the core thread: keep it short, never block, never call back into
// the core except cancel().
using UpdateSink = std::function<void(const GenerationUpdate&)>;

// Nodes as the core last saw them, for /health, /metrics and node stats.
struct ClusterSnapshot {
  std::vector<NodeState> nodes;
  int32_t requests_in_router = 0;
  int32_t prefill_up = 0;
  int32_t decode_up = 0;
  // None: every decode node prefills its own prompts (colocated serving).
  int32_t prefill_configured = 0;
  uint64_t control_messages_rejected = 0;
  // Blocks of prompts prefilled on a prefill node, by what became of them
  // on the way to the decode node: sent over UCX, already held there (its
  // prefix cache), or skipped (past every sliding window of the first
  // decode step).
  uint64_t kv_blocks_sent = 0;
  uint64_t kv_blocks_cached = 0;
  uint64_t kv_blocks_skipped = 0;
  // Prompts dispatched, by where they were prefilled and why.
  std::map<PrefillPlacement, uint64_t> placements;
  // Prompts whose prefill failed (the node refused, its KV did not arrive
  // whole, or it died) and that their decode node computed instead.
  uint64_t prefill_fallbacks = 0;
};

class RouterCore {
 public:
  static Result<std::unique_ptr<RouterCore>> start(RouterCoreConfig config);
  ~RouterCore();  // stop()
  void stop();

  // Thread-safe. Unavailable when no decode node is up, ResourceExhausted
  // when max_queued_requests are in flight; otherwise the sink will see the
  // request through to its end.
  Result<uint64_t> submit(GenerationRequest request, UpdateSink sink);
  // Thread-safe. Ends the request on its nodes; its sink gets nothing more.
  void cancel(uint64_t request_id);
  // The state as of the core's last pass; shared, never copied per reader.
  std::shared_ptr<const ClusterSnapshot> snapshot() const;
  int32_t max_queued_requests() const { return config_.max_queued_requests; }
  int32_t in_flight() const { return in_flight_.load(); }
  // Where the control socket is bound ("tcp://127.0.0.1:41234" after port *).
  std::string control_endpoint() const { return socket_->endpoint(); }

 private:
  struct Request {
    uint64_t id = 0;
    GenerationRequest request;
    UpdateSink sink;
    std::string decode_node;
    std::string prefill_node;  // empty: prefilled on the decode node, or prefill over
    std::string prefilled_by;  // the prefill node chosen at dispatch (kept for reports)
    // Prompt tokens the decode node computes itself, until its first tokens
    // (counted in its NodeState::assigned_tokens meanwhile).
    int64_t local_prefill_tokens = 0;
    std::chrono::steady_clock::time_point deadline;
    // The prefill node's timings (PrefillDone), until the first tokens carry them.
    float queue_seconds = -1;
    float prefill_seconds = -1;
    int32_t cached_tokens = -1;
    std::vector<control::TokenLogprobs> prompt_logprobs;  // the prefill node's (PrefillDone)
    bool got_tokens = false;
    // Its prefill failed and its decode node computes the prompt instead.
    bool prefill_fell_back = false;
    // Its sink threw: it is aborted on its nodes, and gets only its error,
    // at the end of the loop's pass.
    bool undeliverable = false;
  };
  struct Submission {
    uint64_t id;
    GenerationRequest request;
    UpdateSink sink;
    std::chrono::steady_clock::time_point submitted;  // its timeout runs from here
  };
  // The samples of one prompt (GenerationRequest::prompt_group): the
  // leader's id, and the others held until its decode node has the
  // prompt's KV (ready: then they go to `decode_node`; empty, when the
  // leader ended first: anywhere).
  struct PromptGroup {
    uint64_t leader = 0;
    bool ready = false;
    bool leader_gone = false;
    std::string decode_node;
    std::vector<Submission> held;
  };

  explicit RouterCore(RouterCoreConfig config);
  void loop();
  // Places a submission, or holds it with its prompt group's leader.
  void submit_or_hold(Submission& submission);
  // Places a submission: on `beside`'s decode node where that node is up
  // (it computes the prompt, whose KV it holds), else by the policy.
  void dispatch(Submission& submission, const std::string& beside = {});
  // A prompt group's leader has its first tokens, or `ended`: its held
  // samples are placed by release_groups(), outside any walk of requests_.
  void group_leader_moved(Request& leader, bool ended);
  void release_groups();
  // What a request that ran past config_.request_timeout fails with.
  Status timed_out() const;
  // Removes a held sample the client cancelled; false when none is held.
  bool drop_held(uint64_t request_id);
  // Calls a front end's sink; false (logged) when it threw.
  static bool call_sink(const UpdateSink& sink, const GenerationUpdate& update);
  void handle(const std::string& from, control::Message& message);
  void on_register(const std::string& from, const control::Register& message);
  void on_prefill_ready(const std::string& from, control::PrefillReady& ready);
  void on_prefill_done(const std::string& from, control::PrefillDone& done);
  void on_events(const std::string& from, control::Events& events);
  void on_rejected(const std::string& from, const control::Rejected& rejected);
  void node_down(const std::string& name, const std::string& why);
  // A request whose prefill failed before any token reached its client:
  // its decode node, which holds the prompt, computes it instead (told by
  // a PrefillDone carrying the error). False where that node cannot be told.
  bool fall_back_to_decode_node(Request& request, const std::string& why);
  // Ends a request with an error for its client and aborts it on its nodes.
  void fail(uint64_t request_id, Status error);
  void abort_on_nodes(const Request& request, const std::string& reason);
  // Aborts it on `name` now, or, while the node is down, once the same
  // process comes back (orphans_).
  void abort_on_node(const std::string& name, uint64_t request_id, const std::string& reason);
  void release_prefill(Request& request);
  void release_local_prefill(Request& request);
  void forget(uint64_t request_id);
  void publish_snapshot();
  Status send(const std::string& node, const control::Message& message);
  // Gives the request's front end an update; where its sink throws, the
  // request is aborted on its nodes and marked undeliverable.
  void deliver(Request& request, GenerationUpdate update);
  // Ends each undeliverable request: its sink gets one more try, with an
  // error, and the request is forgotten.
  void end_undeliverable();

  RouterCoreConfig config_;
  std::unique_ptr<control::ControlSocket> socket_;
  control::WakeFd wake_;
  NodeRegistry registry_;
  std::unordered_map<uint64_t, Request> requests_;  // core thread only
  // Requests whose sink threw, forgotten by the loop (core thread only).
  std::vector<uint64_t> undeliverable_;
  // Requests failed while their node was down (it could not be told): the
  // node may only have stopped, and comes back holding them. Aborted on it
  // when the same process registers again; forgotten for a new process.
  std::map<std::string, std::deque<uint64_t>> orphans_;  // core thread only
  // ClusterSnapshot's kv_blocks_* counts; core thread only.
  uint64_t kv_blocks_sent_ = 0;
  uint64_t kv_blocks_cached_ = 0;
  uint64_t kv_blocks_skipped_ = 0;
  uint64_t prefill_fallbacks_ = 0;
  std::map<PrefillPlacement, uint64_t> placements_;   // ClusterSnapshot's; core thread only
  std::unordered_map<uint64_t, PromptGroup> groups_;  // core thread only
  std::vector<uint64_t> groups_to_release_;           // core thread only

  std::mutex inbox_mutex_;
  std::vector<Submission> submissions_;
  std::vector<uint64_t> cancels_;

  mutable std::mutex snapshot_mutex_;
  std::shared_ptr<const ClusterSnapshot> snapshot_;
  std::atomic<int32_t> decode_up_{0};
  std::atomic<int32_t> in_flight_{0};
  std::atomic<uint64_t> next_id_{1};
  // The last registration's number (core thread): each welcome takes the
  // next. Starting at random, a restarted router's numbers do not meet the
  // ones its nodes kept from before.
  uint64_t last_registration_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace baton::router
