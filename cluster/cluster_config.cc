#include "cluster/cluster_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "common/kv_layout.h"
#include "common/regular_file.h"
#include "engine/kv_pool.h"
#include "engine/make_model.h"
#include "engine/window_budget.h"
#include "engine/yaml_settings.h"

namespace baton::cluster {
namespace {

namespace fs = std::filesystem;
using engine::bool_setting;
using engine::int_setting;
using engine::join_yaml_key;
using engine::ms_setting;
using engine::string_setting;
using engine::yaml_map_entries;

// A host name or address: no spaces, nothing a URL or an endpoint would choke on.
Result<std::string> read_host(const YAML::Node& node, const std::string& key) {
  BATON_ASSIGN_OR_RETURN(std::string host, engine::read_yaml_string(node, key));
  for (char c : host) {
    if (c == ' ' || c == '\t' || c == '/' || c == '@' || c == '?' || c == '#') {
      return invalid_argument(key + ": '" + host + "' is not a host name or address");
    }
  }
  return host;
}

// `over` laid over `base`, key by key; where both hold a mapping, those merge too
// (so a node's transfer.ucx_env adds to the defaults' instead of replacing them).
// Built without assigning to any YAML::Node: yaml-cpp's operator= writes through
// to the node it refers to, which would change the shared defaults.
Result<YAML::Node> merge_maps(const YAML::Node& base, const YAML::Node& over,
                              std::string_view base_prefix, std::string_view over_prefix) {
  BATON_ASSIGN_OR_RETURN(auto entries, yaml_map_entries(base, base_prefix));
  BATON_ASSIGN_OR_RETURN(auto overrides, yaml_map_entries(over, over_prefix));
  auto find = [](const auto& list, const std::string& name) {
    return std::find_if(list.begin(), list.end(),
                        [&](const auto& entry) { return entry.first == name; });
  };
  YAML::Node merged(YAML::NodeType::Map);
  for (const auto& [name, value] : entries) {
    auto it = find(overrides, name);
    if (it == overrides.end()) {
      merged.force_insert(name, value);
    } else if (value.IsMap() && it->second.IsMap()) {
      BATON_ASSIGN_OR_RETURN(YAML::Node both,
                             merge_maps(value, it->second, join_yaml_key(base_prefix, name),
                                        join_yaml_key(over_prefix, name)));
      merged.force_insert(name, both);
    } else {
      merged.force_insert(name, it->second);
    }
  }
  for (const auto& [name, value] : overrides) {
    if (find(entries, name) == entries.end()) merged.force_insert(name, value);
  }
  return merged;
}

// --- model ------------------------------------------------------------------

const engine::YamlSettings<ModelSection>& model_fields() {
  static const engine::YamlSettings<ModelSection> fields = {
      string_setting("preset", &ModelSection::preset),
      {"path", "",
       [](const YAML::Node& node, const std::string& key, ModelSection& out) -> Status {
         BATON_ASSIGN_OR_RETURN(std::string path, engine::read_yaml_string(node, key));
         out.path = path;
         return Status::ok();
       },
       nullptr},
      {"dtype", "",
       [](const YAML::Node& node, const std::string& key, ModelSection& out) -> Status {
         std::string text = node.IsScalar() ? node.Scalar() : "";
         auto dtype = parse_dtype(text);
         if (!dtype)
           return invalid_argument(key + ": expected f32, bf16 or f16, got '" + text + "'");
         out.dtype = *dtype;
         return Status::ok();
       },
       nullptr},
      {"seed", "",
       [](const YAML::Node& node, const std::string& key, ModelSection& out) -> Status {
         std::string text = node.IsScalar() ? node.Scalar() : "";
         auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out.seed);
         if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
           return invalid_argument(key + ": expected a non-negative 64-bit integer, got '" + text +
                                   "'");
         }
         return Status::ok();
       },
       nullptr},
      string_setting("served_name", &ModelSection::served_name),
  };
  return fields;
}

