// router/router_server.h — the router process assembled from its settings:
// dispatcher core, metrics, OpenAI routes on the HTTP server, and the ZeroMQ
// client front end; with a bounded drain on shutdown.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>

#include "engine/tokenizer.h"
#include "router/http_server.h"
#include "router/metrics.h"
#include "router/openai_service.h"
#include "router/router_core.h"
#include "router/zmq_frontend.h"

namespace baton::router {

// What the router process runs with: built from the cluster YAML by the CLI
// (tools/router_settings.h), as the nodes take node::NodeSettings.
struct RouterSettings {
  // config.json, the tokenizer, generation_config.json and the chat template.
  std::filesystem::path model_dir;
  RouterCoreConfig core;  // control plane, the cluster's nodes, policy, queue, timeouts
  // The served name, request limits and API keys. max_model_len: the longest
  // prompt and output every node takes (0: the model's); never more than the
  // model's position embeddings. vocab_size comes from the model.
  OpenAiServiceConfig service;
  HttpServerConfig http;
  ZmqFrontendConfig zmq;
};

class RouterServer {
 public:
  // Reads the model's config.json and tokenizer from settings.model_dir.
  static Result<std::unique_ptr<RouterServer>> start(RouterSettings settings);
  ~RouterServer();

  uint16_t http_port() const { return http_->port(); }
  // New requests get 503; waits until running ones end or `timeout` passes,
  // then stops everything (what is left fails with an error).
  void drain_and_stop(std::chrono::milliseconds timeout);

 private:
  RouterServer() = default;

  std::unique_ptr<engine::Tokenizer> tokenizer_;
  std::unique_ptr<RouterCore> core_;
  std::unique_ptr<RouterMetrics> metrics_;
  std::unique_ptr<OpenAiService> service_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<ZmqFrontend> zmq_;
};

}  // namespace baton::router
