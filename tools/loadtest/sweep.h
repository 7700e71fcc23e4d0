// tools/loadtest/sweep.h — `baton bench sweep`: one run per request rate,
// saved together as {"label": ..., "runs": [result, ...]} (each run a
// `--save-result` object), and read back as a series of the chart.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "tools/loadtest/serving_stats.h"
#include "tools/loadtest/svg_chart.h"

namespace baton::loadtest {

// "1,2,4,8": positive finite rates, increasing.
Result<std::vector<double>> parse_rates(const std::string& list);

// A point from one run's result JSON (vLLM's keys).
Result<SweepPoint> sweep_point(const nlohmann::json& result, const std::string& name);
nlohmann::json sweep_json(const std::string& label, const std::vector<nlohmann::json>& runs);
// A saved sweep; `name` prefixes errors. With `regrade`, goodput is computed
// again under those objectives from the runs' per-request detail (saved with
// --save-detailed), so sweeps run with other objectives compare.
Result<SweepSeries> sweep_series(const nlohmann::json& sweep, const std::string& name,
                                 const Slo* regrade = nullptr);

// One line per rate: throughput and the latency percentiles.
void print_sweep_table(std::FILE* out, const SweepSeries& series);

}  // namespace baton::loadtest