Result<ModelSection> parse_model(const YAML::Node& node, const fs::path& base_dir) {
  ModelSection model;
  BATON_RETURN_IF_ERROR(engine::read_yaml_settings(node, "model", model_fields(), model));
  if (!model.preset.empty()) {
    auto names = engine::model_preset_names();
    if (std::find(names.begin(), names.end(), model.preset) == names.end()) {
      std::string known;
      for (const auto& name : names) known += (known.empty() ? "" : ", ") + name;
      return invalid_argument("model.preset: unknown preset '" + model.preset +
                              "' (known: " + known + ")");
    }
  }
  if (model.path.empty()) {
    if (model.preset.empty()) {
      return invalid_argument("model: needs path (a checkpoint directory) or preset");
    }
    model.path = fs::path("models") / model.preset;
  }
  if (model.path.is_relative()) model.path = base_dir / model.path;
  model.path = model.path.lexically_normal();
  if (!model.path.has_filename()) model.path = model.path.parent_path();  // "dir/" -> "dir"
  if (model.served_name.empty()) model.served_name = model.path.filename().string();
  if (model.served_name.empty() || model.served_name == "." || model.served_name == "..") {
    return invalid_argument("model.served_name: cannot be derived from path '" +
                            model.path.string() + "'; give one");
  }
  return model;
}

// --- router -----------------------------------------------------------------

const engine::YamlSettings<RequestLimits>& limits_fields() {
  using L = RequestLimits;
  static const engine::YamlSettings<L> fields = {
      int_setting("max_n", &L::max_n, 1, 1024),
      int_setting("max_batch", &L::max_batch, 1, 65536),
      int_setting("max_logprobs", &L::max_logprobs, 0, 1024),
      int_setting("max_stop_strings", &L::max_stop_strings, 0, 1024),
      int_setting("max_reply_logprobs", &L::max_reply_logprobs, 0, int64_t(1) << 40),
  };
  return fields;
}

const engine::YamlSettings<RouterSection>& router_fields() {
  using R = RouterSection;
  static const engine::YamlSettings<R> fields = {
      {"host", "",
       [](const YAML::Node& node, const std::string& key, R& out) -> Status {
         BATON_ASSIGN_OR_RETURN(out.host, read_host(node, key));
         return Status::ok();
       },
       nullptr},
      int_setting("http_port", &R::http_port, 1, 65535),
      int_setting("zmq_port", &R::zmq_port, 1, 65535),
      int_setting("control_port", &R::control_port, 1, 65535),
      {"policy", "",
       [](const YAML::Node& node, const std::string& key, R& out) -> Status {
         std::string text = node.IsScalar() ? node.Scalar() : "";
         std::optional<RoutingPolicy> policy = parse_routing_policy(text);
         if (!policy) {
           return invalid_argument(
               key + ": expected round-robin, least-loaded or prefix-aware, got '" + text + "'");
         }
         out.policy = *policy;
         return Status::ok();
       },
       nullptr},
      int_setting("max_queued_requests", &R::max_queued_requests, 1, int64_t(1) << 20),
      ms_setting("request_timeout_ms", &R::request_timeout, 1, 86400000),
      ms_setting("heartbeat_interval_ms", &R::heartbeat_interval, 1, 60000),
      ms_setting("heartbeat_timeout_ms", &R::heartbeat_timeout, 1, 3600000),
      ms_setting("node_stall_timeout_ms", &R::node_stall_timeout, 0, 86400000),
      int_setting("min_remote_prefill_tokens", &R::min_remote_prefill_tokens, 0, int64_t(1) << 24),
      int_setting("max_prefill_queue_tokens", &R::max_prefill_queue_tokens, 0, int64_t(1) << 40),
      ms_setting("drain_timeout_ms", &R::drain_timeout, 0, 3600000),
      int_setting("http_threads", &R::http_threads, 1, 256),
      int_setting("request_threads", &R::request_threads, 1, 256),
      ms_setting("idle_timeout_ms", &R::idle_timeout, 1, 86400000),
      ms_setting("write_timeout_ms", &R::write_timeout, 1, 86400000),
      int_setting("max_queued_write_bytes", &R::max_queued_write_bytes, int64_t(64) << 10,
                  int64_t(1) << 34),
      int_setting("max_unsent_reply_bytes", &R::max_unsent_reply_bytes, int64_t(1) << 20,
                  int64_t(1) << 40),
      int_setting("max_connections", &R::max_connections, 1, 1 << 20),
      int_setting("max_request_body_bytes", &R::max_request_body_bytes, int64_t(1) << 10,
                  int64_t(1) << 30),
      string_setting("api_key_file", &R::api_key_file),
      string_setting("control_host", &R::control_host),
      string_setting("control_keys", &R::control_keys),
      string_setting("zmq_keys", &R::zmq_keys),
      {"limits", "",
       [](const YAML::Node& node, const std::string& key, R& out) -> Status {
         return engine::read_yaml_settings(node, key, limits_fields(), out.limits);
       },
       nullptr},
  };
  return fields;
}

