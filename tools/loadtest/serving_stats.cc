#include "tools/loadtest/serving_stats.h"

#include <algorithm>
#include <cmath>

namespace baton::loadtest {

double percentile(std::vector<double> values, double pct) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(pct, 0.0, 100.0) / 100.0 * double(values.size() - 1);
  const auto lo = size_t(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = rank - double(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

Distribution distribution_ms(const std::vector<double>& seconds) {
  Distribution d;
  d.count = int64_t(seconds.size());
  if (seconds.empty()) return d;
  std::vector<double> ms(seconds.size());
  std::transform(seconds.begin(), seconds.end(), ms.begin(), [](double s) { return s * 1e3; });
  double sum = 0;
  for (double v : ms) sum += v;
  d.mean = sum / double(ms.size());
  double square = 0;
  for (double v : ms) square += (v - d.mean) * (v - d.mean);
  d.stddev = std::sqrt(square / double(ms.size()));  // population, as numpy.std
  std::sort(ms.begin(), ms.end());
  d.median = percentile(ms, 50);
  d.p99 = percentile(ms, 99);
  d.sorted_ms = std::move(ms);
  return d;
}

double Distribution::percentile_ms(double pct) const { return percentile(sorted_ms, pct); }

std::optional<double> request_tpot_s(const RequestRecord& r) {
  if (!r.success || r.output_tokens < 2) return std::nullopt;
  return (r.e2el_s - r.ttft_s) / double(r.output_tokens - 1);
}

ServingSummary summarize(const std::vector<RequestRecord>& records, double duration_s,
                         const Slo& slo) {
  ServingSummary s;
  s.duration_s = duration_s;
  std::vector<double> ttfts, tpots, itls, e2els;
  int64_t good = 0;
  for (const auto& r : records) {
    if (!r.success) {
      ++s.failed;
      continue;
    }
    ++s.completed;
    s.total_input_tokens += r.prompt_tokens;
    s.total_output_tokens += r.output_tokens;
    ttfts.push_back(r.ttft_s);
    e2els.push_back(r.e2el_s);
    itls.insert(itls.end(), r.itl_s.begin(), r.itl_s.end());
    auto tpot = request_tpot_s(r);
    if (tpot) tpots.push_back(*tpot);
    const bool meets = (!slo.ttft_ms || r.ttft_s * 1e3 <= *slo.ttft_ms) &&
                       (!slo.tpot_ms || tpot.value_or(0.0) * 1e3 <= *slo.tpot_ms) &&
                       (!slo.e2el_ms || r.e2el_s * 1e3 <= *slo.e2el_ms);
    if (meets) ++good;
  }
  if (duration_s > 0) {
    s.request_throughput = double(s.completed) / duration_s;
    s.output_throughput = double(s.total_output_tokens) / duration_s;
    s.total_token_throughput = double(s.total_input_tokens + s.total_output_tokens) / duration_s;
    if (slo.any()) s.request_goodput = double(good) / duration_s;
  }
  s.ttft_ms = distribution_ms(ttfts);
  s.tpot_ms = distribution_ms(tpots);
  s.itl_ms = distribution_ms(itls);
  s.e2el_ms = distribution_ms(e2els);
  return s;
}

}  // namespace baton::loadtest
