// tools/http_client.h — a small blocking HTTP/1.1 client (Boost.Beast) for
// `baton up`'s readiness checks, `baton bench` and tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace baton::tools {

struct HttpResponse {
  int status = 0;
  std::string body;
  std::string content_type;
  std::string retry_after;
  std::string allow;  // a 405's methods
};

// One request on a fresh connection. Unavailable when the server cannot be
// reached; DeadlineExceeded past `timeout`. A non-empty `api_key` goes as
// `Authorization: Bearer`.
Result<HttpResponse> http_request(const std::string& host, uint16_t port, std::string_view method,
                                  std::string_view target, std::string_view body = {},
                                  std::chrono::milliseconds timeout = std::chrono::seconds(30),
                                  std::string_view api_key = {});

// Streams a response: `on_data` gets body bytes as soon as they arrive (each
// read, so SSE events keep their arrival times),
// and may return false to hang up early. The returned response has the status
// and headers (body empty).
Result<HttpResponse> http_stream(const std::string& host, uint16_t port, std::string_view target,
                                 std::string_view body,
                                 const std::function<bool(std::string_view)>& on_data,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(300),
                                 std::string_view api_key = {});

}  // namespace baton::tools
