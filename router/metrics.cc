// router/metrics.cc — Prometheus text exposition.
#include "router/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace baton::router {
namespace {

// vLLM's bucket boundaries for the same histograms.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
                                          0.1,   0.25,  0.5,  0.75, 1.0,  2.5,  5.0,
                                          7.5,   10.0,  20.0, 40.0, 80.0};
const std::vector<double> kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                         0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kE2eBuckets = {0.3,  0.5,   0.8,   1.0,   1.5,  2.0,  2.5,
                                         5.0,  10.0,  15.0,  20.0,  30.0, 40.0, 50.0,
                                         60.0, 120.0, 240.0, 480.0, 960.0};
// vllm:request_success_total's finished_reason labels, one counter each.
constexpr FinishReason kFinishReasons[] = {FinishReason::kStop, FinishReason::kLength,
                                           FinishReason::kAborted, FinishReason::kError};
// vLLM's request-length buckets: 1, 2, 5, 10, 20, 50, ... up to a million.
const std::vector<double> kTokenCountBuckets = [] {
  std::vector<double> b;
  for (double decade = 1; decade <= 1e6; decade *= 10) {
    for (double m : {1.0, 2.0, 5.0}) b.push_back(m * decade);
  }
  return b;
}();
const std::vector<double> kTpotBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                          0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};

// A label value as the text format wants it: backslash, quote and newline
// escaped (a node's heartbeat says what its transfer paths are called).
std::string label_value(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void append_metric(std::string* out, std::string_view name, std::string_view type,
                   std::string_view help, std::string_view labels, double value) {
  fmt::format_to(std::back_inserter(*out), "# HELP {} {}\n# TYPE {} {}\n{}{{{}}} {}\n", name, help,
                 name, type, name, labels, value);
}

}  // namespace

