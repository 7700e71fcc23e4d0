// tools/loadtest/report.h — what a `baton bench` run was and what it
// measured: the table `vllm bench serve` prints (same labels), the breakdown
// per prefill and decode node (from the router's `served_by`), and the
// goodput service-level objectives.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "tools/loadtest/serving_stats.h"

namespace baton::loadtest {

// The settings of a run, saved with its result.
struct BenchConfig {
  std::string backend = "http";
  std::string endpoint = "/v1/completions";
  std::string model;
  std::string dataset = "random";
  int64_t num_prompts = 0;  // of the whole run (all shards)
  double request_rate = 0;  // +inf: all at once
  double burstiness = 1.0;
  int64_t max_concurrency = 0;  // 0: none
  uint64_t seed = 0;
  std::string shard;  // "i/N", empty when not sharded
  Slo slo;
  // The percentiles the report and the saved result give besides the
  // median (vLLM's --metric-percentiles).
  std::vector<double> metric_percentiles{99.0};
};

struct BenchResult {
  BenchConfig config;
  double started_at_unix = 0;  // wall clock, seconds since 1970
  double duration_s = 0;
  std::vector<RequestRecord> records;

  ServingSummary summary() const { return summarize(records, duration_s, config.slo); }
};

// `--goodput ttft:MS tpot:MS e2el:MS` (any subset, each at most once).
Result<Slo> parse_goodput(const std::vector<std::string>& items);

// One node's share: the requests it prefilled (role "prefill"; node
// kPrefilledOnDecode for those the decode node prefilled itself) or decoded.
inline constexpr const char* kPrefilledOnDecode = "(on decode node)";
struct NodeShare {
  std::string role, node;
  ServingSummary summary;  // throughput over the whole run's duration
};
std::vector<NodeShare> per_node(const BenchResult& result);

// Which percentile sections the table shows: "ttft,tpot,itl" by default, as
// vLLM's --percentile-metrics; "e2el" adds end-to-end latency.
Result<std::vector<std::string>> parse_percentile_metrics(const std::string& list);
// `--metric-percentiles 25,50,99.9`: numbers in (0, 100], as vLLM takes them.
Result<std::vector<double>> parse_metric_percentiles(const std::string& list);
// A percentile's name as vLLM writes it: "99" for 99.0, "99.9" for 99.9.
std::string percentile_word(double pct);

// The whole report: vLLM's table, the per-node breakdown and the most common
// errors of failed requests.
void print_report(std::FILE* out, const BenchResult& result,
                  const std::vector<std::string>& percentile_metrics);

}  // namespace baton::loadtest
