// UTF-8 hold-back of streamed text, and the metrics exposition.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "engine/tokenizer.h"
#include "router/completion_exchange.h"
#include "router/incremental_text.h"
#include "router/metrics.h"

namespace baton::router {
namespace {

TEST(CompleteUtf8Prefix, HoldsBackOnlyAnIncompleteLastSequence) {
  EXPECT_EQ(complete_utf8_prefix(""), 0u);
  EXPECT_EQ(complete_utf8_prefix("abc"), 3u);
  std::string euro = "\xE2\x82\xAC";       // 3 bytes
  std::string emoji = "\xF0\x9F\x98\x80";  // 4 bytes
  // Appending, not "..." + s: GCC 12 warns there (-Wrestrict, a false positive).
  auto join = [](std::string a, const std::string& b) { return a += b; };
  EXPECT_EQ(complete_utf8_prefix(join("a", euro)), 4u);
  EXPECT_EQ(complete_utf8_prefix(join("a", euro.substr(0, 1))), 1u);
  EXPECT_EQ(complete_utf8_prefix(join("a", euro.substr(0, 2))), 1u);
  EXPECT_EQ(complete_utf8_prefix(join("ab", emoji.substr(0, 3))), 2u);
  EXPECT_EQ(complete_utf8_prefix(join("ab", emoji)), 6u);
}

TEST(CompleteUtf8Prefix, StreamingPiecesReassembleTheText) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937 rng(seed);
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

// Feeds `tokens` in random chunks through append_decoded; returns the text
// and adds the tokens handed to `decode` to `decoded_work`.
std::string decode_in_chunks(const std::vector<int32_t>& tokens, const DecodeFn& decode,
                             std::mt19937& rng, size_t& decoded_work, bool& fell_back,
                             const std::vector<int32_t>& lead = {}) {
  DecodeFn counting = [&](const std::vector<int32_t>& ids) {
    decoded_work += ids.size();
    return decode(ids);
  };
  std::vector<int32_t> so_far;
  size_t decoded = 0;
  std::string text;
  fell_back = false;
  while (so_far.size() < tokens.size()) {
    size_t chunk = 1 + rng() % 4;
    for (size_t i = 0; i < chunk && so_far.size() < tokens.size(); ++i)
      so_far.push_back(tokens[so_far.size()]);
    fell_back |= !append_decoded(so_far, decoded, text, counting, lead);
    EXPECT_EQ(decoded, so_far.size());
  }
  return text;
}

// A SentencePiece-style decoder ("▁word" pieces, one leading space stripped
// from the whole text) drops the space before an output's first word when
// the output is decoded alone. Read after the prompt's last tokens, as vLLM
// reads it, the output keeps it; the chunked text still equals one decode.
TEST(IncrementalText, AnOutputIsReadAfterItsPromptAndKeepsItsLeadingSpace) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937 rng(seed);
  DecodeFn sentencepiece = [](const std::vector<int32_t>& ids) {
    std::string text;
    for (int32_t id : ids) text += " w" + std::to_string(id);
    return text.empty() ? text : text.substr(1);
  };
  std::vector<int32_t> prompt = {7, 8, 9}, output;
  for (int i = 0; i < 40; ++i) output.push_back(int32_t(rng() % 100));
  std::vector<int32_t> all(prompt);
  all.insert(all.end(), output.begin(), output.end());
  const std::string want = sentencepiece(all).substr(sentencepiece(prompt).size());
  ASSERT_EQ(want.substr(0, 2), " w");
  size_t work = 0;
  bool fell_back = false;
  EXPECT_EQ(decode_in_chunks(output, sentencepiece, rng, work, fell_back, prompt), want);
  EXPECT_FALSE(fell_back);
  // Without the prompt, the first word loses its space.
  EXPECT_EQ(decode_in_chunks(output, sentencepiece, rng, work, fell_back), sentencepiece(output));
}

TEST(IncrementalText, ByteTokenizerTextEqualsOneDecodeAndCostsLinearWork) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937 rng(seed);
  engine::ByteTokenizer tokenizer;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 4000; ++i) tokens.push_back(int32_t(rng() % 300));  // bytes, specials, extras
  DecodeFn decode = [&](const std::vector<int32_t>& ids) { return tokenizer.decode(ids); };
  size_t work = 0;
  bool fell_back = false;
  EXPECT_EQ(decode_in_chunks(tokens, decode, rng, work, fell_back), tokenizer.decode(tokens));
  EXPECT_FALSE(fell_back);
  // Each update decodes its new tokens twice over plus twice the context:
  // linear in the output, where decoding everything each time is quadratic
  // (about 4000^2 / 2 / 2.5 = 3.2M tokens here).
  EXPECT_LT(work, tokens.size() * 2 * (1 + kDetokenizeContextTokens));
}

