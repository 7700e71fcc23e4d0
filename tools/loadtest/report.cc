#include "tools/loadtest/report.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "tools/loadtest/positive_number.h"

namespace baton::loadtest {
namespace {

constexpr int kTableWidth = 50;
constexpr size_t kErrorsShown = 5;

// "{s:{c}^{n}}" of Python: `text` centred in `width` columns of `fill`.
std::string centered(const std::string& text, char fill) {
  const size_t pad = text.size() >= kTableWidth ? 0 : kTableWidth - text.size();
  return std::string(pad / 2, fill) + text + std::string(pad - pad / 2, fill);
}

void row(std::FILE* out, const std::string& label, int64_t value) {
  std::fprintf(out, "%-40s %-10lld\n", label.c_str(), static_cast<long long>(value));
}
void row(std::FILE* out, const std::string& label, double value) {
  std::fprintf(out, "%-40s %-10.2f\n", label.c_str(), value);
}

struct Section {
  const char* key;
  const char* title;
  const char* name;
  Distribution ServingSummary::*distribution;
};
constexpr Section kSections[] = {
    {"ttft", "Time to First Token", "TTFT", &ServingSummary::ttft_ms},
    {"tpot", "Time per Output Token (excl. 1st token)", "TPOT", &ServingSummary::tpot_ms},
    {"itl", "Inter-token Latency", "ITL", &ServingSummary::itl_ms},
    {"e2el", "End-to-end Latency", "E2EL", &ServingSummary::e2el_ms},
};

void print_node_table(std::FILE* out, const BenchResult& result) {
  std::vector<NodeShare> shares = per_node(result);
  if (shares.empty()) return;
  std::fprintf(out, "%s\n", centered("Per node (served_by)", '-').c_str());
  std::fprintf(out, "%-8s %-18s %6s %10s %10s %10s %10s %10s\n", "role", "node", "reqs",
               "out tok/s", "mean TTFT", "P99 TTFT", "mean TPOT", "P99 TPOT");
  for (const NodeShare& share : shares) {
    const ServingSummary& s = share.summary;
    std::fprintf(out, "%-8s %-18s %6lld %10.2f %10.2f %10.2f %10.2f %10.2f\n", share.role.c_str(),
                 share.node.c_str(), static_cast<long long>(s.completed), s.output_throughput,
                 s.ttft_ms.mean, s.ttft_ms.p99, s.tpot_ms.mean, s.tpot_ms.p99);
  }
  std::fprintf(out, "(latencies in ms; throughput over the whole run)\n");
}

void print_errors(std::FILE* out, const std::vector<RequestRecord>& records) {
  std::map<std::string, int64_t> counts;
  for (const auto& r : records) {
    if (!r.success) ++counts[r.error];
  }
  if (counts.empty()) return;
  std::vector<std::pair<int64_t, std::string>> by_count;
  for (auto& [error, count] : counts) by_count.push_back({count, error});
  std::stable_sort(by_count.begin(), by_count.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::fprintf(out, "Errors of failed requests:\n");
  for (size_t i = 0; i < std::min(kErrorsShown, by_count.size()); ++i) {
    std::fprintf(out, "  %lld x %s\n", static_cast<long long>(by_count[i].first),
                 by_count[i].second.c_str());
  }
}

}  // namespace

Result<Slo> parse_goodput(const std::vector<std::string>& items) {
  Slo slo;
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    const std::string name = item.substr(0, colon);
    std::optional<double>* target = name == "ttft"   ? &slo.ttft_ms
                                    : name == "tpot" ? &slo.tpot_ms
                                    : name == "e2el" ? &slo.e2el_ms
                                                     : nullptr;
    if (colon == std::string::npos || target == nullptr) {
      return invalid_argument("--goodput takes ttft:MS, tpot:MS or e2el:MS, got '" + item + "'");
    }
    if (target->has_value()) return invalid_argument("--goodput: " + name + " given twice");
    std::optional<double> value =
        parse_positive_number(item.substr(colon + 1), /*allow_inf=*/false);
    if (!value) {
      return invalid_argument("--goodput " + name + ": '" + item.substr(colon + 1) +
                              "' is not a positive number of milliseconds");
    }
    *target = value;
  }
  return slo;
}

std::vector<NodeShare> per_node(const BenchResult& result) {
  std::map<std::pair<std::string, std::string>, std::vector<RequestRecord>> groups;
  for (const RequestRecord& r : result.records) {
    if (!r.success || r.decode_node.empty()) continue;
    groups[{"prefill", r.prefill_node.empty() ? kPrefilledOnDecode : r.prefill_node}].push_back(r);
    groups[{"decode", r.decode_node}].push_back(r);
  }
  std::vector<NodeShare> shares;
  for (const std::string role : {"prefill", "decode"}) {
    for (auto& [key, records] : groups) {
      if (key.first != role) continue;
      shares.push_back(
          {key.first, key.second, summarize(records, result.duration_s, result.config.slo)});
    }
  }
  return shares;
}

Result<std::vector<std::string>> parse_percentile_metrics(const std::string& list) {
  std::vector<std::string> metrics;
  std::stringstream stream(list);
  for (std::string item; std::getline(stream, item, ',');) {
    auto known = std::find_if(std::begin(kSections), std::end(kSections),
                              [&](const Section& s) { return item == s.key; });
    if (known == std::end(kSections)) {
      return invalid_argument("--percentile-metrics: '" + item +
                              "' is not one of ttft, tpot, itl, e2el");
    }
    metrics.push_back(item);
  }
  return metrics;
}

Result<std::vector<double>> parse_metric_percentiles(const std::string& list) {
  std::vector<double> percentiles;
  std::stringstream stream(list);
  for (std::string item; std::getline(stream, item, ',');) {
    double value = 0;
    const auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || error != std::errc() || end != item.data() + item.size() ||
        !(value > 0.0 && value <= 100.0)) {
      return invalid_argument("--metric-percentiles: '" + item +
                              "' is not a percentile in (0, 100]");
    }
    percentiles.push_back(value);
  }
  if (percentiles.empty()) return invalid_argument("--metric-percentiles: no percentile given");
  return percentiles;
}

