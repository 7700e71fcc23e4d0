// node/node_runtime.h — what prefill and decode nodes share.
//
// Module map: node/ depends on engine, kv_transfer and common's control
// plane; prefill_node/ and decode_node/ build on it. A NodeRuntime owns the
// node's engine, a TransferEngine over the engine's KV pool, and the DEALER
// socket to the router. It registers the node (retrying until the router
// answers), sends heartbeats with the node's load, re-registers when a
// restarted router no longer knows it, and moves transfer completions from the
// transfer engine's progress thread onto the node's single loop thread, which
// is the only thread that touches the scheduler.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/control_messages.h"
#include "common/control_socket.h"
#include "common/node_registration.h"
#include "common/status.h"
#include "engine/engine.h"
#include "engine/sequence.h"
#include "kv_transfer/transfer_engine.h"

namespace baton::node {

struct NodeSettings {
  std::string name;
  Role role = Role::kPrefill;    // kPrefill or kDecode
  std::string control_endpoint;  // the router's control socket, "tcp://host:port"
  // CURVE keys of the control plane (common/curve_keys.h); none: in the clear.
  std::optional<control::CurveKeys> control_keys;
  std::filesystem::path model_dir;
  engine::EngineConfig engine;
  kv_transfer::TransferConfig transfer;
  std::chrono::milliseconds heartbeat_interval{200};
  // A loop that has not come round in this long (a step or a wait that
  // hangs) withholds the heartbeats, so the router declares the node dead,
  // fails its requests and places no more on it; 0: never.
  std::chrono::milliseconds stall_timeout{0};
  // Fault injection (BATON_FAULT_STALL_FIRST_STEP): the loop sleeps this
  // long before the node's first engine step, as a hung step would hold it.
  std::chrono::milliseconds fault_first_step_stall{0};
  // Longest a decode node waits for a request's KV to arrive (the prefill may be queued).
  std::chrono::milliseconds kv_wait_timeout{600000};
  // A pool in host memory staged through host slots, as a device pool
  // always is: tests of the path GPU nodes take, on machines without one.
  bool stage_host_pool = false;
};

// The engine's generation options for a request's sampling fields.
engine::GenerationOptions generation_options(const control::SamplingSpec& sampling);
// Log-probabilities between the engine's form and the wire's.
control::TokenLogprobs to_wire(const engine::OutputLogprobs& logprobs);
engine::OutputLogprobs from_wire(const control::TokenLogprobs& logprobs, int32_t token);

class NodeRuntime {
 public:
  static Result<std::unique_ptr<NodeRuntime>> create(const NodeSettings& settings);
  ~NodeRuntime();

  const NodeSettings& settings() const { return settings_; }
  engine::Engine& engine() { return *engine_; }
  kv_transfer::TransferEngine& transfer() { return *transfer_; }

