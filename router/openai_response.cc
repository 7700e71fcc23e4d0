#include "router/openai_response.h"

namespace baton::router {
namespace {

using nlohmann::json;

const char* object_name(Endpoint endpoint, bool chunk) {
  if (endpoint == Endpoint::kCompletions) return "text_completion";
  return chunk ? "chat.completion.chunk" : "chat.completion";
}

json header(Endpoint endpoint, std::string_view id, std::string_view model, int64_t created,
            bool chunk) {
  return {
      {"id", id}, {"object", object_name(endpoint, chunk)}, {"created", created}, {"model", model}};
}

json finish(FinishReason reason) {
  return reason == FinishReason::kNone ? json(nullptr) : json(finish_reason_name(reason));
}

}  // namespace

json Usage::to_json() const {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

json completion_response(Endpoint endpoint, std::string_view id, std::string_view model,
                         int64_t created, const std::vector<Choice>& choices, const Usage& usage) {
  json body = header(endpoint, id, model, created, /*chunk=*/false);
  json list = json::array();
  for (const auto& c : choices) {
    json choice = {
        {"index", c.index}, {"finish_reason", finish(c.finish_reason)}, {"logprobs", nullptr}};
    if (endpoint == Endpoint::kCompletions) {
      choice["text"] = c.text;
    } else {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    }
    list.push_back(std::move(choice));
  }
  body["choices"] = std::move(list);
  body["usage"] = usage.to_json();
  return body;
}

json stream_chunk(Endpoint endpoint, std::string_view id, std::string_view model, int64_t created,
                  int32_t index, std::string_view delta_text, FinishReason finish_reason,
                  bool first_chat_chunk) {
  json body = header(endpoint, id, model, created, /*chunk=*/true);
  json choice = {{"index", index}, {"finish_reason", finish(finish_reason)}, {"logprobs", nullptr}};
  if (endpoint == Endpoint::kCompletions) {
    choice["text"] = delta_text;
  } else {
    json delta = {{"content", delta_text}};
    if (first_chat_chunk) delta["role"] = "assistant";
    choice["delta"] = std::move(delta);
  }
  body["choices"] = json::array({std::move(choice)});
  return body;
}

json usage_chunk(Endpoint endpoint, std::string_view id, std::string_view model, int64_t created,
                 const Usage& usage) {
  json body = header(endpoint, id, model, created, /*chunk=*/true);
  body["choices"] = json::array();
  body["usage"] = usage.to_json();
  return body;
}

std::string sse_event(const json& payload) {
  // dump() escapes control characters, so the event never contains a raw newline.
  return "data: " + payload.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace baton::router
