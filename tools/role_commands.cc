// tools/role_commands.cc — `baton router|prefill|decode --config FILE [--name NODE]`:
// one role of a cluster as its own process (what `baton up` starts, and what
// multi-host deployments run on each host).
#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>

#include "cluster/cluster_config.h"
#include "decode_node/decode_server.h"
#include "engine/model_config.h"
#include "prefill_node/prefill_server.h"
#include "router/router_server.h"
#include "tools/commands.h"
#include "tools/open_file_limit.h"
#include "tools/process_priority.h"
#include "tools/router_settings.h"
#include "tools/stop_signal.h"

namespace baton::tools {
namespace {

using namespace std::chrono_literals;

int fail(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.message().c_str());
  return 1;
}

// The cluster config, validated against the checkpoint it names.
Result<cluster::ClusterConfig> load_checked(const std::string& file) {
  BATON_ASSIGN_OR_RETURN(cluster::ClusterConfig config, cluster::load_cluster_config(file));
  BATON_ASSIGN_OR_RETURN(engine::ModelConfig model,
                         engine::load_model_config(config.model.path / "config.json"));
  BATON_RETURN_IF_ERROR(cluster::validate_against_model(config, model));
  return config;
}

// BATON_FAULT_DROP_NOTICES=N, for fault tests: the node's transfer engine
// drops its first N completion notices (TransferConfig::drop_notices).
Result<uint32_t> notices_to_drop() {
  const char* text = std::getenv("BATON_FAULT_DROP_NOTICES");
  if (text == nullptr || *text == '\0') return uint32_t{0};
  char* end = nullptr;
  errno = 0;
  const unsigned long n = std::strtoul(text, &end, 10);
  if (errno != 0 || *end != '\0' || *text == '-' || n > 1000000) {
    return invalid_argument(std::string("BATON_FAULT_DROP_NOTICES: expected a count, got '") +
                            text + "'");
  }
  if (n > 0) spdlog::warn("fault injection: the first {} completion notices are dropped", n);
  return uint32_t(n);
}

// A fault hook of one node, `variable`=NODE:VALUE (VALUE at most `max`):
// the value where NODE is `node`, nothing for other nodes or unset.
Result<std::optional<unsigned long>> node_fault(const char* variable, const std::string& node,
                                                unsigned long max, const char* what) {
  const char* text = std::getenv(variable);
  if (text == nullptr || *text == '\0') return std::optional<unsigned long>();
  const std::string_view value = text;
  const size_t colon = value.rfind(':');
  char* end = nullptr;
  errno = 0;
  const unsigned long n =
      colon == std::string_view::npos ? 0 : std::strtoul(text + colon + 1, &end, 10);
  if (colon == std::string_view::npos || colon + 1 == value.size() || errno != 0 || *end != '\0' ||
      text[colon + 1] == '-' || n > max) {
    return invalid_argument(std::string(variable) + ": expected NODE:" + what + ", got '" + text +
                            "'");
  }
  if (value.substr(0, colon) != node) return std::optional<unsigned long>();
  return std::optional<unsigned long>(n);
}

// BATON_FAULT_STALL_FIRST_STEP=NAME:MS, for fault tests: node NAME's loop
// sleeps MS milliseconds before its first engine step, as a hung step
// would hold it (NodeSettings::fault_first_step_stall).
Result<std::chrono::milliseconds> first_step_stall(const std::string& node) {
  BATON_ASSIGN_OR_RETURN(std::optional<unsigned long> ms,
                         node_fault("BATON_FAULT_STALL_FIRST_STEP", node, 3600000, "MILLISECONDS"));
  return std::chrono::milliseconds(ms.value_or(0));
}

// BATON_FAULT_CORRUPT_LAYER=NAME:LAYER, for fault tests: node NAME flips a
// bit of that layer of every transfer it receives, as a corrupting wire
// would (TransferConfig::corrupt_landed_layer).
Result<int32_t> corrupt_landed_layer(const std::string& node) {
  BATON_ASSIGN_OR_RETURN(std::optional<unsigned long> layer,
                         node_fault("BATON_FAULT_CORRUPT_LAYER", node, 1 << 16, "LAYER"));
  if (layer) spdlog::warn("fault injection: layer {} of every KV received is corrupted", *layer);
  return layer ? int32_t(*layer) : -1;
}

// BATON_TEST_STAGED_POOL=1, for tests: a CPU node stages its KV pool through
// host slots, the path a GPU node's pool takes (NodeSettings::stage_host_pool).
bool stage_host_pool() {
  const char* text = std::getenv("BATON_TEST_STAGED_POOL");
  const bool on = text != nullptr && std::string_view(text) == "1";
  if (on) spdlog::warn("test setting: the KV pool is staged through host slots");
  return on;
}

int run_router(const std::string& file) {
  const std::atomic<bool>& stop = install_stop_signals();
  Result<cluster::ClusterConfig> config = load_checked(file);
  if (!config.is_ok()) return fail(config.status());
  Result<router::RouterSettings> settings = router_settings(*config);
  if (!settings.is_ok()) return fail(settings.status());
  // A descriptor per client connection, and room for the nodes, ZeroMQ
  // clients and files beside them.
  if (Status raised = raise_open_file_limit(uint64_t(settings->http.max_connections) + 1024);
      !raised.is_ok()) {
    spdlog::warn("router: {}: connections past it fail to be accepted (EMFILE), not with a 503",
                 raised.message());
  }
  Result<std::unique_ptr<router::RouterServer>> server =
      router::RouterServer::start(std::move(settings).value());
  if (!server.is_ok()) return fail(server.status());
  std::printf("router ready: http://%s:%u\n", config->router.host.c_str(),
              unsigned((*server)->http_port()));
  std::fflush(stdout);
  while (!stop.load()) std::this_thread::sleep_for(50ms);
  spdlog::info("router: stopping (signal {}), draining for up to {} ms", stop_signal_number(),
               config->router.drain_timeout.count());
  (*server)->drain_and_stop(config->router.drain_timeout);
  return 0;
}

int run_node(const std::string& file, const std::string& name, cluster::Role role) {
  const std::atomic<bool>& stop = install_stop_signals();
  Result<cluster::ClusterConfig> config = load_checked(file);
  if (!config.is_ok()) return fail(config.status());
  const cluster::NodeSection* section = config->find_node(name);
  if (section == nullptr || section->role != role) {
    return fail(invalid_argument("no " + std::string(cluster::role_name(role)) + " node named '" +
                                 name + "' in " + file));
  }
  // First, so that every thread the node starts inherits it.
  if (Status s = lower_process_priority(section->engine.nice); !s.is_ok()) return fail(s);
  node::NodeSettings settings;
  settings.name = name;
  settings.role = role;
  settings.control_endpoint =
      "tcp://" + config->router.control_host + ":" + std::to_string(config->router.control_port);
  if (!config->router.control_keys.empty()) {
    auto keys = control::read_client_keys(config->router.control_keys, control::KeyRing::kControl);
    if (!keys.is_ok()) return fail(keys.status().with_context("router.control_keys"));
    settings.control_keys = std::move(keys).value();
  }
  settings.model_dir = config->model.path;
  settings.engine = section->engine;
  settings.transfer = section->transfer;
  Result<uint32_t> dropped = notices_to_drop();
  if (!dropped.is_ok()) return fail(dropped.status());
  settings.transfer.drop_notices = *dropped;
  settings.stage_host_pool = stage_host_pool();
  settings.heartbeat_interval = config->router.heartbeat_interval;
  settings.stall_timeout = config->router.node_stall_timeout;
  Result<std::chrono::milliseconds> stall = first_step_stall(name);
  if (!stall.is_ok()) return fail(stall.status());
  settings.fault_first_step_stall = *stall;
  Result<int32_t> corrupt = corrupt_landed_layer(name);
  if (!corrupt.is_ok()) return fail(corrupt.status());
  settings.transfer.corrupt_landed_layer = *corrupt;
  // A backstop behind the router, which aborts a request at its timeout (or
  // has the decode node compute it when the prefill node stops
  // heartbeating) and so normally acts first.
  settings.kv_wait_timeout = config->router.request_timeout + config->router.heartbeat_timeout;
  const std::string node = std::string(cluster::role_name(role)) + " node '" + name + "'";
  Status status;
  if (role == cluster::Role::kPrefill) {
    auto server = prefill_node::PrefillServer::create(settings);
    if (!server.is_ok()) return fail(server.status().with_context(node));
    status = (*server)->run(stop);
  } else {
    auto server = decode_node::DecodeServer::create(settings);
    if (!server.is_ok()) return fail(server.status().with_context(node));
    status = (*server)->run(stop);
  }
  if (!status.is_ok()) return fail(status);
  return 0;
}

}  // namespace

std::function<int()> add_router_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "router", "Run the router of a cluster config (HTTP, ZeroMQ, control plane)");
  auto file = std::make_shared<std::string>();
  sub->add_option("--config", *file, "Cluster YAML")->required();
  return [file] { return run_router(*file); };
}

std::function<int()> add_node_command(CLI::App& app, cluster::Role role) {
  bool prefill = role == cluster::Role::kPrefill;
  auto* sub = app.add_subcommand(prefill ? "prefill" : "decode",
                                 prefill ? "Run one prefill node of a cluster config"
                                         : "Run one decode node of a cluster config");
  auto file = std::make_shared<std::string>();
  auto name = std::make_shared<std::string>();
  sub->add_option("--config", *file, "Cluster YAML")->required();
  sub->add_option("--name", *name, "The node's name in the config")->required();
  return [file, name, role] { return run_node(*file, *name, role); };
}

}  // namespace baton::tools
