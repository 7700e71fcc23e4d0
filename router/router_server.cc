// router/router_server.cc — start-up and drain of the router process.
#include "router/router_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "engine/model_config.h"

namespace baton::router {

using namespace std::chrono_literals;

namespace {

Policy policy_of(cluster::RoutingPolicy policy) {
  switch (policy) {
    case cluster::RoutingPolicy::kRoundRobin:
      return Policy::kRoundRobin;
    case cluster::RoutingPolicy::kLeastLoaded:
      return Policy::kLeastLoaded;
    case cluster::RoutingPolicy::kPrefixAware:
      return Policy::kPrefixAware;
  }
  return Policy::kLeastLoaded;
}

// The longest request every decode node accepts: each node's max_model_len
// (0: the model's), never past the model's position embeddings.
int32_t cluster_max_model_len(const cluster::ClusterConfig& config,
                              const engine::ModelConfig& model) {
  int32_t limit = model.max_position_embeddings;
  for (const auto* nodes : {&config.prefill, &config.decode}) {
    for (const cluster::NodeSection& node : *nodes) {
      if (node.engine.max_model_len > 0) limit = std::min(limit, node.engine.max_model_len);
    }
  }
  return limit;
}

}  // namespace

Result<std::unique_ptr<RouterServer>> RouterServer::start(const cluster::ClusterConfig& config) {
  std::unique_ptr<RouterServer> server(new RouterServer());
  BATON_ASSIGN_OR_RETURN(engine::ModelConfig model,
                         engine::load_model_config(config.model.path / "config.json"));
  Result<std::unique_ptr<engine::Tokenizer>> tokenizer = engine::load_tokenizer(config.model.path);
  if (tokenizer.is_ok()) {
    server->tokenizer_ = std::move(tokenizer).value();
  } else if (tokenizer.status().code() == StatusCode::kUnimplemented) {
    // A tokenizer of a kind Baton does not implement yet: token ids still
    // work, text is refused as for a checkpoint without a tokenizer.
    spdlog::warn("router: {}; text prompts are refused, token ids still work",
                 tokenizer.status().message());
  } else if (tokenizer.status().code() != StatusCode::kNotFound) {
    return tokenizer.status();
  }

  const cluster::RouterSection& r = config.router;
  RouterCoreConfig core;
  core.control_endpoint = "tcp://" + r.control_host + ":" + std::to_string(r.control_port);
  if (!r.control_keys.empty()) {
    auto keys = control::read_curve_keys(r.control_keys, control::KeyRing::kControl);
    if (!keys.is_ok()) return keys.status().with_context("router.control_keys");
    core.control_keys = std::move(keys).value();
    spdlog::info("router: the control plane is keyed (CURVE, keys in {})", r.control_keys);
  }
  for (const auto& node : config.prefill) core.nodes[node.name] = Role::kPrefill;
  for (const auto& node : config.decode) core.nodes[node.name] = Role::kDecode;
  core.policy = policy_of(r.policy);
  core.max_queued_requests = r.max_queued_requests;
  core.request_timeout = r.request_timeout;
  core.heartbeat_timeout = r.heartbeat_timeout;
  core.min_remote_prefill_tokens = r.min_remote_prefill_tokens;
  { BATON_ASSIGN_OR_RETURN(server->core_, RouterCore::start(core)); }

  server->metrics_ = std::make_unique<RouterMetrics>(config.model.served_name);
  OpenAiServiceConfig service;
  service.served_model = config.model.served_name;
  service.max_model_len = cluster_max_model_len(config, model);
  service.vocab_size = model.vocab_size;
  service.limits = r.limits;
  BATON_ASSIGN_OR_RETURN(service.api_keys, ApiKeys::load(r.api_key_file));
  if (service.api_keys.required()) spdlog::info("router: the /v1/ routes require an API key");
  BATON_ASSIGN_OR_RETURN(
      engine::GenerationDefaults defaults,
      engine::load_generation_defaults(config.model.path / "generation_config.json"));
  service.limits.default_temperature = defaults.temperature;
  service.limits.default_top_p = defaults.top_p;
  service.limits.default_top_k = defaults.top_k;
  if (defaults.temperature || defaults.top_p || defaults.top_k) {
    spdlog::info(
        "router: sampling defaults from the checkpoint's generation_config.json: "
        "temperature {}, top_p {}, top_k {}",
        defaults.temperature ? std::to_string(*defaults.temperature) : "unset",
        defaults.top_p ? std::to_string(*defaults.top_p) : "unset",
        defaults.top_k ? std::to_string(*defaults.top_k) : "unset");
  }
  BATON_ASSIGN_OR_RETURN(ChatPrompter chat_prompter,
                         ChatPrompter::for_checkpoint(config.model.path));
  server->service_ =
      std::make_unique<OpenAiService>(service, *server->core_, server->tokenizer_.get(),
                                      *server->metrics_, std::move(chat_prompter));

  HttpServerConfig http;
  http.host = r.host;
  http.port = r.http_port;
  http.threads = r.http_threads;
  http.idle_timeout = r.idle_timeout;
  http.write_timeout = r.write_timeout;
  http.max_queued_write_bytes = size_t(r.max_queued_write_bytes);
  http.max_connections = r.max_connections;
  http.max_body_bytes = size_t(r.max_request_body_bytes);
  OpenAiService* routes = server->service_.get();
  {
    BATON_ASSIGN_OR_RETURN(
        server->http_,
        HttpServer::start(http, [routes](HttpRequest request, std::shared_ptr<HttpResponder> out) {
          routes->handle(std::move(request), std::move(out));
        }));
  }
  ZmqFrontendConfig zmq;
  zmq.endpoint = "tcp://" + r.host + ":" + std::to_string(r.zmq_port);
  zmq.max_body_bytes = size_t(r.max_request_body_bytes);
  if (!r.zmq_keys.empty()) {
    auto keys = control::read_curve_keys(r.zmq_keys, control::KeyRing::kClients);
    if (!keys.is_ok()) return keys.status().with_context("router.zmq_keys");
    zmq.keys = std::move(keys).value();
    spdlog::info("router: the ZeroMQ front end is keyed (CURVE, keys in {})", r.zmq_keys);
  }
  { BATON_ASSIGN_OR_RETURN(server->zmq_, ZmqFrontend::start(zmq, routes)); }
  spdlog::info("router: serving {} on http://{}:{} (ZeroMQ tcp://{}:{}, control tcp://{}:{})",
               config.model.served_name, r.host, server->http_->port(), r.host, r.zmq_port,
               r.control_host, r.control_port);
  return server;
}

RouterServer::~RouterServer() { drain_and_stop(0ms); }

void RouterServer::drain_and_stop(std::chrono::milliseconds timeout) {
  if (!core_) return;
  service_->set_draining(true);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (core_->in_flight() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  if (core_->in_flight() > 0)
    spdlog::warn("router: drain timed out with {} requests left", core_->in_flight());
  zmq_.reset();
  core_->stop();  // fails what is left; exchanges answer their clients
  http_->stop();
  http_.reset();
  core_.reset();
}

}  // namespace baton::router
