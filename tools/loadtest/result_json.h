// tools/loadtest/result_json.h — a run's result as JSON (`--save-result`),
// with the keys `vllm bench serve` writes (`request_throughput`,
// `output_throughput`, `mean_ttft_ms`, `p99_tpot_ms`, ...) plus Baton's
// `per_node` breakdown; `--save-detailed` adds per-request lists
// (`input_lens`, `output_lens`, `ttfts`, `itls`, `e2els`, `errors`, and
// Baton's `start_times` and `served_by`). Times in the lists are seconds, as
// vLLM saves them.
//
// Merging (`baton bench merge`) reads detailed results of the shards of one
// run and recomputes every statistic over all their requests; the merged
// duration runs from the first shard's start to the last shard's end by the
// hosts' wall clocks, so they should be synchronised (NTP).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "tools/loadtest/report.h"

namespace baton::loadtest {

nlohmann::json result_json(const BenchResult& result, bool detailed);
// A detailed result back; `name` prefixes errors.
Result<BenchResult> result_from_json(const nlohmann::json& doc, const std::string& name);
Result<BenchResult> merge_results(const std::vector<BenchResult>& shards);

Result<nlohmann::json> read_json_file(const std::string& path);
Status write_json_file(const std::string& path, const nlohmann::json& doc);

}  // namespace baton::loadtest
