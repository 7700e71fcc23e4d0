// router/openai_response.h — response bodies and SSE events of the
// OpenAI-compatible API, in the shapes the `openai` client parses.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/finish_reason.h"

namespace baton::router {

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  // Of prompt_tokens, those a node's prefix cache held
  // (prompt_tokens_details.cached_tokens, as OpenAI and vLLM report it).
  int64_t cached_tokens = 0;
  nlohmann::json to_json() const;
};

// One finished choice of a non-streaming response.
struct Choice {
  int32_t index = 0;
  std::string text;
  FinishReason finish_reason = FinishReason::kNone;
};

enum class Endpoint { kCompletions, kChatCompletions };

// The whole body of a non-streaming response.
nlohmann::json completion_response(Endpoint endpoint, std::string_view id, std::string_view model,
                                   int64_t created, const std::vector<Choice>& choices,
                                   const Usage& usage);

// One streamed delta. finish_reason kNone: null (more to come).
nlohmann::json stream_chunk(Endpoint endpoint, std::string_view id, std::string_view model,
                            int64_t created, int32_t index, std::string_view delta_text,
                            FinishReason finish_reason, bool first_chat_chunk);

// The final usage chunk of a stream with stream_options.include_usage.
nlohmann::json usage_chunk(Endpoint endpoint, std::string_view id, std::string_view model,
                           int64_t created, const Usage& usage);

// "data: {json}\n\n" and the terminating "data: [DONE]\n\n".
std::string sse_event(const nlohmann::json& payload);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace baton::router
