// router/router_server.cc — start-up and drain of the router process.
#include "router/router_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "common/control_messages.h"
#include "engine/model_config.h"

namespace baton::router {

using namespace std::chrono_literals;

Result<std::unique_ptr<RouterServer>> RouterServer::start(RouterSettings settings) {
  std::unique_ptr<RouterServer> server(new RouterServer());
  BATON_ASSIGN_OR_RETURN(engine::ModelConfig model,
                         engine::load_model_config(settings.model_dir / "config.json"));
  Result<std::unique_ptr<engine::Tokenizer>> tokenizer = engine::load_tokenizer(settings.model_dir);
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

  { BATON_ASSIGN_OR_RETURN(server->core_, RouterCore::start(settings.core)); }

  OpenAiServiceConfig& service = settings.service;
  server->metrics_ = std::make_unique<RouterMetrics>(service.served_model);
  service.max_model_len = service.max_model_len > 0
                              ? std::min(service.max_model_len, model.max_position_embeddings)
                              : model.max_position_embeddings;
  // The control messages carry prompts of up to kMaxPromptTokens: a longer
  // one would be refused by the node's decoder (a 500), not by the router
  // (a 400 that names the limit).
  if (service.max_model_len > int32_t(control::kMaxPromptTokens)) {
    spdlog::info("router: prompts limited to {} tokens, what a control message carries",
                 control::kMaxPromptTokens);
    service.max_model_len = int32_t(control::kMaxPromptTokens);
  }
  service.vocab_size = model.vocab_size;
  if (service.api_keys.required()) spdlog::info("router: the /v1/ routes require an API key");
  BATON_ASSIGN_OR_RETURN(
      engine::GenerationDefaults defaults,
      engine::load_generation_defaults(settings.model_dir / "generation_config.json"));
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
                         ChatPrompter::for_checkpoint(settings.model_dir));
  server->service_ =
      std::make_unique<OpenAiService>(service, *server->core_, server->tokenizer_.get(),
                                      *server->metrics_, std::move(chat_prompter));

  OpenAiService* routes = server->service_.get();
  // Replies are counted as each front end sends them, those it makes itself
  // among them.
  const auto count_reply = [metrics = server->metrics_.get()](int status) {
    metrics->count_http(status);
  };
  {
    HttpServerConfig http = settings.http;
    http.on_reply = count_reply;
    BATON_ASSIGN_OR_RETURN(
        server->http_,
        HttpServer::start(http, [routes](HttpRequest request, std::shared_ptr<HttpResponder> out) {
          routes->handle(std::move(request), std::move(out));
        }));
  }
  {
    ZmqFrontendConfig zmq = settings.zmq;
    zmq.on_reply = count_reply;
    BATON_ASSIGN_OR_RETURN(server->zmq_, ZmqFrontend::start(zmq, routes));
  }
  spdlog::info("router: serving {} on http://{}:{} (ZeroMQ {}, control {})", service.served_model,
               settings.http.host, server->http_->port(), settings.zmq.endpoint,
               settings.core.control_endpoint);
  return server;
}

RouterServer::~RouterServer() { drain_and_stop(0ms); }

void RouterServer::drain_and_stop(std::chrono::milliseconds timeout) {
  if (!core_) return;
  // A start that failed part-way (a port in use, a bad generation config)
  // leaves the later parts unmade: stop only what exists.
  if (service_) service_->set_draining(true);
  // Running requests, and those admitted but still waiting for a worker.
  auto busy = [&] { return core_->in_flight() > 0 || (service_ && !service_->workers_idle()); };
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (busy() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
  if (busy()) spdlog::warn("router: drain timed out with {} requests left", core_->in_flight());
  // What the workers still hold is read and answered (replies being built
  // go out) while both front ends can still deliver it.
  if (service_) service_->stop_workers();
  // And handed to libzmq before the ZeroMQ front end closes.
  while (zmq_ && !zmq_->replies_out() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  zmq_.reset();
  core_->stop();  // fails what is left; exchanges answer their clients
  if (http_) http_->stop();
  http_.reset();
  core_.reset();
}

}  // namespace baton::router
