#include "common/finish_reason.h"

namespace baton {

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAborted:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "";
}

std::optional<FinishReason> parse_finish_reason(std::string_view name) {
  for (FinishReason r : {FinishReason::kNone, FinishReason::kStop, FinishReason::kLength,
                         FinishReason::kAborted, FinishReason::kError}) {
    if (finish_reason_name(r) == name) return r;
  }
  return std::nullopt;
}

}  // namespace baton
