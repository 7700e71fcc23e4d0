// tools/loadtest/serving_stats.h — the serving metrics `baton bench` reports,
// computed the way `vllm bench serve` computes them, from per-request
// client-side timings.
//
//   TTFT  first streamed token - request sent
//   E2EL  last token - request sent
//   TPOT  (E2EL - TTFT) / (output tokens - 1); undefined for one-token outputs,
//         which are left out of the TPOT statistics (and count as 0 for goodput)
//   ITL   every gap between consecutive streamed tokens, over all requests
// Percentiles interpolate linearly between order statistics (numpy's default).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace baton::loadtest {

struct RequestRecord {
  bool success = false;
  std::string error;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  double ttft_s = 0;          // seconds
  double e2el_s = 0;          // seconds
  std::vector<double> itl_s;  // inter-token gaps, seconds
  double start_s = 0;         // when it was sent, seconds from the start of the run
  // Which nodes served it (the router's `served_by`); prefill empty: the
  // decode node prefilled it itself.
  std::string prefill_node, decode_node;
};

struct Distribution {
  double mean = 0, median = 0, p99 = 0, stddev = 0;
  int64_t count = 0;
  std::vector<double> sorted_ms;  // every value, ascending
  // Any percentile (0..100) of the values, as percentile() computes it.
  double percentile_ms(double pct) const;
};

// Service-level objectives for goodput, in milliseconds; unset = not checked.
struct Slo {
  std::optional<double> ttft_ms{}, tpot_ms{}, e2el_ms{};
  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
};

struct ServingSummary {
  int64_t completed = 0, failed = 0;
  double duration_s = 0;
  int64_t total_input_tokens = 0, total_output_tokens = 0;
  double request_throughput = 0;          // completed / s
  double output_throughput = 0;           // output tokens / s
  double total_token_throughput = 0;      // (input + output) tokens / s
  std::optional<double> request_goodput;  // requests meeting every SLO / s
  Distribution ttft_ms, tpot_ms, itl_ms, e2el_ms;
};

// Linear-interpolation percentile (0..100) of unsorted values; 0 when empty.
double percentile(std::vector<double> values, double pct);
Distribution distribution_ms(const std::vector<double>& seconds);

// TPOT of one request in seconds, or nullopt for fewer than two output tokens.
std::optional<double> request_tpot_s(const RequestRecord& r);

ServingSummary summarize(const std::vector<RequestRecord>& records, double duration_s,
                         const Slo& slo = {});

}  // namespace baton::loadtest
