// UTF-8 hold-back of streamed text, and the metrics exposition.
#include <gtest/gtest.h>

#include <random>

#include "router/completion_exchange.h"
#include "router/metrics.h"

namespace baton::router {
namespace {

TEST(CompleteUtf8Prefix, HoldsBackOnlyAnIncompleteLastSequence) {
  EXPECT_EQ(complete_utf8_prefix(""), 0u);
  EXPECT_EQ(complete_utf8_prefix("abc"), 3u);
  std::string euro = "\xE2\x82\xAC";       // 3 bytes
  std::string emoji = "\xF0\x9F\x98\x80";  // 4 bytes
  EXPECT_EQ(complete_utf8_prefix("a" + euro), 4u);
  EXPECT_EQ(complete_utf8_prefix("a" + euro.substr(0, 1)), 1u);
  EXPECT_EQ(complete_utf8_prefix("a" + euro.substr(0, 2)), 1u);
  EXPECT_EQ(complete_utf8_prefix("ab" + emoji.substr(0, 3)), 2u);
  EXPECT_EQ(complete_utf8_prefix("ab" + emoji), 6u);
}

TEST(CompleteUtf8Prefix, StreamingPiecesReassembleTheText) {
  std::mt19937 rng(std::random_device{}());
  const std::string pieces[] = {"a", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", " "};
  std::string text;
  for (int i = 0; i < 200; ++i) text += pieces[rng() % 5];
  // Feed byte by byte; emit what complete_utf8_prefix allows; the result must be the text.
  std::string emitted;
  for (size_t n = 1; n <= text.size(); ++n) {
    size_t visible = complete_utf8_prefix(text.substr(0, n));
    ASSERT_GE(visible, emitted.size());
    emitted += text.substr(emitted.size(), visible - emitted.size());
  }
  EXPECT_EQ(emitted, text);
}

TEST(RouterMetrics, RendersVllmNamesAndCumulativeBuckets) {
  RouterMetrics metrics("tiny");
  metrics.observe_ttft(0.003);
  metrics.observe_ttft(0.5);
  metrics.observe_ttft(1000);
  metrics.count_tokens(10, 7);
  metrics.count_finished("stop");
  metrics.count_finished("length");
  metrics.count_finished("length");
  ClusterSnapshot snapshot;
  NodeState decode;
  decode.name = "d0";
  decode.role = "decode";
  decode.up = true;
  decode.load.running = 3;
  decode.load.free_blocks = 25;
  decode.load.total_blocks = 100;
  snapshot.nodes.push_back(decode);
  std::string text = metrics.render(snapshot);
  EXPECT_NE(text.find("vllm:num_requests_running{model_name=\"tiny\"} 3\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("vllm:kv_cache_usage_perc{model_name=\"tiny\"} 0.75\n"), std::string::npos);
  EXPECT_NE(text.find("vllm:prompt_tokens_total{model_name=\"tiny\"} 10\n"), std::string::npos);
  EXPECT_NE(text.find("vllm:generation_tokens_total{model_name=\"tiny\"} 7\n"), std::string::npos);
  EXPECT_NE(
      text.find("vllm:request_success_total{model_name=\"tiny\",finished_reason=\"length\"} 2\n"),
      std::string::npos);
  EXPECT_NE(
      text.find("vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.005\"} 1\n"),
      std::string::npos);
  EXPECT_NE(
      text.find("vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.5\"} 2\n"),
      std::string::npos);
  EXPECT_NE(
      text.find("vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"+Inf\"} 3\n"),
      std::string::npos);
  EXPECT_NE(text.find("vllm:time_to_first_token_seconds_count{model_name=\"tiny\"} 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("baton:node_free_kv_blocks{node=\"d0\",role=\"decode\"} 25\n"),
            std::string::npos);
}

}  // namespace
}  // namespace baton::router
