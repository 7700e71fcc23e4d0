// common/finish_reason.h — why a generation ended, as one type from the
// engine's scheduler through the control messages to the router's answers.
// Strings appear only where it is spelled out: the control codec and the
// OpenAI JSON.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace baton {

enum class FinishReason : uint8_t {
  kNone,     // not finished
  kStop,     // an end-of-sequence or stop token, or a stop string
  kLength,   // max_tokens, or the model's length
  kAborted,  // cancelled: the client went away or the request was ended
  kError,    // failed; the error says why (never set by the engine)
};

// "" (kNone), "stop", "length", "abort", "error": OpenAI's and vLLM's names.
std::string_view finish_reason_name(FinishReason reason);
// The inverse of finish_reason_name; nullopt for any other string.
std::optional<FinishReason> parse_finish_reason(std::string_view name);

}  // namespace baton
