// router/api_error.h — errors as the OpenAI-compatible API returns them.
//
// vLLM's shape: {"error": {"message", "type", "param", "code"}} with the HTTP
// status as `code`. Library code returns Status; the HTTP layer maps it here.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace baton::router {

struct ApiError {
  int http_status = 400;
  std::string type = "BadRequestError";
  std::string message;
  std::string param;  // empty: null

  nlohmann::json to_json() const;
};

// InvalidArgument/OutOfRange -> 400, NotFound -> 404, ResourceExhausted -> 429,
// Unavailable -> 503, DeadlineExceeded -> 504, anything else -> 500.
ApiError api_error_from_status(const Status& status);

}  // namespace baton::router
