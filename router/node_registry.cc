// router/node_registry.cc — registration, liveness and node choice.
#include "router/node_registry.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include "common/dtype.h"
#include "common/prefix_hash.h"

namespace baton::router {

NodeRegistry::NodeRegistry(std::map<std::string, Role> expected, RoutingPolicy policy)
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
    return invalid_argument("node '" + message.node + "' is configured as " +
                            std::string(role_name(node.role)) + ", registered as " +
                            std::string(role_name(message.role)));
  }
  // The other node named in a refusal: the one whose geometry the cluster took.
  const std::string first = "node '" + first_node_ + "'";
  if (block_size_ != 0 && message.block_size != block_size_) {
    return invalid_argument("node '" + message.node + "' has KV block size " +
                            std::to_string(message.block_size) + ", the cluster uses " +
                            std::to_string(block_size_) + " (" + first + ")");
  }
  // The format goes into /metrics as a label: one of Baton's, or refused.
  if (!message.kv_dtype.empty() && !parse_kv_dtype(message.kv_dtype)) {
    return invalid_argument("node '" + message.node + "' keeps KV in an unknown format");
  }
  // A node too old to say its format is not checked.
  if (!kv_dtype_.empty() && !message.kv_dtype.empty() && message.kv_dtype != kv_dtype_) {
    return invalid_argument("node '" + message.node + "' keeps KV as " + message.kv_dtype +
                            ", the cluster's nodes as " + kv_dtype_ + " (" + first +
                            "): KV blocks move between nodes as bytes, so every node needs the "
                            "same engine.kv_dtype");
  }
  // A node too old to say its device is not checked.
  std::optional<engine::Device> device;
  if (!message.device.empty()) {
    auto parsed = engine::parse_device(message.device, "node '" + message.node + "''s device");
    if (!parsed.is_ok()) return parsed.status();
    device = *parsed;
  }
  if (device && device_ && device->is_cuda() != device_->is_cuda()) {
    return invalid_argument("node '" + message.node + "' computes on " + device->name() + ", " +
                            first + " on " + device_->name() + ": " +
                            std::string(engine::kOneDeviceKindReason));
  }
  if (first_node_.empty()) first_node_ = message.node;
  block_size_ = message.block_size;
  if (!message.kv_dtype.empty()) kv_dtype_ = message.kv_dtype;
  if (device && !device_) device_ = device;
  node.up = true;
  node.ever_registered = true;
  node.descriptor = message.descriptor;
  node.block_size = message.block_size;
  node.max_model_len = message.max_model_len;
  node.kv_dtype = message.kv_dtype;
  node.kv_bytes_per_token = message.kv_bytes_per_token;
  node.device = message.device;
  node.kv_staging = message.kv_staging;
  node.weights_bytes = message.weights_bytes;
  node.prefix_caching = message.prefix_caching;
  node.kv_pool_bytes = message.kv_pool_bytes;
  if (message.pid != node.pid) {
    // A new process counts from zero: its first heartbeat adds all it
    // reports. Its prefix cache starts empty.
    node.load.prefix_cache_queries = 0;
    node.load.prefix_cache_hits = 0;
    node.load.prefix_cache_ssd_hits = 0;
    sent_blocks_.erase(node.name);
  }
  node.pid = message.pid;
  node.last_seen = now;
  return Status::ok();
}

