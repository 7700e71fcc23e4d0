// router/openai_service.h — the router's HTTP routes.
//
//   POST /v1/completions, /v1/chat/completions   generation (JSON or SSE)
//   POST /tokenize, /detokenize                   vLLM's tokenizer routes
//   GET  /v1/models                               the served model
//   GET  /health                                  200; 503 while no prefill or decode node is up
//   GET  /metrics                                 Prometheus text (vLLM's metric names)
//   GET  /v1/nodes                                Baton: every node's state and load, as JSON
//   GET  /version                                 {"version": "..."}
//
// Requests are validated here (fields, model name, token ids against the
// vocabulary, prompt length against max_model_len), tokenised, and handed to
// a CompletionExchange. The POST routes' work (parsing, templates,
// tokenising) runs on the request workers, never on a front end's thread;
// with more request bytes waiting for them than they take, a request gets 429.
#pragma once

#include <atomic>
#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "engine/tokenizer.h"
#include "router/api_keys.h"
#include "router/chat_template.h"
#include "router/completion_request.h"
#include "router/http_server.h"
#include "router/metrics.h"
#include "router/request_workers.h"
#include "router/router_core.h"

namespace baton::router {

// What a request waiting for a worker is charged besides its body and
// headers: the rest it holds (the responder, the task).
inline constexpr size_t kQueuedRequestOverheadBytes = 1024;

struct OpenAiServiceConfig {
  std::string served_model;
  int32_t max_model_len = 0;
  int32_t vocab_size = 0;
  RequestLimits limits;
  ApiKeys api_keys;             // none: every route open
  int32_t request_threads = 2;  // the request workers (router/request_workers.h)
  size_t max_queued_request_bytes = 8 * kMaxRequestBodyBytes;  // bodies waiting for them
};

class OpenAiService {
 public:
  OpenAiService(OpenAiServiceConfig config, RouterCore& core, const engine::Tokenizer* tokenizer,
                RouterMetrics& metrics, ChatPrompter chat_prompter = {});
  ~OpenAiService();

  // The HttpHandler.
  void handle(HttpRequest request, std::shared_ptr<HttpResponder> responder);
  // While draining, new generation requests get 503 and /health says so.
  void set_draining(bool draining) { draining_ = draining; }
  // No request waits for a worker or is being read by one (replies being
  // built included).
  bool workers_idle() const { return workers_.idle(); }
  // Finishes what the workers hold (requests that reach the core after it
  // stopped fail with its error), then stops them; later requests get 503.
  void stop_workers() { workers_.stop(); }

 private:
  // A POST route's request, on a worker; `arrival` is when handle() took it.
  void handle_posted(const std::string& path, const HttpRequest& request,
                     std::shared_ptr<HttpResponder> responder,
                     std::chrono::steady_clock::time_point arrival);
  void generate(const HttpRequest& request, std::shared_ptr<HttpResponder> responder, bool chat,
                std::chrono::steady_clock::time_point arrival);
  void tokenize(const HttpRequest& request, HttpResponder& responder);
  void detokenize(const HttpRequest& request, HttpResponder& responder);
  void refuse_route(const HttpRequest& request, const std::string& path, const bool* posted_to,
                    HttpResponder& responder);
  void send_error(HttpResponder& responder, const Status& status);
  void send_json(HttpResponder& responder, int status, const std::string& body);
  // The tokenizer's ids of `text`, after its BOS when `add_bos` (and it has
  // one), if there are at most `limit` of them; nullopt, found out early, if more.
  std::optional<std::vector<int32_t>> encode(
      const std::string& text, bool add_bos,
      size_t limit = std::numeric_limits<size_t>::max()) const;
  // InvalidArgument naming the first id outside the vocabulary; OK if none.
  Status check_vocabulary(const std::vector<int32_t>& ids, std::string_view what) const;

  OpenAiServiceConfig config_;
  RouterCore& core_;
  const engine::Tokenizer* tokenizer_;
  ChatPrompter chat_prompter_;
  RouterMetrics& metrics_;
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{0};
  // GenerationRequest::prompt_group of the next prompt with several samples.
  std::atomic<uint64_t> next_prompt_group_{1};
  RequestWorkers workers_;  // last: stopped before anything its work uses goes
};

}  // namespace baton::router
