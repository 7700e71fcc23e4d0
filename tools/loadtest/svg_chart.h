// tools/loadtest/svg_chart.h — the chart `baton bench sweep` draws: TTFT and
// TPOT percentiles (median solid, P99 dashed) and goodput (or, without
// --goodput, request throughput) against the request rate, one colour per
// configuration. Plain SVG 1.1 text, no dependencies, viewable in a browser.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace baton::loadtest {

struct SweepPoint {
  double request_rate = 0;  // what was asked, requests/s
  double median_ttft_ms = 0, p99_ttft_ms = 0;
  double median_tpot_ms = 0, p99_tpot_ms = 0;
  double request_throughput = 0;          // completed/s
  std::optional<double> request_goodput;  // when SLOs were given
};

struct SweepSeries {
  std::string label;  // the configuration, e.g. "disaggregated"
  std::vector<SweepPoint> points;
};

// `subtitle` (may be empty) goes under the title, e.g. the goodput objectives.
std::string sweep_chart_svg(const std::vector<SweepSeries>& series, const std::string& title,
                            const std::string& subtitle = "");

}  // namespace baton::loadtest