bool NodeRegistry::heartbeat(const std::string& name, const control::NodeLoad& load,
                             Clock::time_point now, std::map<std::string, std::string> kv_paths) {
  auto it = nodes_.find(name);
  if (it == nodes_.end() || !it->second.up) return false;
  // Counters from the node's process since its start; a smaller one than
  // before means it restarted (and registered again under the same pid).
  auto add_increase = [](int64_t& total, int64_t before, int64_t now) {
    const int64_t increase = now >= before ? now - before : now;
    total = increase > std::numeric_limits<int64_t>::max() - total
                ? std::numeric_limits<int64_t>::max()
                : total + increase;
  };
  add_increase(it->second.prefix_cache_queries, it->second.load.prefix_cache_queries,
               load.prefix_cache_queries);
  add_increase(it->second.prefix_cache_hits, it->second.load.prefix_cache_hits,
               load.prefix_cache_hits);
  add_increase(it->second.prefix_cache_ssd_hits, it->second.load.prefix_cache_ssd_hits,
               load.prefix_cache_ssd_hits);
  it->second.load = load;
  it->second.kv_paths = std::move(kv_paths);
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

namespace {

// Prefix-aware policy: the blocks remembered per node (a few times what a
// node's pool holds for a small model: old entries are only missed hits),
// and how much busier than the least-loaded node the one holding a prefix
// may be and still get the prompt: in requests placed (decode nodes) or
// prompt tokens placed (prefill nodes).
constexpr size_t kMaxSentBlocks = size_t(1) << 16;
constexpr int64_t kMaxDecodeImbalance = 4;
constexpr int64_t kMaxPrefillImbalance = 4096;

// Leading blocks of `chain` the node was sent.
using SentBlocks = std::unordered_map<uint64_t, uint64_t>;

size_t blocks_sent(const SentBlocks& sent, const std::vector<uint64_t>& chain) {
  size_t n = 0;
  while (n < chain.size() && sent.contains(chain[n])) ++n;
  return n;
}

// Records that `chain` went to the node; past the bound, forgets the half
// sent longest ago.
void remember_sent(SentBlocks& sent, const std::vector<uint64_t>& chain, uint64_t& clock) {
  for (uint64_t hash : chain) sent[hash] = ++clock;
  if (sent.size() <= kMaxSentBlocks) return;
  std::vector<uint64_t> ages;
  ages.reserve(sent.size());
  for (const auto& [hash, at] : sent) ages.push_back(at);
  auto middle = ages.begin() + ptrdiff_t(ages.size() / 2);
  std::nth_element(ages.begin(), middle, ages.end());
  const uint64_t cutoff = *middle;
  std::erase_if(sent, [&](const auto& entry) { return entry.second < cutoff; });
}

}  // namespace

NodeState* NodeRegistry::pick(Role role, std::span<const int32_t> prompt) {
  std::vector<NodeState*> candidates;
  for (auto& [name, node] : nodes_) {
    if (node.up && node.role == role) candidates.push_back(&node);
  }
  if (candidates.empty()) return nullptr;
  size_t& next = round_robin_next_[role];
  size_t start = next++ % candidates.size();
  if (policy_ == RoutingPolicy::kRoundRobin) return candidates[start];
  auto load_key = [&](const NodeState* node) {
    if (role == Role::kPrefill)
      return std::tuple<int64_t, int64_t>(node->assigned_tokens, node->assigned_requests);
    return std::tuple<int64_t, int64_t>(node->assigned_requests, -int64_t(node->load.free_blocks));
  };
  // Ties (idle nodes) rotate, so equal nodes share the work.
  NodeState* best = candidates[start];
  for (size_t i = 1; i < candidates.size(); ++i) {
    NodeState* node = candidates[(start + i) % candidates.size()];
    if (load_key(node) < load_key(best)) best = node;
  }
  if (policy_ != RoutingPolicy::kPrefixAware || prompt.empty()) return best;
  // The blocks a node could share: all but the last token's (the engine
  // computes that one whatever it holds).
  const std::vector<uint64_t> chain = prefix_block_hashes(
      prompt, block_size_, int32_t(prompt.size() - 1) / std::max(block_size_, 1));
  const int64_t margin = role == Role::kPrefill ? kMaxPrefillImbalance : kMaxDecodeImbalance;
  NodeState* holder = best;
  size_t held = blocks_sent(sent_blocks_[best->name], chain);
  for (size_t i = 0; i < candidates.size(); ++i) {
    NodeState* node = candidates[(start + i) % candidates.size()];
    const size_t n = blocks_sent(sent_blocks_[node->name], chain);
    if (n > held && std::get<0>(load_key(node)) <= std::get<0>(load_key(best)) + margin) {
      holder = node;
      held = n;
    }
  }
  remember_sent(sent_blocks_[holder->name], chain, send_clock_);
  return holder;
}

size_t NodeRegistry::sent_block_count(const std::string& name) const {
  auto it = sent_blocks_.find(name);
  return it == sent_blocks_.end() ? 0 : it->second.size();
}

NodeState* NodeRegistry::find(const std::string& name) {
  auto it = nodes_.find(name);
  return it == nodes_.end() ? nullptr : &it->second;
}

std::optional<int64_t> NodeRegistry::least_assigned_tokens(Role role) const {
  std::optional<int64_t> least;
  for (const auto& [name, node] : nodes_) {
    if (node.up && node.role == role && (!least || node.assigned_tokens < *least))
      least = node.assigned_tokens;
  }
  return least;
}

int32_t NodeRegistry::up_count(Role role) const {
  int32_t count = 0;
  for (const auto& [name, node] : nodes_) count += node.up && node.role == role;
  return count;
}

}  // namespace baton::router
