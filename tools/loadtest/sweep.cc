#include "tools/loadtest/sweep.h"

#include <cmath>
#include <sstream>

#include "tools/loadtest/positive_number.h"
#include "tools/loadtest/result_json.h"

namespace baton::loadtest {

using json = nlohmann::json;

Result<std::vector<double>> parse_rates(const std::string& list) {
  std::vector<double> rates;
  std::stringstream stream(list);
  for (std::string item; std::getline(stream, item, ',');) {
    std::optional<double> rate = parse_positive_number(item, /*allow_inf=*/false);
    if (!rate) return invalid_argument("--rates: '" + item + "' is not a positive request rate");
    if (!rates.empty() && *rate <= rates.back())
      return invalid_argument("--rates must increase, got " + list);
    rates.push_back(*rate);
  }
  if (rates.empty()) return invalid_argument("--rates: no rate given");
  return rates;
}

Result<SweepPoint> sweep_point(const json& result, const std::string& name) {
  SweepPoint point;
  const std::pair<const char*, double*> fields[] = {
      {"request_rate", &point.request_rate}, {"median_ttft_ms", &point.median_ttft_ms},
      {"p99_ttft_ms", &point.p99_ttft_ms},   {"median_tpot_ms", &point.median_tpot_ms},
      {"p99_tpot_ms", &point.p99_tpot_ms},   {"request_throughput", &point.request_throughput}};
  for (auto [key, target] : fields) {
    if (!result.is_object() || !result.contains(key) || !result[key].is_number())
      return invalid_argument(name + ": a run has no numeric \"" + key + "\"");
    *target = result[key].get<double>();
  }
  if (result.contains("request_goodput") && result["request_goodput"].is_number())
    point.request_goodput = result["request_goodput"].get<double>();
  return point;
}

json sweep_json(const std::string& label, const std::vector<json>& runs) {
  return {{"label", label}, {"runs", runs}};
}

Result<SweepSeries> sweep_series(const json& sweep, const std::string& name, const Slo* regrade) {
  if (!sweep.is_object() || !sweep.contains("runs") || !sweep["runs"].is_array())
    return invalid_argument(name + ": not a sweep result (no \"runs\" list)");
  SweepSeries series;
  series.label = sweep.contains("label") && sweep["label"].is_string()
                     ? sweep["label"].get<std::string>()
                     : name;
  for (const json& run : sweep["runs"]) {
    json graded = run;
    if (regrade != nullptr) {
      BATON_ASSIGN_OR_RETURN(BenchResult result, result_from_json(run, name));
      result.config.slo = *regrade;
      graded = result_json(result, /*detailed=*/false);
    }
    BATON_ASSIGN_OR_RETURN(SweepPoint point, sweep_point(graded, name));
    series.points.push_back(point);
  }
  return series;
}

void print_sweep_table(std::FILE* out, const SweepSeries& series) {
  std::fprintf(out, "Sweep '%s':\n", series.label.c_str());
  std::fprintf(out, "%10s %10s %10s %12s %10s %12s %10s\n", "rate", "req/s", "goodput",
               "median TTFT", "P99 TTFT", "median TPOT", "P99 TPOT");
  for (const SweepPoint& p : series.points) {
    char goodput[32] = "-";
    if (p.request_goodput) std::snprintf(goodput, sizeof(goodput), "%.2f", *p.request_goodput);
    std::fprintf(out, "%10.2f %10.2f %10s %12.2f %10.2f %12.2f %10.2f\n", p.request_rate,
                 p.request_throughput, goodput, p.median_ttft_ms, p.p99_ttft_ms, p.median_tpot_ms,
                 p.p99_tpot_ms);
  }
  std::fprintf(out, "(latencies in ms)\n");
}

}  // namespace baton::loadtest