Result<RouterSection> parse_router(const YAML::Node& node) {
  RouterSection router;
  BATON_RETURN_IF_ERROR(engine::read_yaml_settings(node, "router", router_fields(), router));
  if (router.heartbeat_timeout <= 2 * router.heartbeat_interval) {
    return invalid_argument("router.heartbeat_timeout_ms: must exceed 2 x heartbeat_interval_ms (" +
                            std::to_string(2 * router.heartbeat_interval.count()) + "), got " +
                            std::to_string(router.heartbeat_timeout.count()));
  }
  // A loop comes round within a step, and within its poll's wait: a bound
  // as short as those would declare busy nodes dead (nodes' pacing is
  // checked against it in check_stall_timeout).
  if (router.node_stall_timeout.count() > 0 && router.node_stall_timeout < kMinNodeStallTimeout) {
    return invalid_argument("router.node_stall_timeout_ms: 0 (never) or at least " +
                            std::to_string(kMinNodeStallTimeout.count()) + ", got " +
                            std::to_string(router.node_stall_timeout.count()));
  }
  return router;
}

// A node paced by engine.min_step_interval_ms waits up to that long in a
// turn of its loop: a stall timeout no longer would withhold its heartbeats
// whenever it has work.
Status check_stall_timeout(const ClusterConfig& config) {
  const auto stall = config.router.node_stall_timeout;
  if (stall.count() <= 0) return Status::ok();
  for (const auto* nodes : {&config.prefill, &config.decode}) {
    for (const NodeSection& node : *nodes) {
      if (node.engine.min_step_interval * 2 >= stall) {
        return invalid_argument("router.node_stall_timeout_ms: " + std::to_string(stall.count()) +
                                " ms must exceed twice the engine.min_step_interval_ms of node '" +
                                node.name + "' (" +
                                std::to_string(node.engine.min_step_interval.count()) + ")");
      }
    }
  }
  return Status::ok();
}

// Every port the cluster listens on, with the host it listens on: none twice.
Status check_ports(const RouterSection& router) {
  struct Port {
    std::string host;
    uint16_t port;
    std::string key;
  };
  const std::vector<Port> ports = {{router.host, router.http_port, "router.http_port"},
                                   {router.host, router.zmq_port, "router.zmq_port"},
                                   {router.control_host.empty() ? router.host : router.control_host,
                                    router.control_port, "router.control_port"}};
  for (size_t i = 0; i < ports.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (ports[i].host == ports[j].host && ports[i].port == ports[j].port) {
        return invalid_argument(ports[i].key + ": port " + std::to_string(ports[i].port) + " on " +
                                ports[i].host + " is already " + ports[j].key);
      }
    }
  }
  return Status::ok();
}

// --- nodes ------------------------------------------------------------------

Status check_node_name(const std::string& name, const std::string& key) {
  if (name.empty() || name.size() > 64) {
    return invalid_argument(key + ": must be 1 to 64 characters");
  }
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.';
    if (!ok) {
      return invalid_argument(key + ": '" + name +
                              "' may hold only letters, digits, '-', '_' and '.'");
    }
  }
  return Status::ok();
}

struct NodeDefaults {
  YAML::Node engine;
  YAML::Node transfer;
};