std::string percentile_word(double pct) {
  if (pct == std::floor(pct)) return std::to_string(int64_t(pct));
  char text[32];
  std::snprintf(text, sizeof(text), "%g", pct);
  return text;
}

void print_report(std::FILE* out, const BenchResult& result,
                  const std::vector<std::string>& percentile_metrics) {
  const ServingSummary s = result.summary();
  std::fprintf(out, "%s\n", centered(" Serving Benchmark Result ", '=').c_str());
  row(out, "Successful requests:", s.completed);
  row(out, "Failed requests:", s.failed);
  if (result.config.max_concurrency > 0)
    row(out, "Maximum request concurrency:", result.config.max_concurrency);
  row(out, "Benchmark duration (s):", s.duration_s);
  row(out, "Total input tokens:", s.total_input_tokens);
  row(out, "Total generated tokens:", s.total_output_tokens);
  row(out, "Request throughput (req/s):", s.request_throughput);
  if (s.request_goodput) row(out, "Request goodput (req/s):", *s.request_goodput);
  row(out, "Output token throughput (tok/s):", s.output_throughput);
  row(out, "Total Token throughput (tok/s):", s.total_token_throughput);
  for (const Section& section : kSections) {
    if (std::find(percentile_metrics.begin(), percentile_metrics.end(), section.key) ==
        percentile_metrics.end())
      continue;
    const Distribution& d = s.*section.distribution;
    const std::string name = section.name;
    std::fprintf(out, "%s\n", centered(section.title, '-').c_str());
    row(out, "Mean " + name + " (ms):", d.mean);
    row(out, "Median " + name + " (ms):", d.median);
    for (double pct : result.config.metric_percentiles) {
      row(out, "P" + percentile_word(pct) + " " + name + " (ms):", d.percentile_ms(pct));
    }
  }
  print_node_table(out, result);
  std::fprintf(out, "%s\n", std::string(kTableWidth, '=').c_str());
  print_errors(out, result.records);
}

}  // namespace baton::loadtest
