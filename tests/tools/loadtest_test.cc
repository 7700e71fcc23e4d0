// The load tester's statistics against hand-computed values, its arrival
// schedule against the gamma distribution's moments, and its report: the
// table's labels, the per-node breakdown, saved and merged JSON results.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "tools/loadtest/arrivals.h"
#include "tools/loadtest/bench_runner.h"
#include "tools/loadtest/report.h"
#include "tools/loadtest/result_json.h"
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

TEST(ServingStats, GoodputWithEndToEndLatency) {
  std::vector<RequestRecord> records = {ok(1, 2, 0.1, 0.5), ok(1, 2, 0.1, 1.5)};
  EXPECT_DOUBLE_EQ(*summarize(records, 4.0, {.e2el_ms = 1000.0}).request_goodput, 0.25);
}

TEST(Report, GoodputOptionParses) {
  auto slo = parse_goodput({"ttft:200", "tpot:50.5"});
  ASSERT_TRUE(slo.is_ok()) << slo.status().to_string();
  EXPECT_EQ(slo->ttft_ms, 200.0);
  EXPECT_EQ(slo->tpot_ms, 50.5);
  EXPECT_FALSE(slo->e2el_ms.has_value());
  for (const char* bad : {"ttft", "ttft:", "ttft:abc", "ttft:-1", "itl:5", "ttft:5ms", "ttft:inf"})
    EXPECT_FALSE(parse_goodput({bad}).is_ok()) << bad;
  EXPECT_FALSE(parse_goodput({"ttft:1", "ttft:2"}).is_ok());
  EXPECT_TRUE(parse_percentile_metrics("ttft,e2el").is_ok());
  EXPECT_FALSE(parse_percentile_metrics("ttft,latency").is_ok());
}

RequestRecord served(RequestRecord r, std::string prefill, std::string decode, double start) {
  r.prefill_node = std::move(prefill);
  r.decode_node = std::move(decode);
  r.start_s = start;
  return r;
}

BenchResult two_node_result() {
  BenchResult result;
  result.config.model = "tiny";
  result.config.num_prompts = 3;
  result.config.request_rate = 2.0;
  result.config.slo.ttft_ms = 250.0;
  result.started_at_unix = 1000.0;
  result.duration_s = 2.0;
  RequestRecord failed;
  failed.error = "HTTP 503: no decode node";
  result.records = {
      served(ok(5, 10, 0.1, 1.0, std::vector<double>(9, 0.1)), "prefill-0", "decode-0", 0.0),
      served(ok(7, 1, 0.3, 0.3), "", "decode-0", 0.5), failed};
  return result;
}

TEST(Report, PerNodeBreakdownFollowsServedBy) {
  std::vector<NodeShare> shares = per_node(two_node_result());
  ASSERT_EQ(shares.size(), 3u);
  EXPECT_EQ(shares[0].role, "prefill");
  EXPECT_EQ(shares[0].node, kPrefilledOnDecode);  // the request without a prefill node
  EXPECT_EQ(shares[0].summary.completed, 1);
  EXPECT_NEAR(shares[0].summary.ttft_ms.mean, 300.0, 1e-9);
  EXPECT_EQ(shares[1].node, "prefill-0");
  EXPECT_DOUBLE_EQ(shares[1].summary.output_throughput, 5.0);  // 10 tokens over the run's 2 s
  EXPECT_EQ(shares[2].role, "decode");
  EXPECT_EQ(shares[2].node, "decode-0");
  EXPECT_EQ(shares[2].summary.completed, 2);
  EXPECT_DOUBLE_EQ(shares[2].summary.output_throughput, 5.5);
}

TEST(Report, TableHasVllmLabels) {
  char* text = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&text, &size);
  print_report(out, two_node_result(), {"ttft", "tpot", "itl"});
  std::fclose(out);
  const std::string table(text, size);
  std::free(text);
  for (const char* label :
       {"============ Serving Benchmark Result ============", "Successful requests:",
        "Benchmark duration (s):", "Total input tokens:", "Total generated tokens:",
        "Request throughput (req/s):", "Request goodput (req/s):",
        "Output token throughput (tok/s):", "Total Token throughput (tok/s):",
        "---------------Time to First Token----------------", "Mean TTFT (ms):",
        "Median TTFT (ms):", "P99 TTFT (ms):", "-----Time per Output Token (excl. 1st token)------",
        "Mean TPOT (ms):", "P99 ITL (ms):", "1 x HTTP 503: no decode node"}) {
    EXPECT_NE(table.find(label), std::string::npos) << label << " missing from\n" << table;
  }
  EXPECT_NE(table.find("Successful requests:                     2 "), std::string::npos);
  EXPECT_NE(table.find("Output token throughput (tok/s):         5.50"), std::string::npos);
  EXPECT_EQ(table.find("E2EL"), std::string::npos);  // not asked for
}

