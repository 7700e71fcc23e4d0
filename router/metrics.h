// router/metrics.h — the router's Prometheus metrics, with vLLM's names.
//
// Counters and histograms are updated from any thread (atomics and one mutex
// per histogram); render() writes the Prometheus text exposition format,
// adding gauges from the latest cluster snapshot.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "router/router_core.h"

namespace baton::router {

class Histogram {
 public:
  Histogram(std::string name, std::string help, std::vector<double> bounds);
  void observe(double value);
  void render(std::string* out, std::string_view labels) const;

 private:
  std::string name_;
  std::string help_;
  std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;  // one per bound, plus +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class RouterMetrics {
 public:
  explicit RouterMetrics(std::string model_name);

  void observe_ttft(double seconds) { ttft_.observe(seconds); }
  void observe_itl(double seconds) { itl_.observe(seconds); }
  void observe_e2e(double seconds) { e2e_.observe(seconds); }
  // One finished request (choice): its token counts, and the seconds from
  // its first token to its last, as vLLM's per-request histograms take them;
  // with its prefill seconds (>= 0), their sum as the inference time.
  void observe_request(int64_t prompt_tokens, int64_t generation_tokens, double decode_seconds,
                       double prefill_seconds = -1);
  // A request's first tokens: the seconds its prompt waited in the queue of
  // the node that computed it, and took there to its first token.
  void observe_queue_and_prefill(double queue_seconds, double prefill_seconds);
  void count_tokens(int64_t prompt, int64_t generation);
  void count_finished(FinishReason finish_reason);
  // A reply sent (HTTP or ZeroMQ), by its status: 1xx-3xx count as 2xx.
  void count_http(int status);

  std::string render(const ClusterSnapshot& snapshot) const;

 private:
  std::string model_name_;
  std::string labels_;  // model_name="..."
  Histogram ttft_;
  Histogram itl_;
  Histogram e2e_;
  Histogram prompt_tokens_per_request_;
  Histogram generation_tokens_per_request_;
  Histogram queue_time_;
  Histogram prefill_time_;
  Histogram decode_time_;
  Histogram inference_time_;
  Histogram time_per_output_token_;
  std::atomic<int64_t> prompt_tokens_{0};
  std::atomic<int64_t> generation_tokens_{0};
  std::array<std::atomic<int64_t>, 4> finished_{};  // stop, length, abort, error
  std::atomic<int64_t> http_2xx_{0}, http_4xx_{0}, http_5xx_{0};
};

}  // namespace baton::router