TEST(IncrementalText, LeftContextDependentTokenizerStillExact) {
  // SentencePiece-like: words joined by spaces, no space before the first.
  const std::vector<std::string> words = {"a", "bb", "ccc", "dd", "e"};
  DecodeFn decode = [&](const std::vector<int32_t>& ids) {
    std::string text;
    for (int32_t id : ids) text += (text.empty() ? "" : " ") + words[size_t(id)];
    return text;
  };
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 300; ++i) tokens.push_back(int32_t(rng() % words.size()));
  size_t work = 0;
  bool fell_back = false;
  EXPECT_EQ(decode_in_chunks(tokens, decode, rng, work, fell_back), decode(tokens));
  EXPECT_FALSE(fell_back);
}

TEST(IncrementalText, ATokenizerThatRewritesEarlierTextFallsBackToOneDecode) {
  // Reversed output: appending a token changes the text's start.
  DecodeFn decode = [](const std::vector<int32_t>& ids) {
    std::string text;
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) text += char('a' + *it % 26);
    return text;
  };
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 50; ++i) tokens.push_back(int32_t(rng() % 26));
  size_t work = 0;
  bool fell_back = false;
  EXPECT_EQ(decode_in_chunks(tokens, decode, rng, work, fell_back), decode(tokens));
  EXPECT_TRUE(fell_back);
}

TEST(RouterMetrics, RendersVllmNamesAndCumulativeBuckets) {
  RouterMetrics metrics("tiny");
  metrics.observe_ttft(0.003);
  metrics.observe_ttft(0.5);
  metrics.observe_ttft(1000);
  metrics.count_tokens(10, 7);
  metrics.count_finished(FinishReason::kStop);
  metrics.count_finished(FinishReason::kLength);
  metrics.count_finished(FinishReason::kLength);
  ClusterSnapshot snapshot;
  NodeState decode;
  decode.name = "d0";
  decode.role = Role::kDecode;
  decode.up = true;
  decode.load.running = 3;
  decode.load.free_blocks = 25;
  decode.load.total_blocks = 100;
  decode.prefix_cache_queries = 40;
  decode.prefix_cache_hits = 16;
  decode.prefix_cache_ssd_hits = 8;
  decode.load.ssd_cache_blocks = 12;
  decode.load.ssd_cache_capacity = 1000;
  decode.load.ssd_restoring = 2;
  decode.load.workspace_bytes = 123456;
  decode.load.staging_slots = 64;
  decode.load.staging_slots_free = 17;
  decode.load.preemptions = 4;
  snapshot.nodes.push_back(decode);
  NodeState prefill;
  prefill.name = "p0";
  prefill.role = Role::kPrefill;
  prefill.prefix_cache_queries = 5;
  prefill.load.preemptions = 3;  // down or not, its count stands
  prefill.load.staging_waits = 9;
  snapshot.nodes.push_back(prefill);
  std::string text = metrics.render(snapshot);
  // Prefix cache counters: every node's, summed.
  EXPECT_NE(text.find("vllm:prefix_cache_queries_total{model_name=\"tiny\"} 45\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("vllm:prefix_cache_hits_total{model_name=\"tiny\"} 16\n"), std::string::npos);
  EXPECT_NE(text.find("baton:prefix_cache_ssd_hits_total{model_name=\"tiny\"} 8\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("baton:node_ssd_cache_blocks{node=\"d0\",role=\"decode\"} 12\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("baton:node_ssd_cache_capacity_blocks{node=\"d0\",role=\"decode\"} 1000\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("baton:node_ssd_restoring{node=\"d0\",role=\"decode\"} 2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("baton:node_workspace_bytes{node=\"d0\",role=\"decode\"} 123456\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("baton:node_kv_staging_slots{node=\"d0\",role=\"decode\"} 64\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("baton:node_kv_staging_slots_free{node=\"d0\",role=\"decode\"} 17\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("baton:node_kv_staging_waits_total{node=\"p0\",role=\"prefill\"} 9\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("vllm:num_requests_running{model_name=\"tiny\"} 3\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("vllm:kv_cache_usage_perc{model_name=\"tiny\"} 0.75\n"), std::string::npos);
  EXPECT_NE(text.find("vllm:gpu_cache_usage_perc{model_name=\"tiny\"} 0.75\n"), std::string::npos);
  EXPECT_NE(text.find("vllm:num_preemptions_total{model_name=\"tiny\"} 7\n"), std::string::npos)
      << text;
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