// vLLM's --metric-percentiles: each asked-for percentile replaces P99 in
// the table and joins the saved result as p<word>_<metric>_ms (P99 stays in
// the result, for Baton's sweeps). The TTFTs are 100 and 300 ms: numpy's
// linear interpolation gives 150 at 25 and 299.8 at 99.9.
TEST(Report, MetricPercentilesAreParsedPrintedAndSaved) {
  auto parsed = parse_metric_percentiles("25,99.9");
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  EXPECT_EQ(*parsed, (std::vector<double>{25.0, 99.9}));
  for (const char* bad : {"", "0", "100.5", "-5", "x", "50,abc", "1e9", "99 "})
    EXPECT_FALSE(parse_metric_percentiles(bad).is_ok()) << "'" << bad << "'";
  EXPECT_TRUE(parse_metric_percentiles("100").is_ok());
  EXPECT_EQ(percentile_word(99.0), "99");
  EXPECT_EQ(percentile_word(99.9), "99.9");

  BenchResult result = two_node_result();
  result.config.metric_percentiles = *parsed;
  char* text = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&text, &size);
  print_report(out, result, {"ttft"});
  std::fclose(out);
  const std::string table(text, size);
  std::free(text);
  EXPECT_NE(table.find("P25 TTFT (ms):                           150.00"), std::string::npos)
      << table;
  EXPECT_NE(table.find("P99.9 TTFT (ms):                         299.80"), std::string::npos)
      << table;
  EXPECT_EQ(table.find("P99 TTFT (ms):"), std::string::npos) << table;

  nlohmann::json saved = result_json(result, /*detailed=*/true);
  EXPECT_NEAR(saved["p25_ttft_ms"].get<double>(), 150.0, 1e-9);
  EXPECT_NEAR(saved["p99.9_ttft_ms"].get<double>(), 299.8, 1e-9);
  EXPECT_NEAR(saved["p99_ttft_ms"].get<double>(), 298.0, 1e-9);
  EXPECT_TRUE(saved["per_node"][0].contains("p99.9_itl_ms"));
  auto back = result_from_json(nlohmann::json::parse(saved.dump()), "saved.json");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->config.metric_percentiles, *parsed);
}

TEST(ResultJson, VllmKeysAndRoundTrip) {
  BenchResult result = two_node_result();
  nlohmann::json brief = result_json(result, /*detailed=*/false);
  // The keys `vllm bench serve --save-result` writes, and Baton's per_node.
  std::istringstream keys(
      "date backend model_id num_prompts request_rate burstiness max_concurrency duration "
      "completed total_input_tokens total_output_tokens request_throughput request_goodput "
      "output_throughput total_token_throughput mean_ttft_ms median_ttft_ms std_ttft_ms "
      "p99_ttft_ms mean_tpot_ms median_tpot_ms std_tpot_ms p99_tpot_ms mean_itl_ms median_itl_ms "
      "std_itl_ms p99_itl_ms mean_e2el_ms median_e2el_ms std_e2el_ms p99_e2el_ms per_node");
  for (std::string key; keys >> key;) EXPECT_TRUE(brief.contains(key)) << key;
  EXPECT_EQ(brief["completed"], 2);
  EXPECT_DOUBLE_EQ(brief["request_goodput"].get<double>(), 0.5);
  EXPECT_NEAR(brief["p99_ttft_ms"].get<double>(), 298.0, 1e-9);
  EXPECT_FALSE(brief.contains("ttfts"));
  EXPECT_FALSE(result_from_json(brief, "brief.json").is_ok());  // no per-request detail

  result.config.request_rate = std::numeric_limits<double>::infinity();
  nlohmann::json detailed = result_json(result, /*detailed=*/true);
  EXPECT_EQ(detailed["request_rate"], "inf");
  EXPECT_EQ(detailed["input_lens"], nlohmann::json({5, 7, 0}));
  EXPECT_EQ(detailed["served_by"][1]["prefill"], nullptr);
  auto back = result_from_json(nlohmann::json::parse(detailed.dump()), "detailed.json");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_TRUE(std::isinf(back->config.request_rate));
  EXPECT_EQ(back->config.slo.ttft_ms, 250.0);
  EXPECT_EQ(result_json(*back, true), detailed);
}

