// router/completion_request.h — OpenAI-compatible request bodies, validated.
//
// `POST /v1/completions` and `POST /v1/chat/completions` bodies are parsed
// into typed structs with the fields vLLM accepts; any invalid field is an
// InvalidArgument Status whose message names the field, which the HTTP layer
// turns into a 400 with a JSON error. Nothing here tokenises or routes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/request_limits.h"
#include "common/status.h"

namespace baton::router {

// Fields shared by completions and chat completions.
struct SamplingFields {
  int32_t max_tokens = 16;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;  // 0: disabled (vLLM's -1 is accepted and means the same)
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int32_t n = 1;
  // Samples generated per prompt, of which the n of highest cumulative
  // log-probability are returned (vLLM's best_of); at least n.
  int32_t best_of = 1;
  bool echo = false;  // completions: the prompt's text before each choice's
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Log-probabilities asked for (completions' `logprobs` given, chat's
  // `logprobs: true`), with `logprobs` alternatives to each token (0: the
  // token's own only).
  bool want_logprobs = false;
  int32_t logprobs = 0;
  // vLLM's return_tokens_as_token_ids: tokens in log-probs are named
  // "token_id:ID", for clients that must tell apart tokens of the same text.
  bool tokens_as_ids = false;
  // vLLM's sampling extras (kernels/cpu/sampling.h).
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  int32_t min_tokens = 0;
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id, bias
};

// A prompt is text (tokenised by the router) or token ids.
using Prompt = std::variant<std::string, std::vector<int32_t>>;

struct CompletionRequest {
  std::string model;
  std::vector<Prompt> prompts;  // one, or a batch
  SamplingFields sampling;
};

struct ChatMessage {
  std::string role;  // system (or developer), user, assistant, tool
  std::string content;
};

struct ChatRequest {
  std::string model;
  std::vector<ChatMessage> messages;
  // The conversation as a checkpoint's chat template sees it: each message
  // as sent (key order kept; tool_calls, tool_call_id, name and any other
  // keys too), its content flattened to a string (null stays null for an
  // assistant's tool calls), "developer" as "system", and each tool call's
  // JSON "arguments" string parsed into an object, as vLLM hands it over.
  nlohmann::ordered_json template_messages = nlohmann::ordered_json::array();
  // "tools": the function definitions, null without.
  nlohmann::ordered_json tools;
  bool add_generation_prompt = true;
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  SamplingFields sampling;
};

// The deepest nesting of lists and objects a request body may have; the
// OpenAI shapes need 4 (a chat message's content parts).
inline constexpr int kMaxJsonDepth = 32;
// The most members one object of a request body may have (logit_bias has at
// most 300): chat bodies are parsed again with their keys in order, which
// costs the square of an object's width.
inline constexpr size_t kMaxJsonObjectMembers = 1024;
// The most lists and objects a request body may hold, and as many again in
// the tool-call arguments of a chat's messages (strings, parsed for the
// template): a conversation's messages, content parts and tools need far
// fewer; 8 MiB of "{}," would parse to half a gigabyte, and a chat body is
// held parsed several times over.
inline constexpr size_t kMaxJsonContainers = 65536;
// The longest stop string: a request holds its strings (and automata of
// about 6 bytes a byte) for its whole life, and a streamed reply holds back
// up to the longest one's length.
inline constexpr size_t kMaxStopStringBytes = 4096;

using baton::RequestLimits;  // common/request_limits.h

// POST /tokenize in vLLM's shape: {"prompt": "text"} or {"messages": [...]}
// (rendered with the chat format, with "tools", "add_generation_prompt" and
// "chat_template_kwargs" as for chat), "add_special_tokens" (whether the
// tokenizer's BOS goes first; by default for a prompt, and for messages
// only where the chat format does not write its own).
struct TokenizeRequest {
  std::string model;
  std::string text;
  std::optional<ChatRequest> chat;
  std::optional<bool> add_special_tokens;
};
Result<TokenizeRequest> parse_tokenize_request(std::string_view body);

// POST /detokenize in vLLM's shape: {"tokens": [ids]}.
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
Result<DetokenizeRequest> parse_detokenize_request(std::string_view body);

Result<CompletionRequest> parse_completion_request(std::string_view body,
                                                   const RequestLimits& limits = {});
Result<ChatRequest> parse_chat_request(std::string_view body, const RequestLimits& limits = {});

}  // namespace baton::router
