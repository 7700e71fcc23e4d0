// router/node_registry.h — the router's view of the cluster's nodes.
//
// Nodes named in the cluster config register over the control plane and
// heartbeat their load; a node silent for longer than the heartbeat timeout is
// marked down and gets no new work. Routing picks among the nodes that are up:
// round-robin, or least-loaded — for decode nodes the fewest requests the
// router has placed there (exact and instantaneous, where heartbeats lag),
// ties broken by more free KV blocks; for prefill nodes the fewest prompt
// tokens placed there and not yet prefilled. Single-threaded: the router core
// owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/control_messages.h"
#include "common/routing_policy.h"
#include "common/status.h"
#include "engine/device.h"

namespace baton::router {

struct NodeState {
  std::string name;
  Role role = Role::kPrefill;  // kPrefill or kDecode
  bool up = false;
  bool ever_registered = false;
  std::vector<uint8_t> descriptor;
  int32_t block_size = 0;
  int32_t max_model_len = 0;
  int64_t pid = 0;
  std::string kv_dtype;  // the KV format, as control::Register names it
  int64_t kv_bytes_per_token = 0;
  std::string device;          // control::Register's
  std::string kv_staging;      // control::Register's; "" when the pool is registered in place
  int64_t weights_bytes = 0;   // control::Register's
  bool prefix_caching = true;  // control::Register's
  int64_t kv_pool_bytes = 0;
  std::chrono::steady_clock::time_point last_seen{};
  control::NodeLoad load;  // from the last heartbeat
  // From the last heartbeat: a prefill node's transfer path to each decode
  // node it has sent KV to (mode and UCX transports), while that endpoint is up.
  std::map<std::string, std::string> kv_paths;
  int64_t times_down = 0;         // declared down by the router (RouterCore::node_down)
  int32_t assigned_requests = 0;  // placed by the router, not yet finished
  // Prompt tokens placed here to prefill, not yet prefilled: a prefill
  // node's, or a decode node's own (prompts it computes itself).
  int64_t assigned_tokens = 0;
  // The node's prefix cache counters summed over its heartbeats' increases,
  // across restarts of its process: they only ever grow.
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  int64_t prefix_cache_ssd_hits = 0;
};

class NodeRegistry {
 public:
  using Clock = std::chrono::steady_clock;

  // `expected` maps every configured node name to its role.
  NodeRegistry(std::map<std::string, Role> expected, RoutingPolicy policy);

  // Accepts a Register from a configured node with the configured role whose
  // block size matches the cluster's (the first registered node sets it).
  Status register_node(const control::Register& message, Clock::time_point now);
  // False when the node is unknown or down: it must register again.
  // `kv_paths`: the heartbeat's (a prefill node's paths to decode nodes).
  bool heartbeat(const std::string& name, const control::NodeLoad& load, Clock::time_point now,
                 std::map<std::string, std::string> kv_paths = {});
  // Marks a node down at once (its connection is gone).
  void mark_down(const std::string& name);
  // Marks nodes silent for longer than `timeout` down; returns their names.
  std::vector<std::string> expire(Clock::time_point now, std::chrono::milliseconds timeout);

  // A node of `role` that is up, by the policy; nullptr when none is. The
  // prefix-aware policy reads `prompt` and remembers where its blocks went.
  NodeState* pick(Role role, std::span<const int32_t> prompt = {});
  NodeState* find(const std::string& name);
  // The fewest assigned_tokens of a node of `role` that is up; nullopt when none is.
  std::optional<int64_t> least_assigned_tokens(Role role) const;
  const std::map<std::string, NodeState>& nodes() const { return nodes_; }
  int32_t up_count(Role role) const;
  // Prefix-aware policy: how many prompt blocks the router remembers
  // sending to `name`.
  size_t sent_block_count(const std::string& name) const;
  // The KV block size every node shares (0 until one has registered).
  int32_t block_size() const { return block_size_; }

 private:
  std::map<std::string, NodeState> nodes_;
  RoutingPolicy policy_;
  std::map<Role, size_t> round_robin_next_;
  // The KV geometry every node must share, as the first node to register
  // (`first_node_`) gave it.
  std::string first_node_;
  int32_t block_size_ = 0;
  std::string kv_dtype_;
  // Its kind only is shared (the backends' key orders differ), not the index.
  std::optional<engine::Device> device_;
  // Prefix-aware policy, by node: the hashes (common/prefix_hash.h) of the
  // prompt blocks the router sent there, with when it last did: its guess at
  // what the node's cache holds. Bounded; the least recently sent go first.
  // Kept apart from NodeState, which every cluster snapshot copies.
  std::map<std::string, std::unordered_map<uint64_t, uint64_t>> sent_blocks_;
  uint64_t send_clock_ = 0;  // orders sent_blocks_' entries
};

}  // namespace baton::router