Histogram::Histogram(std::string name, std::string help, std::vector<double> bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      bounds_(std::move(bounds)),
      counts_(bounds_.size() + 1) {}

void Histogram::observe(double value) {
  size_t bucket = 0;
  while (bucket < bounds_.size() && value > bounds_[bucket]) ++bucket;
  std::lock_guard lock(mutex_);
  counts_[bucket]++;
  sum_ += value;
  count_++;
}

void Histogram::render(std::string* out, std::string_view labels) const {
  std::lock_guard lock(mutex_);
  auto it = std::back_inserter(*out);
  fmt::format_to(it, "# HELP {} {}\n# TYPE {} histogram\n", name_, help_, name_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    fmt::format_to(it, "{}_bucket{{{},le=\"{}\"}} {}\n", name_, labels, bounds_[i], cumulative);
  }
  cumulative += counts_.back();
  fmt::format_to(it, "{}_bucket{{{},le=\"+Inf\"}} {}\n", name_, labels, cumulative);
  fmt::format_to(it, "{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name_, labels, sum_, name_, labels,
                 count_);
}

RouterMetrics::RouterMetrics(std::string model_name)
    : model_name_(std::move(model_name)),
      labels_("model_name=\"" + model_name_ + "\""),
      ttft_("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            kTtftBuckets),
      itl_("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
           kItlBuckets),
      e2e_("vllm:e2e_request_latency_seconds",
           "Histogram of end to end request latency in seconds.", kE2eBuckets),
      prompt_tokens_per_request_("vllm:request_prompt_tokens",
                                 "Number of prefill tokens processed.", kTokenCountBuckets),
      generation_tokens_per_request_("vllm:request_generation_tokens",
                                     "Number of generation tokens processed.", kTokenCountBuckets),
      queue_time_("vllm:request_queue_time_seconds",
                  "Histogram of time spent in WAITING phase for request.", kE2eBuckets),
      prefill_time_("vllm:request_prefill_time_seconds",
                    "Histogram of time spent in PREFILL phase for request.", kE2eBuckets),
      decode_time_("vllm:request_decode_time_seconds",
                   "Histogram of time spent in DECODE phase for request.", kE2eBuckets),
      inference_time_("vllm:request_inference_time_seconds",
                      "Histogram of time spent in RUNNING phase for request.", kE2eBuckets),
      time_per_output_token_("vllm:time_per_output_token_seconds",
                             "Histogram of time per output token in seconds.", kTpotBuckets) {}

void RouterMetrics::observe_request(int64_t prompt_tokens, int64_t generation_tokens,
                                    double decode_seconds, double prefill_seconds) {
  prompt_tokens_per_request_.observe(double(prompt_tokens));
  generation_tokens_per_request_.observe(double(generation_tokens));
  if (generation_tokens > 0) decode_time_.observe(decode_seconds);
  if (generation_tokens > 0 && prefill_seconds >= 0)
    inference_time_.observe(prefill_seconds + decode_seconds);
  if (generation_tokens > 1) {
    time_per_output_token_.observe(decode_seconds / double(generation_tokens - 1));
  }
}

void RouterMetrics::observe_queue_and_prefill(double queue_seconds, double prefill_seconds) {
  queue_time_.observe(std::max(0.0, queue_seconds));
  prefill_time_.observe(std::max(0.0, prefill_seconds));
}

void RouterMetrics::count_tokens(int64_t prompt, int64_t generation) {
  prompt_tokens_ += prompt;
  generation_tokens_ += generation;
}

void RouterMetrics::count_finished(FinishReason finish_reason) {
  for (size_t i = 0; i < std::size(kFinishReasons); ++i) {
    if (kFinishReasons[i] == finish_reason) finished_[i]++;
  }
}

void RouterMetrics::count_http(int status) {
  if (status < 400) {
    http_2xx_++;
  } else if (status < 500) {
    http_4xx_++;
  } else {
    http_5xx_++;
  }
}

std::string RouterMetrics::render(const ClusterSnapshot& snapshot) const {
  int64_t running = 0, waiting = 0, free_blocks = 0, total_blocks = 0;
  int64_t cache_queries = 0, cache_hits = 0, cache_ssd_hits = 0, preemptions = 0;
  for (const NodeState& node : snapshot.nodes) {
    // Each node's count since it started (a restart starts it again, which
    // Prometheus reads as a counter reset).
    preemptions += node.load.preemptions;
    // Every node's prefix cache, over its whole life (NodeState keeps
    // them growing across restarts), up or down.
    cache_queries += node.prefix_cache_queries;
    cache_hits += node.prefix_cache_hits;
    cache_ssd_hits += node.prefix_cache_ssd_hits;
    if (!node.up || node.role != Role::kDecode) continue;
    running += node.load.running;
    waiting += node.load.waiting + node.load.awaiting_kv;
    free_blocks += node.load.free_blocks;
    total_blocks += node.load.total_blocks;
  }
  double usage = total_blocks > 0 ? 1.0 - double(free_blocks) / double(total_blocks) : 0.0;
  std::string out;
  append_metric(&out, "vllm:num_requests_running", "gauge",
                "Number of requests in model execution batches.", labels_, double(running));
  append_metric(&out, "vllm:num_requests_waiting", "gauge",
                "Number of requests waiting to be processed.", labels_, double(waiting));
  append_metric(&out, "vllm:kv_cache_usage_perc", "gauge",
                "KV-cache usage of the decode nodes. 1 means 100 percent.", labels_, usage);
  // The name older vLLM versions (and dashboards built on them) use.
  append_metric(&out, "vllm:gpu_cache_usage_perc", "gauge",
                "KV-cache usage of the decode nodes. 1 means 100 percent.", labels_, usage);
  append_metric(&out, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                labels_, double(prompt_tokens_.load()));
  append_metric(&out, "vllm:generation_tokens_total", "counter",
                "Number of generation tokens processed.", labels_,
                double(generation_tokens_.load()));
  append_metric(&out, "vllm:num_preemptions_total", "counter",
                "Cumulative number of preemption from the engine.", labels_, double(preemptions));
  append_metric(&out, "vllm:prefix_cache_queries_total", "counter",
                "Prefix cache queries, in terms of number of queried tokens.", labels_,
                double(cache_queries));
  append_metric(&out, "vllm:prefix_cache_hits_total", "counter",
                "Prefix cache hits, in terms of number of cached tokens.", labels_,
                double(cache_hits));
  append_metric(&out, "baton:prefix_cache_ssd_hits_total", "counter",
                "Of the prefix cache hits, tokens read back from the SSD tier.", labels_,
                double(cache_ssd_hits));
  out += "# HELP vllm:request_success_total Count of finished requests by finish reason.\n";
  out += "# TYPE vllm:request_success_total counter\n";
  for (size_t i = 0; i < std::size(kFinishReasons); ++i) {
    fmt::format_to(std::back_inserter(out),
                   "vllm:request_success_total{{{},finished_reason=\"{}\"}} {}\n", labels_,
                   finish_reason_name(kFinishReasons[i]), finished_[i].load());
  }
  ttft_.render(&out, labels_);
  itl_.render(&out, labels_);
  e2e_.render(&out, labels_);
  prompt_tokens_per_request_.render(&out, labels_);
  generation_tokens_per_request_.render(&out, labels_);
  queue_time_.render(&out, labels_);
  prefill_time_.render(&out, labels_);
  decode_time_.render(&out, labels_);
  inference_time_.render(&out, labels_);
  time_per_output_token_.render(&out, labels_);
  out += "# HELP baton:http_responses_total Replies sent over HTTP and ZeroMQ, by status class.\n";
  out += "# TYPE baton:http_responses_total counter\n";
  fmt::format_to(std::back_inserter(out), "baton:http_responses_total{{code=\"2xx\"}} {}\n",
                 http_2xx_.load());
  fmt::format_to(std::back_inserter(out), "baton:http_responses_total{{code=\"4xx\"}} {}\n",
                 http_4xx_.load());
  fmt::format_to(std::back_inserter(out), "baton:http_responses_total{{code=\"5xx\"}} {}\n",
                 http_5xx_.load());
  auto per_node = [&](std::string_view name, std::string_view help, auto value_of,
                      std::string_view type = "gauge") {
    fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
    for (const NodeState& node : snapshot.nodes) {
      fmt::format_to(std::back_inserter(out), "{}{{node=\"{}\",role=\"{}\"}} {}\n", name, node.name,
                     role_name(node.role), value_of(node));
    }
  };
  // vLLM's cache_config_info: the KV settings as labels of a constant 1.
  for (const NodeState& node : snapshot.nodes) {
    if (node.kv_dtype.empty()) continue;
    fmt::format_to(std::back_inserter(out),
                   "# HELP vllm:cache_config_info Information of the KV cache config.\n"
                   "# TYPE vllm:cache_config_info gauge\n"
                   "vllm:cache_config_info{{block_size=\"{}\",cache_dtype=\"{}\"}} 1\n",
                   node.block_size, node.kv_dtype);
    break;
  }
  per_node("baton:node_up", "Whether a node is registered and heartbeating.",
           [](const NodeState& node) { return node.up ? 1 : 0; });
  per_node(
      "baton:node_down_total",
      "Times the router declared a node down (heartbeats missed, its process restarted, ...).",
      [](const NodeState& node) { return node.times_down; }, "counter");
  per_node("baton:node_free_kv_blocks", "Free KV blocks of a node.",
           [](const NodeState& node) { return node.load.free_blocks; });
  per_node("baton:node_total_kv_blocks", "KV blocks of a node.",
           [](const NodeState& node) { return node.load.total_blocks; });
  per_node("baton:node_kv_bytes_per_token",
           "KV bytes a token occupies on a node across all layers, scales included.",
           [](const NodeState& node) { return node.kv_bytes_per_token; });
  per_node("baton:node_weights_bytes",
           "Bytes of weights a node holds where it computes (host memory, or its GPU's).",
           [](const NodeState& node) { return node.weights_bytes; });
  per_node("baton:node_kv_pool_bytes",
           "Bytes of a node's KV pool, where it computes (host memory, or its GPU's).",
           [](const NodeState& node) { return node.kv_pool_bytes; });
  per_node("baton:node_workspace_bytes",
           "Bytes of a node's forward-pass scratch, where it computes (host memory, or its "
           "GPU's): the largest step's activations and the kernels' workspaces.",
           [](const NodeState& node) { return node.load.workspace_bytes; });
  per_node("baton:node_ssd_cache_blocks", "KV blocks a node's SSD tier holds.",
           [](const NodeState& node) { return node.load.ssd_cache_blocks; });
  per_node("baton:node_ssd_cache_capacity_blocks",
           "KV blocks a node's SSD tier can hold (0: none).",
           [](const NodeState& node) { return node.load.ssd_cache_capacity; });
  per_node("baton:node_ssd_restoring",
           "Requests of a node whose KV blocks its SSD tier is reading now.",
           [](const NodeState& node) { return node.load.ssd_restoring; });
  per_node("baton:node_kv_staging_slots",
           "Host slots a node's staged KV pool meets the wire through (0: registered in place).",
           [](const NodeState& node) { return node.load.staging_slots; });
  per_node("baton:node_kv_staging_slots_free",
           "Of a node's staging slots, those no KV transfer holds now.",
           [](const NodeState& node) { return node.load.staging_slots_free; });
  per_node(
      "baton:node_kv_staging_waits_total",
      "KV sends of a node that found too few free staging slots and queued for them (a prefill "
      "node holds prompts back instead; many: transfer.staging_blocks is small for the load).",
      [](const NodeState& node) { return node.load.staging_waits; }, "counter");
  // vLLM's *_info style: the path as a label of a constant 1.
  out +=
      "# HELP baton:kv_transfer_path_info How a prefill node's KV reaches each decode node "
      "(the transfer mode over UCX's transports), as its last heartbeat said.\n"
      "# TYPE baton:kv_transfer_path_info gauge\n";
  for (const NodeState& node : snapshot.nodes) {
    if (!node.up) continue;
    for (const auto& [peer, path] : node.kv_paths) {
      fmt::format_to(std::back_inserter(out),
                     "baton:kv_transfer_path_info{{node=\"{}\",peer=\"{}\",path=\"{}\"}} 1\n",
                     label_value(node.name), label_value(peer), label_value(path));
    }
  }
  fmt::format_to(
      std::back_inserter(out),
      "# HELP baton:control_messages_rejected_total Malformed control frames the router dropped.\n"
      "# TYPE baton:control_messages_rejected_total counter\nbaton:control_messages_rejected_total "
      "{}\n",
      snapshot.control_messages_rejected);
  out +=
      "# HELP baton:kv_transfer_blocks_total KV blocks of prompts prefilled on a prefill node: "
      "sent "
      "to the decode node, already cached there, or skipped as past its sliding windows.\n"
      "# TYPE baton:kv_transfer_blocks_total counter\n";
  for (const auto& [route, blocks] :
       {std::pair{"sent", snapshot.kv_blocks_sent}, std::pair{"cached", snapshot.kv_blocks_cached},
        std::pair{"skipped", snapshot.kv_blocks_skipped}}) {
    fmt::format_to(std::back_inserter(out), "baton:kv_transfer_blocks_total{{route=\"{}\"}} {}\n",
                   route, blocks);
  }
  fmt::format_to(std::back_inserter(out),
                 "# HELP baton:prefill_fallbacks_total Prompts whose prefill failed (refused, KV "
                 "not arrived whole, or the prefill node died) and that their decode node "
                 "computed instead.\n# TYPE baton:prefill_fallbacks_total counter\n"
                 "baton:prefill_fallbacks_total {}\n",
                 snapshot.prefill_fallbacks);
  out +=
      "# HELP baton:prompt_placements_total Prompts dispatched, by where they were prefilled: "
      "on a prefill node, or on their decode node (short, no prefill node up, every prefill "
      "node's queue at router.max_prefill_queue_tokens, or another sample of the prompt left "
      "its KV there).\n"
      "# TYPE baton:prompt_placements_total counter\n";
  for (PrefillPlacement placement : kAllPrefillPlacements) {
    const auto it = snapshot.placements.find(placement);
    fmt::format_to(std::back_inserter(out),
                   "baton:prompt_placements_total{{placement=\"{}\"}} {}\n",
                   placement_name(placement), it == snapshot.placements.end() ? 0 : it->second);
  }
  return out;
}

}  // namespace baton::router