  // Sends to the router; a failure is logged and counted (the router's
  // heartbeat timeout covers a router that is gone).
  void send(const control::Message& message);
  // Waits up to `timeout` for router messages or transfer completions; handles
  // registration traffic itself and returns the rest.
  std::vector<control::Message> poll(std::chrono::milliseconds timeout);
  // Registers while unregistered, and publishes the node's load for the
  // heartbeat thread. Call once per loop iteration.
  void tick();
  // Whether the engine may step now: it has work, and the last step began
  // at least engine.min_step_interval_ms ago.
  bool step_due() const;
  // Marks the start of an engine step (for engine.min_step_interval_ms).
  void begin_step();
  // Adds the last engine step's token counts to the reported counters.
  void count_step();
  // How long the loop may wait for messages: not at all while the engine has
  // work it can do now, until its next step is due under
  // engine.min_step_interval_ms; a while when it has none, or when its last
  // step computed nothing (queued sequences waiting for blocks that remote
  // KV holds), so a stalled node does not spin a core its neighbours need.
  std::chrono::milliseconds poll_timeout() const;
  control::NodeLoad load() const;
  // What the heartbeats report as kv_paths (control::Heartbeat), asked on
  // the loop thread as the load is published: a prefill node's paths to
  // its decode nodes.
  using KvPathsSource = std::function<std::map<std::string, std::string>()>;
  void set_kv_paths_source(KvPathsSource source) { kv_paths_source_ = std::move(source); }
  // Requests the server holds before its engine sees them (a prefill node's
  // prompts waiting for staging slots, a decode node's for blocks or slots):
  // the load reports them among the waiting.
  void set_held(int64_t requests, int64_t prompt_tokens) {
    held_requests_ = requests;
    held_tokens_ = prompt_tokens;
  }
  // The requests the server keeps any state for (NodeLoad::requests).
  void set_requests(int64_t requests) { requests_ = requests; }
  bool registered() const { return registration_.registered(); }
  // True once after the router refused this registered node ("register
  // again"): it restarted and knows none of the node's requests, or it
  // declared the node dead and failed them all. Either way the node drops
  // every request it holds, which nobody waits for any more.
  bool take_registration_lost() { return std::exchange(registration_lost_, false); }
  uint64_t messages_rejected() const { return socket_->rejected(); }

  // Cancels an expectation / a send without blocking the loop: the transfer
  // engine may take up to its close timeout to answer while it tears down a
  // dead peer's endpoint, and a loop that waits misses its heartbeats. The
  // transfer's callback still reports the end, through take_completions().
  void cancel_expect_async(uint64_t transfer_id);
  void cancel_send_async(uint64_t transfer_id);

  // Transfer callbacks (progress thread) hand their results over here.
  kv_transfer::TransferCallback completion_sink();
  std::vector<kv_transfer::TransferResult> take_completions();

 private:
  explicit NodeRuntime(NodeSettings settings) : settings_(std::move(settings)) {}
  void send_register();

  NodeSettings settings_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<kv_transfer::TransferEngine> transfer_;
  std::unique_ptr<control::ControlSocket> socket_;
  control::WakeFd wake_;
  control::NodeRegistration registration_;
  bool registration_lost_ = false;
  std::chrono::steady_clock::time_point next_register_{};
  // The router's last refusal, warned about once: it answers each heartbeat
  // of a node it does not know (a restarted router: a dozen queued ones).
  std::string last_refusal_;
  std::chrono::steady_clock::time_point next_publish_{};
  uint64_t send_failures_ = 0;
  int64_t prompt_tokens_ = 0;
  int64_t held_requests_ = 0;
  int64_t requests_ = 0;
  int64_t held_tokens_ = 0;
  int64_t generation_tokens_ = 0;
  bool stalled_ = false;
  std::chrono::steady_clock::time_point next_step_at_{};

  std::mutex completions_mutex_;
  std::vector<kv_transfer::TransferResult> completions_;

  void heartbeat_loop();
  // Whether the loop came round within stall_timeout; logs a stall's
  // start and end once each (heartbeat thread).
  bool loop_alive();
  bool stall_reported_ = false;  // heartbeat thread
  // steady_clock time (ns) of the loop's last tick().
  std::atomic<int64_t> came_round_ns_{0};
  std::unique_ptr<control::ControlSocket> heartbeat_socket_;
  mutable std::mutex load_mutex_;
  control::NodeLoad published_load_;
  std::map<std::string, std::string> published_kv_paths_;  // under load_mutex_
  KvPathsSource kv_paths_source_;
  std::atomic<bool> heartbeat_stop_{false};
  std::thread heartbeat_thread_;

  struct Cancel {
    uint64_t transfer_id;
    bool send;
  };
  void cancel_loop();
  std::mutex cancel_mutex_;
  std::condition_variable cancel_wakeup_;
  std::deque<Cancel> cancels_;
  bool cancel_stop_ = false;
  std::thread cancel_thread_;
};

}  // namespace baton::node
