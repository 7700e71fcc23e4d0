// router/router_server.h — the router process assembled from the cluster
// config: dispatcher core, metrics, OpenAI routes on the HTTP server, and the
// ZeroMQ client front end; with a bounded drain on shutdown.
#pragma once

#include <chrono>
#include <memory>

#include "cluster/cluster_config.h"
#include "engine/tokenizer.h"
#include "router/http_server.h"
#include "router/metrics.h"
#include "router/openai_service.h"
#include "router/router_core.h"
#include "router/zmq_frontend.h"

namespace baton::router {

class RouterServer {
 public:
  // Reads the model's config.json and tokenizer from the config's model path.
  static Result<std::unique_ptr<RouterServer>> start(const cluster::ClusterConfig& config);
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
