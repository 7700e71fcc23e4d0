// The load tester's statistics against hand-computed values, and its arrival
// schedule against the gamma distribution's moments.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tools/loadtest/arrivals.h"
#include "tools/loadtest/serving_stats.h"

namespace baton::loadtest {
namespace {

TEST(ServingStats, PercentilesInterpolateLikeNumpy) {
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 99), 3.97);  // rank 2.97 between 3 and 4
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 100), 4.0);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7.0);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0.0);
}

RequestRecord ok(int64_t in, int64_t out, double ttft, double e2el, std::vector<double> itl = {}) {
  RequestRecord r;
  r.success = true;
  r.prompt_tokens = in;
  r.output_tokens = out;
  r.ttft_s = ttft;
  r.e2el_s = e2el;
  r.itl_s = std::move(itl);
  return r;
}

TEST(ServingStats, TpotLeavesOutSingleTokenOutputs) {
  EXPECT_DOUBLE_EQ(*request_tpot_s(ok(5, 10, 0.1, 1.0)), 0.1);  // 0.9 s over 9 gaps
  EXPECT_FALSE(request_tpot_s(ok(5, 1, 0.3, 0.3)).has_value());
  RequestRecord failed;
  EXPECT_FALSE(request_tpot_s(failed).has_value());
}

TEST(ServingStats, SummaryMatchesHandComputedValues) {
  RequestRecord failed;
  failed.error = "HTTP 503";
  std::vector<RequestRecord> records = {ok(5, 10, 0.1, 1.0, std::vector<double>(9, 0.1)),
                                        ok(7, 1, 0.3, 0.3), failed};
  ServingSummary s = summarize(records, /*duration_s=*/2.0);
  EXPECT_EQ(s.completed, 2);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.total_input_tokens, 12);
  EXPECT_EQ(s.total_output_tokens, 11);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(s.output_throughput, 5.5);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 11.5);
  EXPECT_NEAR(s.ttft_ms.mean, 200.0, 1e-9);
  EXPECT_NEAR(s.ttft_ms.median, 200.0, 1e-9);
  EXPECT_NEAR(s.ttft_ms.p99, 298.0, 1e-9);  // 100 + 0.99 * 200
  EXPECT_EQ(s.tpot_ms.count, 1);            // the one-token request has no TPOT
  EXPECT_NEAR(s.tpot_ms.mean, 100.0, 1e-9);
  EXPECT_NEAR(s.e2el_ms.mean, 650.0, 1e-9);
  EXPECT_EQ(s.itl_ms.count, 9);
  EXPECT_NEAR(s.itl_ms.mean, 100.0, 1e-9);
  EXPECT_FALSE(s.request_goodput.has_value());

  // Goodput: r1 meets TTFT <= 250 ms, r2 (300 ms) does not.
  EXPECT_DOUBLE_EQ(*summarize(records, 2.0, {.ttft_ms = 250.0}).request_goodput, 0.5);
  // TPOT <= 50 ms: r1 (100 ms) fails; r2's single token counts as TPOT 0.
  EXPECT_DOUBLE_EQ(*summarize(records, 2.0, {.tpot_ms = 50.0}).request_goodput, 0.5);
  EXPECT_DOUBLE_EQ(*summarize(records, 2.0, {.ttft_ms = 250.0, .tpot_ms = 50.0}).request_goodput,
                   0.0);
}

struct Moments {
  double mean, variance;
};

Moments gap_moments(const std::vector<double>& times) {
  double sum = 0, square = 0, previous = 0;
  for (double t : times) {
    const double gap = t - previous;
    previous = t;
    sum += gap;
    square += gap * gap;
  }
  const double n = double(times.size());
  const double mean = sum / n;
  return {mean, square / n - mean * mean};
}

TEST(Arrivals, GammaGapsHaveTheRequestedRateAndVariance) {
  const double rate = 4.0;
  for (double burstiness : {0.5, 1.0, 4.0}) {
    auto times = arrival_times(40000, {.request_rate = rate, .burstiness = burstiness, .seed = 11});
    ASSERT_TRUE(times.is_ok());
    ASSERT_TRUE(std::is_sorted(times->begin(), times->end()));
    Moments m = gap_moments(*times);
    EXPECT_NEAR(m.mean, 1.0 / rate, 0.02 / rate) << "burstiness " << burstiness;
    const double variance = 1.0 / (rate * rate * burstiness);
    EXPECT_NEAR(m.variance, variance, 0.06 * variance) << "burstiness " << burstiness;
  }
}

TEST(Arrivals, SeededInfiniteAndInvalid) {
  auto a = arrival_times(100, {.request_rate = 2.0, .burstiness = 1.0, .seed = 5});
  auto b = arrival_times(100, {.request_rate = 2.0, .burstiness = 1.0, .seed = 5});
  auto c = arrival_times(100, {.request_rate = 2.0, .burstiness = 1.0, .seed = 6});
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  auto burst = arrival_times(5, {.request_rate = std::numeric_limits<double>::infinity()});
  EXPECT_EQ(*burst, std::vector<double>(5, 0.0));
  EXPECT_FALSE(arrival_times(5, {.request_rate = 0.0}).is_ok());
  EXPECT_FALSE(arrival_times(5, {.request_rate = 1.0, .burstiness = -1.0}).is_ok());
  EXPECT_FALSE(arrival_times(-1, {}).is_ok());
}

}  // namespace
}  // namespace baton::loadtest
