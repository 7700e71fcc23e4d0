// cluster/cluster_config.h — the cluster YAML, parsed and validated as a whole.
//
// One file describes a whole cluster: the model, the router, and every prefill
// and decode node. The top-level `engine:` and `transfer:` mappings are
// defaults for every node; a node's own `engine:` / `transfer:` override them
// key by key (the YAML maps are merged, then parsed once). Missing keys take
// their defaults; anything wrong is one InvalidArgument naming the key path,
// e.g. "decode[1].engine.block_size: must be a power of two ...",
// "router.zmq_port: 8000 is already router.http_port on 127.0.0.1".
//
// Checks that need the model's shape (does each KV pool hold one max-length
// request?) run separately, in validate_against_model, once the checkpoint's
// config.json is at hand.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/request_limits.h"
#include "common/role.h"
#include "common/routing_policy.h"
#include "common/status.h"
#include "engine/engine_config.h"
#include "engine/model_config.h"
#include "kv_transfer/transfer_config.h"

namespace YAML {
class Node;
}

namespace baton::cluster {

using baton::Role;
using baton::role_name;

using baton::routing_policy_name;
using baton::RoutingPolicy;

struct ModelSection {
  std::string preset;  // optional: a make-model preset; with it, `path` is made when missing
  // The checkpoint directory; relative paths are relative to the YAML file's directory.
  std::filesystem::path path;
  DType dtype = DType::kBF16;  // for making the preset
  uint64_t seed = 0;           // for making the preset
  std::string served_name;     // the `model` name clients send; default: path's last component
};

inline constexpr std::chrono::milliseconds kMinNodeStallTimeout{1000};

struct RouterSection {
  std::string host = "127.0.0.1";
  uint16_t http_port = 8000;
  uint16_t zmq_port = 8001;      // ZeroMQ client front end
  uint16_t control_port = 8002;  // nodes connect here (ZeroMQ control plane)
  RoutingPolicy policy = RoutingPolicy::kLeastLoaded;
  int32_t max_queued_requests = 1024;  // beyond: 429 with Retry-After
  std::chrono::milliseconds request_timeout{600000};
  std::chrono::milliseconds heartbeat_interval{200};
  std::chrono::milliseconds heartbeat_timeout{2000};  // must exceed 2 intervals
  // A node whose loop has not come round this long (a hung step or wait)
  // stops heartbeating: the router fails its requests and places no more
  // there until it comes back (node::NodeSettings::stall_timeout); 0: never,
  // else at least kMinNodeStallTimeout and past twice every node's
  // engine.min_step_interval_ms. It must outlast the longest engine step:
  // a prefill of max_num_batched_tokens of a large model on CPUs may take
  // minutes.
  std::chrono::milliseconds node_stall_timeout{300000};
  int32_t min_remote_prefill_tokens = 32;  // shorter prompts are prefilled on the decode node
  // Longer ones too when every prefill node has this many prompt tokens
  // waiting and the decode node fewer (router/prefill_placement.h); 0: never.
  int64_t max_prefill_queue_tokens = 0;
  std::chrono::milliseconds drain_timeout{10000};  // on stop: let running requests finish this long
  int32_t http_threads = 1;
  // Threads that parse and tokenise requests and build replies, off the
  // front ends' and the dispatcher's threads (router/request_workers.h).
  int32_t request_threads = 2;
  // Client connections: idle keep-alive connections are closed after
  // idle_timeout; a client that reads nothing is dropped once a write waited
  // write_timeout or max_queued_write_bytes of its output wait unread (a
  // ZeroMQ client: its requests cancelled, those replies dropped); past
  // max_connections a new connection gets 503. Past max_unsent_reply_bytes
  // unread across HTTP connections, a large whole reply is answered 503
  // and a client behind on its stream dropped.
  std::chrono::milliseconds idle_timeout{60000};
  std::chrono::milliseconds write_timeout{30000};
  int64_t max_queued_write_bytes = int64_t(4) << 20;
  int64_t max_unsent_reply_bytes = int64_t(1) << 30;
  int32_t max_connections = 4096;
  // The largest request body either front end takes; larger: 413.
  int64_t max_request_body_bytes = int64_t(kMaxRequestBodyBytes);
  RequestLimits limits;  // max_n, max_batch, max_logprobs, max_stop_strings, max_reply_logprobs
  // API keys required on the /v1/ routes, one per line (router/api_keys.h);
  // relative to the YAML file. Empty: only BATON_API_KEY, if set.
  std::string api_key_file;
  // Where the control plane listens (nodes connect here); empty: `host`.
  // A private address keeps clients and nodes on separate networks.
  std::string control_host;
  // A directory of CURVE keys (`baton keygen`, common/curve_keys.h),
  // relative to the YAML file: the control plane authenticates and
  // encrypts. Empty: in the clear (loopback and trusted networks only).
  std::string control_keys;
  // The same for the ZeroMQ client front end (`baton keygen --clients`):
  // only clients holding the ring's client key connect, encrypted.
  std::string zmq_keys;
};

struct NodeSection {
  std::string name;  // unique across the cluster
  Role role = Role::kPrefill;
  std::string host = "127.0.0.1";  // where it runs (baton up starts the nodes whose host is local)
  engine::EngineConfig engine;
  kv_transfer::TransferConfig transfer;  // transfer.node_name = name
};

struct ClusterConfig {
  std::filesystem::path file;  // the YAML it came from (empty when parsed from a node)
  ModelSection model;
  RouterSection router;
  std::vector<NodeSection> prefill;
  std::vector<NodeSection> decode;

  const NodeSection* find_node(std::string_view name) const;  // nullptr if none
};

// Reads and validates a cluster YAML; errors are prefixed with the file name.
// `file` is stored absolute, and relative paths inside resolve against its directory.
Result<ClusterConfig> load_cluster_config(const std::filesystem::path& yaml_file);
// The same for an already parsed document; relative paths resolve against `base_dir`.
Result<ClusterConfig> parse_cluster_config(const YAML::Node& root,
                                           const std::filesystem::path& base_dir);

// Checks that need the model's shape: every node's KV pool holds at least one
// max-length request (max_model_len tokens, the node's block size and KV dtype),
// and max_model_len <= max_position_embeddings. Error names the node key, e.g.
// "decode[0].engine.kv_cache_bytes: 1MiB holds 32 tokens of smollm2-135m's KV, less
// than one 8192-token request ...". `model` is the checkpoint's config.json: its
// torch_dtype is the KV dtype of nodes whose engine.kv_dtype is auto.
Status validate_against_model(const ClusterConfig& config, const engine::ModelConfig& model);

// Nodes on one device of one host (or on one host's CPUs) share its memory:
// the parts engine.memory_fraction gives them cannot add up to more than it.
// `host_key` names the machine a node's host is (nodes with the same key
// share it; an empty key leaves the node out). parse_cluster_config checks
// with loopback_host_key; `baton up`, which knows this host's names and
// addresses, checks the nodes it starts again as one host.
Status check_memory_fractions(const ClusterConfig& config,
                              const std::function<std::string(const std::string&)>& host_key);
// The host, or "this host" for the loopback and wildcard names.
std::string loopback_host_key(const std::string& host);

// Parses the `transfer:` mapping (keys: mode auto|rma|tag|am, default_deadline_ms,
// close_timeout_ms, idle_wait_ms, verify_checksum, peer_error_handling,
// ucx_env: {UCX_...: value}); errors name prefix.key. Absent or null: defaults.
Result<kv_transfer::TransferConfig> parse_transfer_config(const YAML::Node& node,
                                                          std::string_view prefix);

}  // namespace baton::cluster
