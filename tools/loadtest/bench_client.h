// tools/loadtest/bench_client.h — one load-test client's connection to a
// router: HTTP (a fresh connection per request, SSE) or ZeroMQ (one DEALER
// socket per client, replies told apart by tag; docs/API.md). A client is
// used by one thread at a time; `baton bench` gives each worker its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/curve_keys.h"
#include "common/status.h"
#include "tools/http_client.h"
#include "tools/loadtest/serving_stats.h"

namespace baton::loadtest {

enum class Backend { kHttp, kZmq };
Result<Backend> parse_backend(const std::string& name);  // "http" or "zmq"
const char* backend_name(Backend backend);

struct ServerAddress {
  Backend backend = Backend::kHttp;
  std::string host = "127.0.0.1";
  uint16_t port = 8000;  // the router's http_port, or its zmq_port
  std::chrono::milliseconds timeout = std::chrono::minutes(10);  // per request
  std::string api_key;  // sent as Authorization: Bearer (HTTP) or a fifth frame (ZeroMQ)
  // ZeroMQ over CURVE with the front end's client keys (router.zmq_keys).
  std::optional<control::CurveKeys> zmq_keys;
};

class BenchClient {
 public:
  virtual ~BenchClient() = default;
  // Sends one streamed request to `path` and records it (timings relative to
  // when it was sent; start_s left for the caller). Never fails: errors are
  // recorded as failed requests with their text.
  virtual RequestRecord stream(const std::string& path, const std::string& body,
                               int64_t prompt_len) = 0;
  // A request without a body (/v1/models, /metrics): the status and body.
  virtual Result<tools::HttpResponse> get(const std::string& path) = 0;
};

Result<std::unique_ptr<BenchClient>> connect_client(const ServerAddress& address);

// The served model's name from /v1/models.
Result<std::string> served_model(BenchClient& client);

}  // namespace baton::loadtest
