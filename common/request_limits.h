// common/request_limits.h — the bounds the router puts on a client's
// request: the cluster YAML sets them (router.limits,
// router.max_request_body_bytes), the router's parsers apply them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace baton {

// The largest request body either front end takes (HTTP and ZeroMQ alike).
inline constexpr size_t kMaxRequestBodyBytes = 8u << 20;

// Limits the router applies while parsing a request.
struct RequestLimits {
  int32_t max_n = 16;
  int32_t max_batch = 256;
  int32_t max_logprobs = 20;
  int32_t max_stop_strings = 16;
  // The log-probabilities one request may make the router hold until its
  // reply is built: generations x positions x (1 + max(logprobs, 1)),
  // streamed or not (each takes some 90 bytes at the peak of building the
  // reply).
  int64_t max_reply_logprobs = 2'000'000;
  // The checkpoint's generation_config.json defaults, for the sampling
  // fields a request leaves out (else vLLM's: temperature 1, top_p 1, top_k off).
  std::optional<float> default_temperature;
  std::optional<float> default_top_p;
  std::optional<int32_t> default_top_k;
};

}  // namespace baton
