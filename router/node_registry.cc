// router/node_registry.cc — registration, liveness and node choice.
#include "router/node_registry.h"

#include <spdlog/spdlog.h>

#include <tuple>

namespace baton::router {

NodeRegistry::NodeRegistry(std::map<std::string, std::string> expected, Policy policy)
    : policy_(policy) {
  for (auto& [name, role] : expected) {
    NodeState& node = nodes_[name];
    node.name = name;
    node.role = role;
  }
}

Status NodeRegistry::register_node(const control::Register& message, Clock::time_point now) {
  auto it = nodes_.find(message.node);
  if (it == nodes_.end())
    return invalid_argument("node '" + message.node + "' is not in the cluster config");
  NodeState& node = it->second;
  if (node.role != message.role) {
    return invalid_argument("node '" + message.node + "' is configured as " + node.role +
                            ", registered as " + message.role);
  }
  if (block_size_ != 0 && message.block_size != block_size_) {
    return invalid_argument("node '" + message.node + "' has KV block size " +
                            std::to_string(message.block_size) + ", the cluster uses " +
                            std::to_string(block_size_));
  }
  block_size_ = message.block_size;
  node.up = true;
  node.ever_registered = true;
  node.descriptor = message.descriptor;
  node.block_size = message.block_size;
  node.max_model_len = message.max_model_len;
  if (message.pid != node.pid) {
    // A new process counts from zero: its first heartbeat adds all it reports.
    node.load.prefix_cache_queries = 0;
    node.load.prefix_cache_hits = 0;
  }
  node.pid = message.pid;
  node.last_seen = now;
  return Status::ok();
}

bool NodeRegistry::heartbeat(const std::string& name, const control::NodeLoad& load,
                             Clock::time_point now) {
  auto it = nodes_.find(name);
  if (it == nodes_.end() || !it->second.up) return false;
  // Counters from the node's process since its start; a smaller one than
  // before means it restarted (and registered again under the same pid).
  auto add_increase = [](int64_t& total, int64_t before, int64_t now) {
    total += now >= before ? now - before : now;
  };
  add_increase(it->second.prefix_cache_queries, it->second.load.prefix_cache_queries,
               load.prefix_cache_queries);
  add_increase(it->second.prefix_cache_hits, it->second.load.prefix_cache_hits,
               load.prefix_cache_hits);
  it->second.load = load;
  it->second.last_seen = now;
  return true;
}

void NodeRegistry::mark_down(const std::string& name) {
  auto it = nodes_.find(name);
  if (it != nodes_.end()) it->second.up = false;
}

std::vector<std::string> NodeRegistry::expire(Clock::time_point now,
                                              std::chrono::milliseconds timeout) {
  std::vector<std::string> down;
  for (auto& [name, node] : nodes_) {
    if (node.up && now - node.last_seen > timeout) {
      node.up = false;
      down.push_back(name);
    }
  }
  return down;
}

NodeState* NodeRegistry::pick(const std::string& role) {
  std::vector<NodeState*> candidates;
  for (auto& [name, node] : nodes_) {
    if (node.up && node.role == role) candidates.push_back(&node);
  }
  if (candidates.empty()) return nullptr;
  size_t& next = round_robin_next_[role];
  size_t start = next++ % candidates.size();
  if (policy_ == Policy::kRoundRobin) return candidates[start];
  auto load_key = [&](const NodeState* node) {
    if (role == "prefill")
      return std::tuple<int64_t, int64_t>(node->assigned_tokens, node->assigned_requests);
    return std::tuple<int64_t, int64_t>(node->assigned_requests, -int64_t(node->load.free_blocks));
  };
  // Ties (idle nodes) rotate, so equal nodes share the work.
  NodeState* best = candidates[start];
  for (size_t i = 1; i < candidates.size(); ++i) {
    NodeState* node = candidates[(start + i) % candidates.size()];
    if (load_key(node) < load_key(best)) best = node;
  }
  return best;
}

NodeState* NodeRegistry::find(const std::string& name) {
  auto it = nodes_.find(name);
  return it == nodes_.end() ? nullptr : &it->second;
}

int32_t NodeRegistry::up_count(const std::string& role) const {
  int32_t count = 0;
  for (const auto& [name, node] : nodes_) count += node.up && node.role == role;
  return count;
}

}  // namespace baton::router
