// router/openai_service.cc — routes, validation, tokenisation.
#include "router/openai_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <map>
#include <random>

#include "router/api_error.h"
#include "router/chat_template.h"
#include "router/completion_exchange.h"

namespace baton::router {

using json = nlohmann::json;

namespace {

std::string dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The path of a request target: origin form ("/v1/models?x") or, as
// RFC 9112 says a server must accept, absolute form ("http://host/v1/models").
std::string path_of(const std::string& target) {
  std::string path = target.substr(0, target.find('?'));
  for (std::string_view scheme : {"http://", "https://"}) {
    if (path.size() > scheme.size() &&
        std::equal(scheme.begin(), scheme.end(), path.begin(), [](char a, char b) {
          return a == std::tolower(static_cast<unsigned char>(b));
        })) {
      const size_t slash = path.find('/', scheme.size());
      return slash == std::string::npos ? "/" : path.substr(slash);
    }
  }
  return path;
}

json node_json(const NodeState& node) {
  json out = {{"name", node.name},
              {"role", role_name(node.role)},
              {"up", node.up},
              {"pid", node.pid},
              {"device", node.device},
              {"kv_staging", node.kv_staging.empty() ? json(nullptr) : json(node.kv_staging)},
              {"memory_bytes",
               {{"weights", node.weights_bytes},
                {"kv_pool", node.kv_pool_bytes},
                {"workspace", node.load.workspace_bytes}}},
              {"kv_paths", node.kv_paths},
              {"prefix_caching", node.prefix_caching},
              {"assigned_requests", node.assigned_requests},
              {"queued_prompt_tokens", node.assigned_tokens}};
  for (const control::NodeLoadField& f : control::kNodeLoadFields)
    out[f.name] = node.load.*f.member;
  return out;
}

}  // namespace

OpenAiService::OpenAiService(OpenAiServiceConfig config, RouterCore& core,
                             const engine::Tokenizer* tokenizer, RouterMetrics& metrics,
                             ChatPrompter chat_prompter)
    : config_(std::move(config)),
      core_(core),
      tokenizer_(tokenizer),
      chat_prompter_(std::move(chat_prompter)),
      metrics_(metrics),
      workers_(config_.request_threads, config_.max_queued_request_bytes) {}

OpenAiService::~OpenAiService() { workers_.stop(); }

void OpenAiService::send_json(HttpResponder& responder, int status, const std::string& body) {
  responder.respond(status, "application/json", body);
}

void OpenAiService::send_error(HttpResponder& responder, const Status& status) {
  ApiError error = api_error_from_status(status);
  std::vector<std::pair<std::string, std::string>> headers;
  if (error.http_status == 429 || error.http_status == 503)
    headers.emplace_back("Retry-After", "1");
  responder.respond(error.http_status, "application/json", dump(error.to_json()),
                    std::move(headers));
}

std::optional<std::vector<int32_t>> OpenAiService::encode(const std::string& text, bool add_bos,
                                                          size_t limit) const {
  const bool bos = add_bos && tokenizer_->bos_id() >= 0;
  if (bos && limit == 0) return std::nullopt;
  std::optional<std::vector<int32_t>> ids = tokenizer_->encode_within(text, limit - bos);
  if (ids && bos) ids->insert(ids->begin(), tokenizer_->bos_id());
  return ids;
}

Status OpenAiService::check_vocabulary(const std::vector<int32_t>& ids,
                                       std::string_view what) const {
  for (int32_t id : ids) {
    if (id < 0 || id >= config_.vocab_size) {
      return invalid_argument(std::string(what) + " " + std::to_string(id) +
                              " is out of vocabulary (size " + std::to_string(config_.vocab_size) +
                              ")");
    }
  }
  return Status::ok();
}

void OpenAiService::handle(HttpRequest request, std::shared_ptr<HttpResponder> responder) {
  std::string path = path_of(request.target);
  if (!config_.api_keys.admits(path, request.header("authorization"))) {
    return responder->respond(401, "application/json", R"({"error":"Unauthorized"})");
  }
  // Each route takes POST, or GET (and HEAD: GET without the body, which
  // the connection leaves out).
  static const std::map<std::string, bool, std::less<>> kPostedTo = {
      {"/v1/completions", true}, {"/v1/chat/completions", true},
      {"/tokenize", true},       {"/detokenize", true},
      {"/health", false},        {"/version", false},
      {"/v1/models", false},     {"/metrics", false},
      {"/v1/nodes", false}};
  const auto route = kPostedTo.find(path);
  const bool allowed = route != kPostedTo.end() &&
                       (route->second ? request.method == "POST"
                                      : request.method == "GET" || request.method == "HEAD");
  if (!allowed)
    return refuse_route(request, path, route == kPostedTo.end() ? nullptr : &route->second,
                        *responder);
  if (route->second) {
    // Generation stops at admission while draining; what was admitted before
    // runs to its end, and the drain waits for it.
    if (draining_ && path != "/tokenize" && path != "/detokenize") {
      return send_error(*responder, unavailable("the router is shutting down"));
    }
    // Charged for what a waiting request holds: its body and headers, and
    // a fixed share for the rest (so empty bodies cannot queue without end).
    size_t bytes = kQueuedRequestOverheadBytes + request.body.size() + request.target.size();
    for (const auto& [name, value] : request.headers) bytes += name.size() + value.size();
    auto work = [this, path, request = std::move(request), responder,
                 arrival = std::chrono::steady_clock::now()] {
      handle_posted(path, request, responder, arrival);
    };
    switch (workers_.try_post(bytes, std::move(work))) {
      case RequestWorkers::Admission::kQueued:
        return;
      case RequestWorkers::Admission::kStopped:
        return send_error(*responder, unavailable("the router is shutting down"));
      case RequestWorkers::Admission::kFull:
        return send_error(
            *responder,
            resource_exhausted("the router is busy: " + std::to_string(workers_.queued_bytes()) +
                               " bytes of requests wait for its request threads "
                               "(router.request_threads); retry later"));
    }
  }
  if (path == "/health") {
    // 503 whenever a request now could not be served, saying why.
    const std::shared_ptr<const ClusterSnapshot> shared = core_.snapshot();
    const ClusterSnapshot& snapshot = *shared;
    std::string reason;
    if (draining_)
      reason = "the router is draining: it takes no new requests";
    else if (snapshot.decode_up == 0)
      reason = "no decode node is up";
    else if (snapshot.prefill_up == 0 && snapshot.prefill_configured > 0)
      reason = "no prefill node is up";
    else if (core_.in_flight() >= core_.max_queued_requests())  // what admission counts
      reason = "the queue is full: " + std::to_string(core_.max_queued_requests()) +
               " requests in the router";
    json body = {{"status", reason.empty() ? "ok" : "unavailable"},
                 {"prefill_up", snapshot.prefill_up},
                 {"decode_up", snapshot.decode_up},
                 {"requests_in_router", snapshot.requests_in_router},
                 {"draining", draining_.load()}};
    if (!reason.empty()) body["reason"] = reason;
    return send_json(*responder, reason.empty() ? 200 : 503, dump(body));
  }
  if (path == "/version") {
    return send_json(*responder, 200, dump({{"version", BATON_VERSION}}));
  }
  if (path == "/v1/models") {
    json model = {{"id", config_.served_model},   {"object", "model"},
                  {"created", unix_seconds()},    {"owned_by", "baton"},
                  {"root", config_.served_model}, {"max_model_len", config_.max_model_len}};
    return send_json(*responder, 200, dump({{"object", "list"}, {"data", json::array({model})}}));
  }
  if (path == "/metrics") {
    return responder->respond(200, "text/plain; version=0.0.4", metrics_.render(*core_.snapshot()));
  }
  // The table's last GET route: /v1/nodes.
  const std::shared_ptr<const ClusterSnapshot> shared = core_.snapshot();
  const ClusterSnapshot& snapshot = *shared;
  json nodes = json::array();
  for (const NodeState& node : snapshot.nodes) nodes.push_back(node_json(node));
  send_json(*responder, 200,
            dump({{"nodes", nodes},
                  {"requests_in_router", snapshot.requests_in_router},
                  {"control_messages_rejected", snapshot.control_messages_rejected}}));
}

void OpenAiService::handle_posted(const std::string& path, const HttpRequest& request,
                                  std::shared_ptr<HttpResponder> responder,
                                  std::chrono::steady_clock::time_point arrival) {
  if (responder->closed()) return;  // cancelled or gone while it waited
  // Nothing a client sends may end a worker: a route that throws answers
  // its request with a 500, as the front ends do for their own handlers.
  try {
    if (path == "/v1/completions") return generate(request, responder, false, arrival);
    if (path == "/v1/chat/completions") return generate(request, responder, true, arrival);
    if (path == "/tokenize") return tokenize(request, *responder);
    return detokenize(request, *responder);
  } catch (const std::exception& e) {
    spdlog::error("router: {} threw: {}", path, e.what());
  } catch (...) {
    spdlog::error("router: {} threw a non-exception", path);
  }
  send_error(*responder, internal_error("internal error"));
}

// 404 for a path no route has; 405, with the method it takes, for one the
// request's method is not.
void OpenAiService::refuse_route(const HttpRequest& request, const std::string& path,
                                 const bool* posted_to, HttpResponder& responder) {
  const bool known = posted_to != nullptr;
  ApiError error;
  error.http_status = known ? 405 : 404;
  error.type = known ? "MethodNotAllowed" : "NotFoundError";
  error.message =
      known ? "method " + request.method + " is not allowed on " + path : "no route " + path;
  std::vector<std::pair<std::string, std::string>> headers;
  if (known) headers.emplace_back("Allow", *posted_to ? "POST" : "GET, HEAD");
  responder.respond(error.http_status, "application/json", dump(error.to_json()),
                    std::move(headers));
}

// vLLM's /tokenize: the ids a prompt (or chat) becomes, BOS included when
// add_special_tokens asks for it, as generation adds it.
void OpenAiService::tokenize(const HttpRequest& request, HttpResponder& responder) {
  Result<TokenizeRequest> parsed = parse_tokenize_request(request.body);
  if (!parsed.is_ok()) return send_error(responder, parsed.status());
  if (!parsed->model.empty() && parsed->model != config_.served_model) {
    return send_error(responder, not_found("The model `" + parsed->model + "` does not exist."));
  }
  if (tokenizer_ == nullptr) {
    return send_error(responder, invalid_argument("this model ships no tokenizer"));
  }
  std::string text = std::move(parsed->text);
  bool add_bos = parsed->add_special_tokens.value_or(true);
  if (parsed->chat) {
    Result<std::string> rendered = chat_prompter_.render(*parsed->chat);
    if (!rendered.is_ok()) return send_error(responder, rendered.status());
    text = std::move(rendered).value();
    add_bos = parsed->add_special_tokens.value_or(chat_prompter_.adds_bos());
  }
  std::vector<int32_t> ids = *encode(text, add_bos);
  json body = {{"count", ids.size()},
               {"max_model_len", config_.max_model_len},
               {"tokens", ids},
               {"token_strs", nullptr}};
  send_json(responder, 200, dump(body));
}

// vLLM's /detokenize: the text of token ids (special tokens decode to "").
void OpenAiService::detokenize(const HttpRequest& request, HttpResponder& responder) {
  Result<DetokenizeRequest> parsed = parse_detokenize_request(request.body);
  if (!parsed.is_ok()) return send_error(responder, parsed.status());
  if (!parsed->model.empty() && parsed->model != config_.served_model) {
    return send_error(responder, not_found("The model `" + parsed->model + "` does not exist."));
  }
  if (tokenizer_ == nullptr) {
    return send_error(responder, invalid_argument("this model ships no tokenizer"));
  }
  if (Status in_vocabulary = check_vocabulary(parsed->tokens, "Token id"); !in_vocabulary.is_ok()) {
    return send_error(responder, in_vocabulary);
  }
  send_json(responder, 200, dump({{"prompt", tokenizer_->decode(parsed->tokens)}}));
}

void OpenAiService::generate(const HttpRequest& request, std::shared_ptr<HttpResponder> responder,
                             bool chat, std::chrono::steady_clock::time_point arrival) {
  std::string model;
  SamplingFields sampling;
  std::vector<Prompt> prompts;
  // Text is encoded only while it fits: the longest prompt leaves room for
  // one token of output. Past that, the count is a floor.
  const size_t longest_prompt = size_t(std::max(config_.max_model_len - 1, 0));
  auto too_long = [&](const std::string& count) {
    send_error(*responder,
               invalid_argument("This model's maximum context length is " +
                                std::to_string(config_.max_model_len) +
                                " tokens. However, your request has " + count +
                                " input tokens. Please reduce the length of the input messages."));
  };
  const std::string at_least_the_limit = "at least " + std::to_string(config_.max_model_len);
  if (chat) {
    Result<ChatRequest> parsed = parse_chat_request(request.body, config_.limits);
    if (!parsed.is_ok()) return send_error(*responder, parsed.status());
    model = parsed->model;
    sampling = parsed->sampling;
    Result<std::string> rendered = chat_prompter_.render(*parsed);
    if (!rendered.is_ok()) return send_error(*responder, rendered.status());
    if (tokenizer_ == nullptr) {
      return send_error(*responder,
                        invalid_argument("messages: this model ships no tokenizer; send token "
                                         "ids to /v1/completions"));
    }
    // Tokenised here: a template writes its own BOS, the fixed format does not.
    std::optional<std::vector<int32_t>> ids =
        encode(*rendered, chat_prompter_.adds_bos(), longest_prompt);
    if (!ids) return too_long(at_least_the_limit);
    prompts.emplace_back(std::move(*ids));
  } else {
    Result<CompletionRequest> parsed = parse_completion_request(request.body, config_.limits);
    if (!parsed.is_ok()) return send_error(*responder, parsed.status());
    model = parsed->model;
    sampling = parsed->sampling;
    prompts = std::move(parsed->prompts);
  }
  if (!model.empty() && model != config_.served_model) {
    return send_error(*responder, not_found("The model `" + model + "` does not exist."));
  }
  const char* prompt_field = chat ? "messages" : "prompt";
  std::vector<std::vector<int32_t>> token_prompts;
  std::vector<std::string> echoes;  // with echo: each prompt's text
  int64_t prompt_tokens = 0;
  for (Prompt& prompt : prompts) {
    std::vector<int32_t> ids;
    if (auto* text = std::get_if<std::string>(&prompt)) {
      if (tokenizer_ == nullptr) {
        return send_error(
            *responder, invalid_argument("prompt: this model ships no tokenizer; send token ids"));
      }
      std::optional<std::vector<int32_t>> encoded = encode(*text, /*add_bos=*/true, longest_prompt);
      if (!encoded) return too_long(at_least_the_limit);
      ids = std::move(*encoded);
      if (sampling.echo) echoes.push_back(*text);
    } else {
      ids = std::move(std::get<std::vector<int32_t>>(prompt));
      if (sampling.echo && tokenizer_ == nullptr) {
        return send_error(*responder,
                          invalid_argument("echo: this model ships no tokenizer to show the "
                                           "prompt's tokens as text"));
      }
      if (sampling.echo && !ids.empty()) echoes.push_back(tokenizer_->decode(ids));
    }
    if (ids.empty())
      return send_error(*responder, invalid_argument(std::string(prompt_field) + ": is empty"));
    if (Status in_vocabulary = check_vocabulary(ids, "Token id"); !in_vocabulary.is_ok()) {
      return send_error(*responder, in_vocabulary);
    }
    int64_t length = int64_t(ids.size());
    if (length >= config_.max_model_len) return too_long(std::to_string(length));
    if (length + sampling.max_tokens > config_.max_model_len) {
      return send_error(
          *responder,
          invalid_argument(
              "This model's maximum context length is " + std::to_string(config_.max_model_len) +
              " tokens. However, you requested " + std::to_string(length + sampling.max_tokens) +
              " tokens (" + std::to_string(length) + " in the messages, " +
              std::to_string(sampling.max_tokens) +
              " in the completion). Please reduce the length of the messages or completion."));
    }
    prompt_tokens += length;
    token_prompts.push_back(std::move(ids));
  }

  // Each prompt's samples are requests of their own: more than the router
  // holds at once could never be admitted, so retrying (429) would not help.
  const int64_t generations = int64_t(token_prompts.size()) * sampling.best_of;
  if (generations > int64_t(core_.max_queued_requests())) {
    return send_error(*responder,
                      invalid_argument("the request asks for " + std::to_string(generations) +
                                       " generations (prompts times best_of or n); the router "
                                       "holds at most " +
                                       std::to_string(core_.max_queued_requests()) +
                                       " at once (router.max_queued_requests)"));
  }

  // Every position's log-probabilities wait in the router until the reply
  // is built (and sent, when not streamed): bounded, so that one request
  // cannot take gigabytes of the router's memory.
  if (sampling.want_logprobs || sampling.best_of > sampling.n) {
    const int64_t per_position = 1 + std::max(sampling.logprobs, 1);
    int64_t held = 0;
    for (const std::vector<int32_t>& ids : token_prompts) {
      const int64_t scored_prompt =
          sampling.echo && sampling.want_logprobs ? int64_t(ids.size()) : 0;
      held += int64_t(sampling.best_of) * (scored_prompt + sampling.max_tokens) * per_position;
    }
    if (held > config_.limits.max_reply_logprobs) {
      return send_error(
          *responder,
          invalid_argument(
              "the request could hold " + std::to_string(held) +
              " log-probabilities (generations x positions x (1 + max(logprobs, 1))); the "
              "router holds at most " +
              std::to_string(config_.limits.max_reply_logprobs) +
              " for one request (router.limits.max_reply_logprobs): ask for fewer "
              "choices, tokens or logprobs"));
    }
  }

  std::vector<int32_t> biased;
  for (const auto& [id, bias] : sampling.logit_bias) biased.push_back(id);
  if (Status in_vocabulary = check_vocabulary(biased, "logit_bias: token id");
      !in_vocabulary.is_ok()) {
    return send_error(*responder, in_vocabulary);
  }
  // A stop token the model cannot generate would never stop anything.
  if (Status in_vocabulary = check_vocabulary(sampling.stop_token_ids, "stop_token_ids: token id");
      !in_vocabulary.is_ok()) {
    return send_error(*responder, in_vocabulary);
  }

  // Echo with logprobs scores every prompt token with its alternatives, all
  // in the node's one answer: a frame past the control codec's bounds would
  // be refused on its way back, and the request left to its timeout.
  if (sampling.echo && sampling.want_logprobs) {
    const size_t most = control::max_prompt_logprob_tokens(size_t(std::max(sampling.logprobs, 1)));
    for (const std::vector<int32_t>& ids : token_prompts) {
      if (ids.size() > most) {
        return send_error(
            *responder,
            invalid_argument("echo with logprobs " + std::to_string(sampling.logprobs) +
                             " scores at most " + std::to_string(most) +
                             " prompt tokens; this prompt has " + std::to_string(ids.size())));
      }
    }
  }

  ExchangeSpec spec;
  spec.endpoint = chat ? Endpoint::kChatCompletions : Endpoint::kCompletions;
  // The HTTP front end's X-Request-Id (the client's, or made there), as
  // vLLM names its responses; over ZeroMQ, a number of the router's.
  const std::string x_request_id = request.header("x-request-id");
  spec.id =
      (chat ? "chatcmpl-" : "cmpl-") +
      (x_request_id.empty() ? std::to_string(unix_seconds()) + "-" + std::to_string(next_id_++)
                            : x_request_id);
  spec.model = config_.served_model;
  spec.created = unix_seconds();
  spec.stream = sampling.stream;
  spec.include_usage = sampling.include_usage;
  spec.stop = sampling.stop;
  spec.prompt_tokens = prompt_tokens;
  spec.n = sampling.n;
  spec.best_of = sampling.best_of;
  spec.logprobs = sampling.want_logprobs;
  spec.top_logprobs = sampling.logprobs;
  spec.tokens_as_ids = sampling.tokens_as_ids;
  spec.echoes = std::move(echoes);
  spec.arrival = arrival;

  // Choice index = prompt index * best_of + sample index; sample j of a
  // seeded request uses seed + j, so the same seed gives the same choices.
  // With best_of above n, every sample's log-probabilities come back, to
  // rank them (CompletionExchange).
  std::vector<GenerationRequest> choices;
  std::random_device entropy;
  for (const std::vector<int32_t>& ids : token_prompts) {
    // The samples of one prompt go where the first left the prompt's KV;
    // not where each scores the prompt (echo with logprobs), which computes
    // it whole, past the prefix cache.
    const bool scores_prompt = sampling.echo && sampling.want_logprobs;
    const uint64_t group = sampling.best_of > 1 && !scores_prompt ? next_prompt_group_++ : 0;
    for (int32_t j = 0; j < sampling.best_of; ++j) {
      GenerationRequest choice;
      choice.prompt = ids;
      choice.prompt_group = group;
      choice.client_id = client_id_for_logs(x_request_id.empty() ? spec.id : x_request_id);
      control::SamplingSpec& s = choice.sampling;
      s.temperature = sampling.temperature;
      s.top_p = sampling.top_p;
      s.top_k = sampling.top_k;
      s.seed =
          sampling.seed ? *sampling.seed + uint64_t(j) : (uint64_t(entropy()) << 32 | entropy());
      s.max_tokens = sampling.max_tokens;
      s.stop_token_ids = sampling.stop_token_ids;
      s.ignore_eos = sampling.ignore_eos;
      // The nodes send a token's log-probability with its alternatives
      // (at least one, trimmed to what was asked for in the reply).
      s.logprobs = sampling.want_logprobs || sampling.best_of > sampling.n
                       ? std::max(sampling.logprobs, 1)
                       : 0;
      s.min_p = sampling.min_p;
      s.presence_penalty = sampling.presence_penalty;
      s.frequency_penalty = sampling.frequency_penalty;
      s.repetition_penalty = sampling.repetition_penalty;
      s.min_tokens = sampling.min_tokens;
      // echo with logprobs: the prompt's tokens come first, scored too.
      if (sampling.echo && sampling.want_logprobs) s.prompt_logprobs = sampling.logprobs;
      for (const auto& [id, bias] : sampling.logit_bias) {
        s.logit_bias_ids.push_back(id);
        s.logit_bias_values.push_back(bias);
      }
      choices.push_back(std::move(choice));
    }
  }
  auto exchange = std::make_shared<CompletionExchange>(std::move(spec), std::move(responder), core_,
                                                       tokenizer_, metrics_, workers_);
  exchange->start(std::move(choices));
}

}  // namespace baton::router
