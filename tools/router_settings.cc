#include "tools/router_settings.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/curve_keys.h"

namespace baton::tools {

namespace {

// The longest request every node takes: the least of the nodes'
// engine.max_model_len, 0 when none sets one (the model's then).
int32_t nodes_max_model_len(const cluster::ClusterConfig& config) {
  int32_t limit = 0;
  for (const auto* nodes : {&config.prefill, &config.decode}) {
    for (const cluster::NodeSection& node : *nodes) {
      const int32_t own = node.engine.max_model_len;
      if (own > 0) limit = limit > 0 ? std::min(limit, own) : own;
    }
  }
  return limit;
}

}  // namespace

Result<router::RouterSettings> router_settings(const cluster::ClusterConfig& config) {
  const cluster::RouterSection& r = config.router;
  router::RouterSettings settings;
  settings.model_dir = config.model.path;

  router::RouterCoreConfig& core = settings.core;
  core.control_endpoint = "tcp://" + r.control_host + ":" + std::to_string(r.control_port);
  if (!r.control_keys.empty()) {
    auto keys = control::read_curve_keys(r.control_keys, control::KeyRing::kControl);
    if (!keys.is_ok()) return keys.status().with_context("router.control_keys");
    core.control_keys = std::move(keys).value();
    spdlog::info("router: the control plane is keyed (CURVE, keys in {})", r.control_keys);
  }
  for (const auto& node : config.prefill) core.nodes[node.name] = Role::kPrefill;
  for (const auto& node : config.decode) core.nodes[node.name] = Role::kDecode;
  core.policy = r.policy;
  core.max_queued_requests = r.max_queued_requests;
  core.request_timeout = r.request_timeout;
  core.heartbeat_timeout = r.heartbeat_timeout;
  core.placement.min_remote_prefill_tokens = r.min_remote_prefill_tokens;
  core.placement.max_prefill_queue_tokens = r.max_prefill_queue_tokens;

  router::OpenAiServiceConfig& service = settings.service;
  service.served_model = config.model.served_name;
  service.max_model_len = nodes_max_model_len(config);
  service.limits = r.limits;
  service.request_threads = r.request_threads;
  // Eight of the largest bodies may wait for the workers; more get 429.
  service.max_queued_request_bytes = 8 * size_t(r.max_request_body_bytes);
  BATON_ASSIGN_OR_RETURN(service.api_keys, router::ApiKeys::load(r.api_key_file));

  router::HttpServerConfig& http = settings.http;
  http.host = r.host;
  http.port = r.http_port;
  http.threads = r.http_threads;
  http.idle_timeout = r.idle_timeout;
  http.write_timeout = r.write_timeout;
  http.max_queued_write_bytes = size_t(r.max_queued_write_bytes);
  http.max_connections = r.max_connections;
  http.max_unsent_bytes = size_t(r.max_unsent_reply_bytes);
  http.max_body_bytes = size_t(r.max_request_body_bytes);

  router::ZmqFrontendConfig& zmq = settings.zmq;
  zmq.endpoint = "tcp://" + r.host + ":" + std::to_string(r.zmq_port);
  zmq.max_body_bytes = size_t(r.max_request_body_bytes);
  zmq.max_queued_reply_bytes = size_t(r.max_queued_write_bytes);
  zmq.write_timeout = r.write_timeout;
  if (!r.zmq_keys.empty()) {
    auto keys = control::read_curve_keys(r.zmq_keys, control::KeyRing::kClients);
    if (!keys.is_ok()) return keys.status().with_context("router.zmq_keys");
    zmq.keys = std::move(keys).value();
    spdlog::info("router: the ZeroMQ front end is keyed (CURVE, keys in {})", r.zmq_keys);
  }
  return settings;
}

}  // namespace baton::tools