Result<NodeSection> parse_node(const YAML::Node& node, Role role, size_t index,
                               const NodeDefaults& defaults) {
  const std::string prefix = std::string(role_name(role)) + "[" + std::to_string(index) + "]";
  if (!node.IsMap()) {
    return invalid_argument(prefix + ": expected a mapping with name, host, engine, transfer");
  }
  NodeSection out;
  out.role = role;
  out.name = std::string(role_name(role)) + "-" + std::to_string(index);
  YAML::Node engine_node;
  YAML::Node transfer_node;
  BATON_ASSIGN_OR_RETURN(auto entries, yaml_map_entries(node, prefix));
  for (const auto& [name, value] : entries) {
    const std::string key = join_yaml_key(prefix, name);
    if (name == "name") {
      BATON_ASSIGN_OR_RETURN(out.name, engine::read_yaml_string(value, key));
      BATON_RETURN_IF_ERROR(check_node_name(out.name, key));
    } else if (name == "host") {
      BATON_ASSIGN_OR_RETURN(out.host, read_host(value, key));
    } else if (name == "engine") {
      engine_node = value;
    } else if (name == "transfer") {
      transfer_node = value;
    } else {
      return invalid_argument(key + ": unknown key");
    }
  }
  {
    const std::string key = prefix + ".engine";
    BATON_ASSIGN_OR_RETURN(YAML::Node merged,
                           merge_maps(defaults.engine, engine_node, "engine", key));
    BATON_ASSIGN_OR_RETURN(out.engine, engine::parse_engine_config(merged, key));
  }
  {
    const std::string key = prefix + ".transfer";
    BATON_ASSIGN_OR_RETURN(YAML::Node merged,
                           merge_maps(defaults.transfer, transfer_node, "transfer", key));
    BATON_ASSIGN_OR_RETURN(out.transfer, parse_transfer_config(merged, key));
  }
  out.transfer.node_name = out.name;
  return out;
}

Result<std::vector<NodeSection>> parse_nodes(const YAML::Node& node, Role role,
                                             const NodeDefaults& defaults) {
  const std::string key(role_name(role));
  if (node && !node.IsNull() && !node.IsSequence()) {
    return invalid_argument(key + ": expected a list of nodes");
  }
  std::vector<NodeSection> nodes;
  if (node) {
    for (size_t i = 0; i < node.size(); ++i) {
      BATON_ASSIGN_OR_RETURN(NodeSection parsed, parse_node(node[i], role, i, defaults));
      nodes.push_back(std::move(parsed));
    }
  }
  // Without prefill nodes every decode node prefills its own prompts
  // (colocated serving); without decode nodes nothing could generate.
  if (nodes.empty() && role == Role::kDecode)
    return invalid_argument(key + ": at least one node is required");
  return nodes;
}

// "256MiB" when exact, else a plain byte count.
std::string format_bytes(uint64_t bytes) {
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"GiB", 1ull << 30}, {"MiB", 1ull << 20}, {"KiB", 1ull << 10}};
  for (const auto& [name, scale] : kUnits) {
    if (bytes >= scale && bytes % scale == 0) return std::to_string(bytes / scale) + name;
  }
  return std::to_string(bytes) + " bytes";
}

// Rounded up to whole MiB (KiB below one MiB): a lower bound to quote.
std::string format_bytes_ceil(uint64_t bytes) {
  if (bytes >= (1ull << 20)) return std::to_string((bytes + (1ull << 20) - 1) >> 20) + "MiB";
  return std::to_string((bytes + 1023) >> 10) + "KiB";
}

}  // namespace

const NodeSection* ClusterConfig::find_node(std::string_view name) const {
  for (const auto* nodes : {&prefill, &decode}) {
    for (const auto& node : *nodes) {
      if (node.name == name) return &node;
    }
  }
  return nullptr;
}

