#include "router/api_error.h"

namespace baton::router {

nlohmann::json ApiError::to_json() const {
  nlohmann::json error = {{"message", message}, {"type", type}, {"code", http_status}};
  error["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
  return {{"error", error}};
}

ApiError api_error_from_status(const Status& status) {
  ApiError e;
  e.message = status.message();
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      e.http_status = 400;
      e.type = "BadRequestError";
      break;
    case StatusCode::kNotFound:
      e.http_status = 404;
      e.type = "NotFoundError";
      break;
    case StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "RateLimitError";
      break;
    case StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "ServiceUnavailableError";
      break;
    case StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      e.type = "TimeoutError";
      break;
    default:
      e.http_status = 500;
      e.type = "InternalServerError";
      break;
  }
  return e;
}

}  // namespace baton::router