TEST(ResultJson, MergeRecomputesOverAllShards) {
  BenchResult a = two_node_result(), b = two_node_result();
  a.config.shard = "0/2";
  b.config.shard = "1/2";
  b.started_at_unix = 1001.0;  // started a second later, ended at 1003
  b.records.pop_back();        // no failure on this host
  auto merged = merge_results({a, b});
  ASSERT_TRUE(merged.is_ok()) << merged.status().to_string();
  EXPECT_DOUBLE_EQ(merged->duration_s, 3.0);
  EXPECT_DOUBLE_EQ(merged->started_at_unix, 1000.0);
  EXPECT_EQ(merged->config.num_prompts, 5);
  EXPECT_TRUE(merged->config.shard.empty());
  EXPECT_DOUBLE_EQ(merged->records[3].start_s, 1.0);  // b's first request, on a's clock
  ServingSummary s = merged->summary();
  EXPECT_EQ(s.completed, 4);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.total_output_tokens, 22);
  EXPECT_NEAR(s.request_throughput, 4.0 / 3.0, 1e-12);
  b.config.model = "other";
  EXPECT_FALSE(merge_results({a, b}).is_ok());
  EXPECT_FALSE(merge_results({}).is_ok());
}

// A merge is of one run's shards, each once: a shard given twice would
// count its requests twice, one left out would pass part of a run off as
// the whole.
TEST(ResultJson, MergeTakesEachShardOfOneRunOnce) {
  BenchResult a = two_node_result(), b = two_node_result(), c = two_node_result();
  a.config.shard = "0/3";
  b.config.shard = "1/3";
  c.config.shard = "2/3";
  ASSERT_TRUE(merge_results({c, a, b}).is_ok());
  auto message = [](const Result<BenchResult>& r) { return r.is_ok() ? "" : r.status().message(); };
  EXPECT_NE(message(merge_results({a, b, b})).find("shard 1/3 given twice"), std::string::npos);
  EXPECT_NE(message(merge_results({a, b})).find("a run of 3 shards, 2 results given"),
            std::string::npos);
  BenchResult huge = c;
  huge.config.shard = "0/9000000000000000000";
  EXPECT_FALSE(merge_results({a, b, huge}).is_ok());
  BenchResult other_run = c;
  other_run.config.seed += 1;
  EXPECT_NE(message(merge_results({a, b, other_run})).find("of another run"), std::string::npos);
  BenchResult unsharded = c;
  unsharded.config.shard.clear();
  EXPECT_FALSE(merge_results({a, b, unsharded}).is_ok());
}

}  // namespace
}  // namespace baton::loadtest

namespace baton::loadtest {
namespace {

// A client whose every other request throws, as a request whose I/O context
// finds no descriptor left does (Boost's epoll reactor throws then).
class ThrowingClient final : public BenchClient {
 public:
  RequestRecord stream(const std::string&, const std::string& body, int64_t) override {
    if (body.size() % 2 == 1) throw std::runtime_error("epoll: Too many open files");
    RequestRecord record;
    record.success = true;
    return record;
  }
  Result<tools::HttpResponse> get(const std::string&) override { return unavailable("unused"); }
};

// A request that throws is a failed request with the exception's text; the
// others of the run are served and recorded.
TEST(BenchRunner, ARequestThatThrowsIsRecordedAsFailed) {
  std::vector<PlannedRequest> plan;
  for (int i = 0; i < 12; ++i) plan.push_back({std::string(size_t(4 + i), 'x'), 1, 0.0});
  const ClientFactory connect = []() -> Result<std::unique_ptr<BenchClient>> {
    return std::unique_ptr<BenchClient>(std::make_unique<ThrowingClient>());
  };
  const RunOutcome outcome = run_requests(plan, connect, RunOptions{.max_concurrency = 3});
  ASSERT_EQ(outcome.records.size(), plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    const bool throws = plan[i].body.size() % 2 == 1;
    EXPECT_EQ(outcome.records[i].success, !throws) << i;
    if (throws) {
      EXPECT_EQ(outcome.records[i].error, "epoll: Too many open files") << i;
    }
  }
}

}  // namespace
}  // namespace baton::loadtest