Result<kv_transfer::TransferConfig> parse_transfer_config(const YAML::Node& node,
                                                          std::string_view prefix) {
  using T = kv_transfer::TransferConfig;
  static const engine::YamlSettings<T> fields = {
      {"mode", "",
       [](const YAML::Node& value, const std::string& key, T& out) -> Status {
         std::string text = value.IsScalar() ? value.Scalar() : "";
         auto mode = kv_transfer::parse_transfer_mode(text);
         if (!mode) {
           return invalid_argument(key + ": expected auto, rma, tag or am, got '" + text + "'");
         }
         out.mode = *mode;
         return Status::ok();
       },
       nullptr},
      ms_setting("default_deadline_ms", &T::default_deadline, 1, 3600000),
      // At least kMinCloseTimeout: a receiver frees granted blocks this long
      // after its last grant, and a sender refuses grants older than 3/4 of it.
      ms_setting("close_timeout_ms", &T::close_timeout, kv_transfer::kMinCloseTimeout.count(),
                 600000),
      ms_setting("idle_wait_ms", &T::idle_wait, 1, 10000),
      bool_setting("verify_checksum", &T::verify_checksum),
      bool_setting("peer_error_handling", &T::peer_error_handling),
      bool_setting("share_pool", &T::share_pool),
      int_setting("staging_blocks", &T::staging_blocks, 0, int64_t(1) << 24),
      {"ucx_env", "",
       [](const YAML::Node& value, const std::string& key, T& out) -> Status {
         BATON_ASSIGN_OR_RETURN(auto entries, yaml_map_entries(value, key));
         for (const auto& [name, setting] : entries) {
           const std::string entry_key = join_yaml_key(key, name);
           if (name.rfind("UCX_", 0) != 0 || name.size() == 4) {
             return invalid_argument(entry_key + ": UCX variables start with UCX_");
           }
           if (!setting.IsScalar()) return invalid_argument(entry_key + ": expected a value");
           out.ucx_env[name] = setting.Scalar();
         }
         return Status::ok();
       },
       nullptr},
  };
  kv_transfer::TransferConfig config;
  BATON_RETURN_IF_ERROR(engine::read_yaml_settings(node, prefix, fields, config));
  BATON_RETURN_IF_ERROR(kv_transfer::validate(config));
  return config;
}

// KV blocks move between any prefill and any decode node, byte for byte:
// every node must use the same block size, KV element type and kind of device.
static Status check_shared_kv_layout(const ClusterConfig& config) {
  const NodeSection* first = nullptr;
  std::string first_key;
  for (const auto* nodes : {&config.prefill, &config.decode}) {
    for (size_t i = 0; i < nodes->size(); ++i) {
      const NodeSection& node = (*nodes)[i];
      std::string key = std::string(role_name(node.role)) + "[" + std::to_string(i) + "]";
      if (first == nullptr) {
        first = &node;
        first_key = key;
        continue;
      }
      if (node.engine.block_size != first->engine.block_size) {
        return invalid_argument(
            key + ".engine.block_size: " + std::to_string(node.engine.block_size) +
            " differs from " + first_key + "'s " + std::to_string(first->engine.block_size) +
            "; KV blocks move between nodes, so all nodes share one block size");
      }
      if (node.engine.device.is_cuda() != first->engine.device.is_cuda()) {
        // The layouts' key orders (engine/forward_backend.h): a block's
        // bytes mean different things to the two backends.
        return invalid_argument(key + ".engine.device: " + node.name + " computes on " +
                                node.engine.device.name() + ", " + first->name + " (" + first_key +
                                ") on " + first->engine.device.name() + "; " +
                                std::string(engine::kOneDeviceKindReason));
      }
      if (node.engine.kv_dtype != first->engine.kv_dtype) {
        auto name = [](const std::optional<DType>& d) {
          return d ? std::string(dtype_name(*d)) : std::string("auto");
        };
        return invalid_argument(key + ".engine.kv_dtype: " + name(node.engine.kv_dtype) +
                                " differs from " + first_key + "'s " +
                                name(first->engine.kv_dtype) +
                                "; KV blocks move between nodes, so all nodes share one KV dtype");
      }
    }
  }
  return Status::ok();
}

std::string loopback_host_key(const std::string& host) {
  static const std::set<std::string> kThisHost = {"127.0.0.1", "localhost", "::1", "0.0.0.0", "::"};
  return kThisHost.contains(host) ? "this host" : host;
}

Status check_memory_fractions(const ClusterConfig& config,
                              const std::function<std::string(const std::string&)>& host_key) {
  struct Sharer {
    std::string key, name;
    double fraction;
  };
  std::map<std::pair<std::string, std::string>, std::vector<Sharer>> by_memory;
  for (const auto* nodes : {&config.prefill, &config.decode}) {
    for (size_t i = 0; i < nodes->size(); ++i) {
      const NodeSection& node = (*nodes)[i];
      if (!node.engine.sized_by_memory_fraction()) continue;
      const std::string host = host_key(node.host);
      if (host.empty()) continue;
      std::vector<Sharer>& sharers = by_memory[{host, node.engine.device.name()}];
      sharers.push_back({std::string(role_name(node.role)) + "[" + std::to_string(i) + "]",
                         node.name, node.engine.memory_fraction});
      double sum = 0;
      std::string names, parts;
      for (const Sharer& s : sharers) {
        sum += s.fraction;
        names += (names.empty() ? "" : ", ") + s.name;
        parts += (parts.empty() ? "" : " + ") + engine::format_fraction(s.fraction);
      }
      // A little slack for decimal fractions that add up to 1 exactly.
      if (sum > 1 + 1e-9) {
        return invalid_argument(sharers.back().key + ".engine.memory_fraction: " + names +
                                " share " + node.engine.device.name() + " on " + host +
                                " and ask for " + parts + " of its memory, more than all of it");
      }
    }
  }
  return Status::ok();
}

