#include "router/request_fields.h"

#include <algorithm>
#include <functional>
#include <string_view>

namespace baton::router {
namespace {

using nlohmann::json;

// Implemented (read by completion_request.cc): by both endpoints, then by
// each alone.
// clang-format off
constexpr std::string_view kSharedFields[] = {
    "model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids",
    "ignore_eos", "n", "best_of", "stream", "stream_options", "logprobs", "min_p",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens", "logit_bias",
    "return_tokens_as_token_ids"};
constexpr std::string_view kCompletionFields[] = {"prompt", "echo"};
constexpr std::string_view kChatFields[] = {
    "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
    "add_generation_prompt", "chat_template_kwargs"};
// clang-format on
constexpr std::string_view kInformational[] = {"user", "metadata", "store", "service_tier",
                                               "request_id"};

bool number_is(const json& v, double neutral) {
  return v.is_number() && v.get<double>() == neutral;
}

// Fields accepted at their neutral value only: what that value is, and
// whether `v` is it.
struct NeutralField {
  std::string_view name;
  std::string_view neutral;
  std::function<bool(const json& v)> is_neutral;
  bool chat_only = false;
  bool completions_only = false;
};

const std::vector<NeutralField>& neutral_fields() {
  static const std::vector<NeutralField> fields = {
      {"length_penalty", "1", [](const json& v) { return number_is(v, 1); }},
      {"echo", "false", [](const json& v) { return v == false; }, /*chat_only=*/true},
      {"use_beam_search", "false", [](const json& v) { return v == false; }},
      {"skip_special_tokens", "true", [](const json& v) { return v == true; }},
      {"spaces_between_special_tokens", "true", [](const json& v) { return v == true; }},
      {"include_stop_str_in_output", "false", [](const json& v) { return v == false; }},
      {"response_format", "{\"type\": \"text\"}",
       [](const json& v) {
         return v.is_object() && v.size() == 1 && v.value("type", json()) == "text";
       }},
      {"parallel_tool_calls", "true", [](const json& v) { return v == true; }, true},
      {"continue_final_message", "false", [](const json& v) { return v == false; }, true},
      {"add_special_tokens", "false", [](const json& v) { return v == false; }, true},
      {"add_special_tokens", "true", [](const json& v) { return v == true; }, false, true},
      {"suffix", "\"\"", [](const json& v) { return v == ""; }, false, true},
      {"priority", "0", [](const json& v) { return number_is(v, 0); }},
  };
  return fields;
}

template <size_t N>
bool listed(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

}  // namespace

Status check_request_fields(const json& body, Endpoint endpoint) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  for (const auto& item : body.items()) {
    // Not a structured binding: the lambda below captures the key, which
    // clang before 16 cannot do with bindings.
    const std::string& key = item.key();
    const json& value = item.value();
    if (value.is_null()) continue;
    if (listed(kSharedFields, key)) continue;
    if (chat ? listed(kChatFields, key) : listed(kCompletionFields, key)) continue;
    if (listed(kInformational, key)) continue;
    const auto& neutral = neutral_fields();
    const auto it = std::find_if(neutral.begin(), neutral.end(), [&](const NeutralField& f) {
      return f.name == key && !(chat && f.completions_only) && !(!chat && f.chat_only);
    });
    if (it != neutral.end()) {
      if (it->is_neutral(value)) continue;
      return invalid_argument("'" + key + "' is not implemented by Baton; only " +
                              std::string(it->neutral) + " (asking for nothing) is accepted");
    }
    return invalid_argument("'" + key + "' is not supported by Baton");
  }
  return Status::ok();
}

}  // namespace baton::router
