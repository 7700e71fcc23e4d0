// The load tester's view of one streamed response (chunk timings, usage,
// served_by, errors, inter-token gaps), and the sweep chart.
#include <gtest/gtest.h>

#include "tools/loadtest/result_json.h"
#include "tools/loadtest/stream_record.h"
#include "tools/loadtest/svg_chart.h"
#include "tools/loadtest/sweep.h"

namespace baton::loadtest {
namespace {

using namespace std::chrono_literals;

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << "gap " << i;
}

TEST(SpreadItl, OneTokenPerChunkIsTheChunkGaps) {
  expect_near_all(spread_itl({0.1, 0.2, 0.4}, {1, 1, 1}, 3), {0.1, 0.2});
}

TEST(SpreadItl, AChunkWithSeveralTokensSplitsItsGap) {
  // 5 tokens in 4 chunks: the second chunk's two bytes carry the extra token.
  expect_near_all(spread_itl({0.0, 0.1, 0.3, 0.4}, {1, 1, 2, 1}, 5), {0.1, 0.1, 0.1, 0.1});
  // No text to go by (all chunks equal): extra tokens go to the earliest chunks.
  expect_near_all(spread_itl({0.0, 0.2, 0.3}, {1, 1, 1}, 4), {0.1, 0.1, 0.1});
}

TEST(SpreadItl, FewerTokensThanChunksMergesGaps) {
  // 2 tokens in 3 chunks (one chunk carried no token): one gap, to the chunk
  // with the most text.
  expect_near_all(spread_itl({0.0, 0.1, 0.3}, {1, 0, 4}, 2), {0.3});
}

TEST(SpreadItl, NothingToMeasure) {
  EXPECT_TRUE(spread_itl({0.1}, {5}, 5).empty());  // everything in one chunk
  EXPECT_TRUE(spread_itl({0.1, 0.2}, {1, 1}, 1).empty());
  EXPECT_TRUE(spread_itl({}, {}, 0).empty());
}

TEST(SseSplitter, PayloadsSplitAcrossReads) {
  SseSplitter splitter;
  std::vector<std::string> payloads;
  auto collect = [&](std::string_view p) { payloads.emplace_back(p); };
  splitter.feed("data: {\"a\"", collect);
  EXPECT_TRUE(payloads.empty());
  splitter.feed(":1}\n\ndata: [DO", collect);
  splitter.feed("NE]\n\n", collect);
  EXPECT_EQ(payloads, (std::vector<std::string>{"{\"a\":1}", "[DONE]"}));
}

const Clock::time_point kSent{};

std::string text_chunk(const std::string& text, const char* finish = nullptr) {
  nlohmann::json choice = {{"index", 0}, {"text", text}, {"finish_reason", nullptr}};
  if (finish != nullptr) {
    choice["finish_reason"] = finish;
    choice["served_by"] = {{"prefill", "prefill-1"}, {"decode", "decode-0"}};
  }
  return nlohmann::json({{"choices", {choice}}}).dump();
}

TEST(StreamRecorder, TimesTokensAndNodesFromTheStream) {
  StreamRecorder recorder(kSent, /*prompt_len=*/99);
  recorder.on_event(text_chunk("a"), kSent + 100ms);
  recorder.on_event(text_chunk("b"), kSent + 150ms);
  recorder.on_event(text_chunk("cd", "length"), kSent + 250ms);
  recorder.on_event(R"({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4}})",
                    kSent + 260ms);
  EXPECT_FALSE(recorder.done());
  recorder.on_event("[DONE]", kSent + 261ms);
  EXPECT_TRUE(recorder.done());
  RequestRecord r = recorder.finish();
  EXPECT_TRUE(r.success) << r.error;
  EXPECT_EQ(r.prompt_tokens, 7);  // usage wins over the client's count
  EXPECT_EQ(r.output_tokens, 4);
  EXPECT_NEAR(r.ttft_s, 0.100, 1e-9);
  EXPECT_NEAR(r.e2el_s, 0.250, 1e-9);  // the last chunk with a choice, not [DONE]
  expect_near_all(r.itl_s, {0.05, 0.05, 0.05});
  EXPECT_EQ(r.prefill_node, "prefill-1");
  EXPECT_EQ(r.decode_node, "decode-0");
  EXPECT_NEAR(*request_tpot_s(r), 0.05, 1e-9);
}

TEST(StreamRecorder, ChatDeltasAndNoUsage) {
  StreamRecorder recorder(kSent, 12);
  recorder.on_event(R"({"choices": [{"delta": {"role": "assistant", "content": "x"}}]})",
                    kSent + 10ms);
  recorder.on_event(
      R"({"choices": [{"delta": {"content": "y"}, "finish_reason": "length",
          "served_by": {"prefill": null, "decode": "d"}}]})",
      kSent + 30ms);
  recorder.on_event("[DONE]", kSent + 31ms);
  RequestRecord r = recorder.finish();
  EXPECT_TRUE(r.success);
  EXPECT_EQ(r.prompt_tokens, 12);  // the client's count
  EXPECT_EQ(r.output_tokens, 2);   // one per chunk
  EXPECT_EQ(r.prefill_node, "");   // prefilled on the decode node
  EXPECT_EQ(r.decode_node, "d");
  expect_near_all(r.itl_s, {0.02});
}