Result<ClusterConfig> parse_cluster_config(const YAML::Node& root, const fs::path& base_dir) {
  static const char* const kTopLevel[] = {"model",    "router",  "engine",
                                          "transfer", "prefill", "decode"};
  BATON_ASSIGN_OR_RETURN(auto entries, yaml_map_entries(root, ""));
  for (const auto& entry : entries) {
    if (std::find(std::begin(kTopLevel), std::end(kTopLevel), entry.first) == std::end(kTopLevel)) {
      return invalid_argument(entry.first + ": unknown key");
    }
  }
  auto section = [&](const char* name) {
    for (const auto& entry : entries) {
      if (entry.first == name) return entry.second;
    }
    return YAML::Node();
  };

  ClusterConfig config;
  BATON_ASSIGN_OR_RETURN(config.model, parse_model(section("model"), base_dir));
  BATON_ASSIGN_OR_RETURN(config.router, parse_router(section("router")));
  for (std::string* file :
       {&config.router.api_key_file, &config.router.control_keys, &config.router.zmq_keys}) {
    if (!file->empty() && fs::path(*file).is_relative()) *file = (base_dir / *file).string();
  }
  if (config.router.control_host.empty()) config.router.control_host = config.router.host;
  BATON_RETURN_IF_ERROR(check_ports(config.router));

  // The defaults are checked on their own first, so their errors name "engine.x",
  // and any error of a node's merged mapping is the node's own key.
  NodeDefaults defaults{section("engine"), section("transfer")};
  {
    auto engine = engine::parse_engine_config(defaults.engine, "engine");
    if (!engine.is_ok()) return engine.status();
    auto transfer = parse_transfer_config(defaults.transfer, "transfer");
    if (!transfer.is_ok()) return transfer.status();
  }
  BATON_ASSIGN_OR_RETURN(config.prefill, parse_nodes(section("prefill"), Role::kPrefill, defaults));
  BATON_ASSIGN_OR_RETURN(config.decode, parse_nodes(section("decode"), Role::kDecode, defaults));
  // A relative SSD tier directory is the YAML file's, as the model path is.
  for (auto* nodes : {&config.prefill, &config.decode}) {
    for (NodeSection& node : *nodes) {
      std::string& dir = node.engine.ssd_cache_dir;
      if (!dir.empty() && fs::path(dir).is_relative()) dir = (base_dir / dir).string();
    }
  }

  std::vector<std::pair<std::string, std::string>> names;  // name, key
  for (const auto* nodes : {&config.prefill, &config.decode}) {
    for (size_t i = 0; i < nodes->size(); ++i) {
      const NodeSection& node = (*nodes)[i];
      std::string node_key = std::string(role_name(node.role)) + "[" + std::to_string(i) + "]";
      for (const auto& [name, other] : names) {
        if (name == node.name) {
          return invalid_argument(node_key + ".name: '" + node.name + "' is already the name of " +
                                  other);
        }
      }
      names.emplace_back(node.name, node_key);
    }
  }
  BATON_RETURN_IF_ERROR(check_shared_kv_layout(config));
  BATON_RETURN_IF_ERROR(check_memory_fractions(config, loopback_host_key));
  BATON_RETURN_IF_ERROR(check_stall_timeout(config));
  return config;
}

Result<ClusterConfig> load_cluster_config(const fs::path& yaml_file) {
  BATON_RETURN_IF_ERROR(check_regular_file(yaml_file));  // errors name the path as given
  std::error_code ec;
  fs::path file = fs::absolute(yaml_file, ec).lexically_normal();
  if (ec) file = yaml_file;
  YAML::Node root;
  try {
    root = YAML::LoadFile(file.string());
  } catch (const YAML::Exception& e) {
    return invalid_argument(yaml_file.string() + ": " + e.what());
  }
  auto config = parse_cluster_config(root, file.parent_path());
  if (!config.is_ok()) return config.status().with_context(yaml_file.string());
  config->file = file;
  return config;
}

Status validate_against_model(const ClusterConfig& config, const engine::ModelConfig& model) {
  const std::string model_name =
      config.model.served_name.empty() ? std::string("the model") : config.model.served_name;
  for (const auto* nodes : {&config.prefill, &config.decode}) {
    for (size_t i = 0; i < nodes->size(); ++i) {
      const NodeSection& node = (*nodes)[i];
      const engine::EngineConfig& engine = node.engine;
      const std::string prefix =
          std::string(role_name(node.role)) + "[" + std::to_string(i) + "].engine.";
      if (engine.max_model_len > model.max_position_embeddings) {
        return invalid_argument(prefix + "max_model_len: " + std::to_string(engine.max_model_len) +
                                " exceeds " + model_name + "'s max_position_embeddings " +
                                std::to_string(model.max_position_embeddings));
      }
      const int64_t max_len =
          engine.max_model_len > 0 ? engine.max_model_len : model.max_position_embeddings;
      // Key order moves bytes within a block, never the block's size.
      const KvLayout layout = engine::kv_layout_of(model, engine.block_size,
                                                   engine.kv_dtype.value_or(model.torch_dtype),
                                                   KeyOrder::kGrouped, /*num_blocks=*/1);
      const uint64_t block_bytes = layout.total_bytes();  // one block, every layer
      if (block_bytes == 0) {
        return invalid_argument(model_name +
                                ": the model's shape has no KV (layers, KV heads or "
                                "head_dim is zero)");
      }
      int64_t blocks = engine.kv_cache_blocks > 0
                           ? engine.kv_cache_blocks
                           : engine::kv_blocks_for_bytes(layout, engine.kv_cache_bytes);
      // As the engine does: token slots are int32 in the kernels.
      blocks = std::min<int64_t>(blocks, INT32_MAX / engine.block_size);
      // With a sliding window on every layer a request holds only what its
      // windows and a step reach, however long it runs.
      const int32_t window = model.kv_window();
      const int64_t held = engine::tokens_held_at_once(
          max_len, window, engine.max_num_batched_tokens, engine.block_size);
      const int64_t needed = (held + engine.block_size - 1) / engine.block_size;
      if (engine.device.is_cuda()) {  // only a pool in device memory is staged
        BATON_RETURN_IF_ERROR(kv_transfer::check_staging_blocks(
            node.transfer.staging_blocks,
            engine::tokens_sent_at_most(max_len, window, engine.block_size), engine.block_size,
            std::string(role_name(node.role)) + "[" + std::to_string(i) +
                "].transfer.staging_blocks"));
      }
      // A share of a device's memory is sized where the device is known: the
      // engine refuses one that cannot hold a request there.
      if (blocks >= needed || engine.sized_by_memory_fraction()) continue;
      const int64_t tokens = blocks * engine.block_size;
      std::string what =
          engine.kv_cache_blocks > 0
              ? prefix + "kv_cache_blocks: " + std::to_string(engine.kv_cache_blocks) +
                    " blocks hold "
              : prefix + "kv_cache_bytes: " + format_bytes(engine.kv_cache_bytes) + " holds ";
      const std::string request =
          held < max_len ? "the " + std::to_string(held) + " tokens a request holds at once (its " +
                               std::to_string(window) + "-token sliding windows and a step of " +
                               std::to_string(engine.max_num_batched_tokens) + " tokens)"
                         : "one " + std::to_string(max_len) + "-token request";
      return invalid_argument(what + std::to_string(tokens) + " tokens of " + model_name +
                              "'s KV, less than " + request + " (needs " + std::to_string(needed) +
                              " blocks of " + std::to_string(engine.block_size) +
                              " tokens, at least " +
                              format_bytes_ceil(uint64_t(needed) * block_bytes) + " in " +
                              std::string(dtype_name(layout.dtype)) + " at " +
                              std::to_string(layout.bytes_per_token()) +
                              " bytes a token; or lower " + prefix + "max_model_len)");
    }
  }
  return Status::ok();
}

}  // namespace baton::cluster