TEST(StreamRecorder, FailuresKeepTheirText) {
  StreamRecorder error_event(kSent, 1);
  error_event.on_event(text_chunk("a"), kSent + 1ms);
  error_event.on_event(R"({"error": {"message": "decode node lost", "code": 503}})", kSent + 2ms);
  EXPECT_TRUE(error_event.done());
  EXPECT_EQ(error_event.finish().error, "decode node lost");
  EXPECT_FALSE(error_event.finish().success);

  StreamRecorder cut(kSent, 1);
  cut.on_event(text_chunk("a"), kSent + 1ms);
  EXPECT_EQ(cut.finish().error, "the stream ended before [DONE]");

  StreamRecorder empty(kSent, 1);
  empty.on_event("[DONE]", kSent + 1ms);
  EXPECT_EQ(empty.finish().error, "the stream carried no token");

  StreamRecorder failed(kSent, 1);
  failed.fail("HTTP 400: too long");
  failed.fail("a later error");
  EXPECT_EQ(failed.finish().error, "HTTP 400: too long");
}

nlohmann::json run_result(double rate, double ttft, std::optional<double> goodput) {
  return {{"request_rate", rate},
          {"median_ttft_ms", ttft},
          {"p99_ttft_ms", 2 * ttft},
          {"median_tpot_ms", 10.0},
          {"p99_tpot_ms", 20.0},
          {"request_throughput", rate},
          {"request_goodput", goodput ? nlohmann::json(*goodput) : nlohmann::json(nullptr)}};
}

TEST(Sweep, RatesSavedSweepsAndTheChart) {
  EXPECT_EQ(*parse_rates("1,2.5,8"), (std::vector<double>{1, 2.5, 8}));
  for (const char* bad : {"", "1,,2", "2,1", "0", "inf", "1,x"})
    EXPECT_FALSE(parse_rates(bad).is_ok()) << bad;

  auto sweep = sweep_json("disagg", {run_result(1, 50, 1.0), run_result(2, 80, std::nullopt)});
  auto series = sweep_series(sweep, "s.json");
  ASSERT_TRUE(series.is_ok()) << series.status().to_string();
  EXPECT_EQ(series->label, "disagg");
  ASSERT_EQ(series->points.size(), 2u);
  EXPECT_DOUBLE_EQ(series->points[1].p99_ttft_ms, 160.0);
  EXPECT_EQ(series->points[0].request_goodput, 1.0);
  EXPECT_FALSE(series->points[1].request_goodput.has_value());
  EXPECT_FALSE(sweep_series({{"runs", {{{"request_rate", 1}}}}}, "bad.json").is_ok());
  EXPECT_FALSE(sweep_series(nlohmann::json::object(), "bad.json").is_ok());

  SweepSeries other = *series;
  other.label = "colocated <2 decode>";
  std::string svg = sweep_chart_svg({*series, other}, "title");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  size_t polylines = 0;
  for (size_t pos = 0; (pos = svg.find("<polyline", pos)) != std::string::npos; ++pos) ++polylines;
  EXPECT_EQ(polylines, 2u * 2 + 2 * 2 + 2);  // TTFT and TPOT: median + P99 each; goodput
  EXPECT_NE(svg.find("colocated &lt;2 decode&gt;"), std::string::npos);
  EXPECT_NE(svg.find("Goodput"), std::string::npos);
}

TEST(Sweep, GoodputRegradedUnderOtherObjectives) {
  BenchResult run;
  run.config.request_rate = 1.0;
  run.config.slo.ttft_ms = 100.0;  // what the sweep ran with
  run.duration_s = 2.0;
  for (double ttft : {0.05, 0.2, 0.3, 0.4}) {
    RequestRecord r;
    r.success = true;
    r.output_tokens = 1;
    r.ttft_s = r.e2el_s = ttft;
    run.records.push_back(r);
  }
  const nlohmann::json sweep = sweep_json("a", {result_json(run, /*detailed=*/true)});
  EXPECT_DOUBLE_EQ(*sweep_series(sweep, "a.json")->points[0].request_goodput, 0.5);  // 1 of 4
  const Slo looser{.ttft_ms = 350.0};
  EXPECT_DOUBLE_EQ(*sweep_series(sweep, "a.json", &looser)->points[0].request_goodput, 1.5);
  const nlohmann::json brief = sweep_json("b", {result_json(run, /*detailed=*/false)});
  EXPECT_FALSE(sweep_series(brief, "b.json", &looser).is_ok());  // no per-request detail
}

}  // namespace
}  // namespace baton::loadtest
