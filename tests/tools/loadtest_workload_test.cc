// The load tester's request lists: seeded random and shared-prefix prompts,
// shards of one list, request bodies, and the ShareGPT reader on valid and
// malformed files.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "tools/loadtest/sharegpt.h"
#include "tools/loadtest/workload.h"

namespace baton::loadtest {
namespace {

TEST(Workload, RandomPromptsHaveExactLengthsAndValidIds) {
  auto requests = random_requests(50, {.input_len = 32, .output_len = 16}, {.seed = 3});
  ASSERT_TRUE(requests.is_ok()) << requests.status().to_string();
  ASSERT_EQ(requests->size(), 50u);
  for (const BenchRequest& r : *requests) {
    EXPECT_EQ(r.prompt_ids.size(), 32u);
    EXPECT_EQ(r.prompt_len, 32);
    EXPECT_EQ(r.output_len, 16);
    EXPECT_TRUE(r.prompt_text.empty());
    for (int32_t id : r.prompt_ids) {
      EXPECT_GE(id, kFirstPlainTokenId);
      EXPECT_LT(id, kDefaultVocabSize);
    }
  }
  EXPECT_NE((*requests)[0].prompt_ids, (*requests)[1].prompt_ids);
}

// Lengths no context has, or runs too large to hold, are refused before
// anything is built (the run would otherwise grow without bound).
TEST(Workload, RunsTooLargeToHoldAreRefusedNamingTheFlags) {
  for (const auto& [made, says] :
       std::vector<std::pair<Result<std::vector<BenchRequest>>, std::string>>{
           {random_requests(1, {.input_len = int64_t(1) << 40, .output_len = 1}, {}),
            "--random-input-len"},
           {random_requests(1, {.input_len = 1, .output_len = 1, .prefix_len = int64_t(1) << 30},
                            {}),
            "--random-prefix-len"},
           {random_requests(int64_t(1) << 30, {.input_len = 1024, .output_len = 1}, {}),
            "--num-prompts 1073741824"},
           {prefix_requests(1, {.prefix_len = int64_t(1) << 40}, {}), "--prefix-len"},
           {prefix_requests(int64_t(1) << 22, {.prefix_len = 256, .suffix_len = 256}, {}),
            "a run holds in memory"}}) {
    ASSERT_FALSE(made.is_ok()) << says;
    EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(made.status().message().find(says), std::string::npos) << made.status().message();
  }
  // Within the bounds, a large prompt is built whole.
  auto large = random_requests(1, {.input_len = 100000, .output_len = 1}, {});
  ASSERT_TRUE(large.is_ok()) << large.status().to_string();
  EXPECT_EQ((*large)[0].prompt_ids.size(), 100000u);
}

TEST(Workload, RandomListIsReproducibleForASeed) {
  RandomWorkload w{.input_len = 100, .output_len = 50, .range_ratio = 0.5};
  auto a = random_requests(20, w, {.seed = 7});
  auto b = random_requests(20, w, {.seed = 7});
  auto c = random_requests(20, w, {.seed = 8});
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ((*a)[i].prompt_ids, (*b)[i].prompt_ids);
    EXPECT_EQ((*a)[i].output_len, (*b)[i].output_len);
  }
  EXPECT_NE((*a)[0].prompt_ids, (*c)[0].prompt_ids);
}

// --random-prefix-len: every prompt starts with the same prefix, then its
// own tokens; without one, a seed gives the list it always gave.
TEST(Workload, RandomPrefixIsSharedAndOptional) {
  const uint64_t seed = std::random_device{}();
  auto with =
      random_requests(12, {.input_len = 9, .output_len = 4, .prefix_len = 6}, {.seed = seed});
  ASSERT_TRUE(with.is_ok()) << with.status().to_string();
  const std::vector<int32_t> prefix((*with)[0].prompt_ids.begin(),
                                    (*with)[0].prompt_ids.begin() + 6);
  std::set<std::vector<int32_t>> suffixes;
  for (const BenchRequest& r : *with) {
    ASSERT_EQ(r.prompt_ids.size(), 15u);
    EXPECT_EQ(r.prompt_len, 15);
    EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), r.prompt_ids.begin()));
    suffixes.insert(std::vector<int32_t>(r.prompt_ids.begin() + 6, r.prompt_ids.end()));
  }
  EXPECT_EQ(suffixes.size(), 12u);  // the rest is each prompt's own
  auto without = random_requests(12, {.input_len = 9, .output_len = 4}, {.seed = seed});
  auto zero =
      random_requests(12, {.input_len = 9, .output_len = 4, .prefix_len = 0}, {.seed = seed});
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ((*without)[i].prompt_ids, (*zero)[i].prompt_ids);
  EXPECT_FALSE(random_requests(1, {.prefix_len = -1}, {}).is_ok());
}

TEST(Workload, RangeRatioBoundsLengths) {
  auto requests =
      random_requests(400, {.input_len = 100, .output_len = 10, .range_ratio = 0.5}, {.seed = 1});
  std::set<int64_t> inputs;
  for (const BenchRequest& r : *requests) {
    EXPECT_GE(r.prompt_len, 50);
    EXPECT_LE(r.prompt_len, 150);
    EXPECT_GE(r.output_len, 5);
    EXPECT_LE(r.output_len, 15);
    inputs.insert(r.prompt_len);
  }
  EXPECT_GT(inputs.size(), 50u);  // spread over the range, not one value
  EXPECT_FALSE(random_requests(1, {.range_ratio = 1.0}, {}).is_ok());
  EXPECT_FALSE(random_requests(1, {.input_len = 0}, {}).is_ok());
  EXPECT_FALSE(random_requests(1, {}, {.vocab_size = 3}).is_ok());
}

TEST(Workload, TextPromptsForChat) {
  auto requests =
      random_requests(3, {.input_len = 12, .output_len = 4}, {.text_prompts = true, .seed = 2});
  for (const BenchRequest& r : *requests) {
    EXPECT_TRUE(r.prompt_ids.empty());
    EXPECT_EQ(r.prompt_text.size(), 12u);
    EXPECT_TRUE(std::all_of(r.prompt_text.begin(), r.prompt_text.end(),
                            [](char c) { return c >= 'a' && c <= 'z'; }));
  }
}

TEST(Workload, PrefixGroupsShareTheirPrefix) {
  PrefixWorkload w{.prefix_len = 20, .suffix_len = 5, .output_len = 3, .num_prefixes = 3};
  auto requests = prefix_requests(30, w, {.seed = 4});
  ASSERT_TRUE(requests.is_ok());
  std::set<std::vector<int32_t>> prefixes;
  for (const BenchRequest& r : *requests) {
    ASSERT_EQ(r.prompt_ids.size(), 25u);
    EXPECT_EQ(r.prompt_len, 25);
    EXPECT_EQ(r.output_len, 3);
    prefixes.insert(std::vector<int32_t>(r.prompt_ids.begin(), r.prompt_ids.begin() + 20));
  }
  EXPECT_EQ(prefixes.size(), 3u);
}

TEST(Workload, ShardsSplitOneList) {
  EXPECT_EQ(shard_indices(7, {0, 3}), (std::vector<size_t>{0, 3, 6}));
  EXPECT_EQ(shard_indices(7, {2, 3}), (std::vector<size_t>{2, 5}));
  EXPECT_EQ(shard_indices(3, {0, 1}), (std::vector<size_t>{0, 1, 2}));
  auto shard = parse_shard("1/4");
  ASSERT_TRUE(shard.is_ok());
  EXPECT_EQ(shard->index, 1);
  EXPECT_EQ(shard->count, 4);
  for (const char* bad : {"4/4", "-1/2", "1", "a/b", "1/2x", "1/0", ""})
    EXPECT_FALSE(parse_shard(bad).is_ok()) << bad;
}

TEST(Workload, RequestBodiesStreamWithUsage) {
  BenchRequest ids{.prompt_ids = {5, 6, 7}, .prompt_len = 3, .output_len = 9};
  auto body = request_body(ids, Endpoint::kCompletions, "tiny", {});
  EXPECT_EQ(body["model"], "tiny");
  EXPECT_EQ(body["prompt"], nlohmann::json({5, 6, 7}));
  EXPECT_EQ(body["max_tokens"], 9);
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  BenchRequest text{.prompt_text = "hi", .prompt_len = 2, .output_len = 1};
  auto chat = request_body(text, Endpoint::kChatCompletions, "m", {});
  EXPECT_EQ(chat["messages"][0]["content"], "hi");
  EXPECT_FALSE(chat.contains("prompt"));
  EXPECT_TRUE(parse_endpoint("/v1/chat/completions").is_ok());
  EXPECT_FALSE(parse_endpoint("/v1/embeddings").is_ok());
}

const char* kValidJsonl =
    R"({"id": "a", "conversations": [{"from": "human", "value": "Hello?"}, {"from": "gpt", "value": "Hi there"}]})"
    "\n\n"
    R"({"conversations": [{"from": "human", "value": "alone"}]})"
    "\n"
    R"({"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}, {"from": "human", "value": "more"}]})"
    "\n";

TEST(ShareGpt, ADatasetThatIsNotARegularFileIsRefusedNotReadWithoutEnd) {
  for (const char* path : {"/dev/zero", "/"}) {
    auto data = read_sharegpt(path);
    ASSERT_FALSE(data.is_ok()) << path;
    EXPECT_NE(data.status().message().find(path), std::string::npos) << data.status().message();
  }
}

TEST(ShareGpt, ReadsPromptsAndRepliesAndSkipsShortConversations) {
  auto data = parse_sharegpt(kValidJsonl, "data.jsonl");
  ASSERT_TRUE(data.is_ok()) << data.status().to_string();
  ASSERT_EQ(data->conversations.size(), 2u);
  EXPECT_EQ(data->conversations[0].prompt, "Hello?");
  EXPECT_EQ(data->conversations[0].reply, "Hi there");
  EXPECT_EQ(data->conversations[1].prompt, "Q");
  EXPECT_EQ(data->skipped, 1);

  auto requests = sharegpt_requests(5, data->conversations, 0, 1);
  ASSERT_TRUE(requests.is_ok());
  ASSERT_EQ(requests->size(), 5u);  // two conversations, reused
  for (const BenchRequest& r : *requests) {
    EXPECT_EQ(r.output_len, r.prompt_text == "Hello?" ? 8 : 1);  // the reply's bytes
    EXPECT_EQ(r.prompt_len, int64_t(r.prompt_text.size()));
  }
  EXPECT_EQ((*sharegpt_requests(1, data->conversations, 32, 1))[0].output_len, 32);
}

TEST(ShareGpt, ReadsTheOriginalJsonArrayLayout) {
  auto data = parse_sharegpt(
      R"([{"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "yz"}]}])",
      "sg.json");
  ASSERT_TRUE(data.is_ok()) << data.status().to_string();
  EXPECT_EQ(data->conversations.size(), 1u);
}

void expect_error(const std::string& text, const std::string& message) {
  auto data = parse_sharegpt(text, "d.jsonl");
  ASSERT_FALSE(data.is_ok()) << text;
  EXPECT_EQ(data.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(data.status().message().find(message), std::string::npos)
      << data.status().message() << " does not contain " << message;
}

TEST(ShareGpt, MalformedFilesGiveErrorsNamingTheLineAndField) {
  const std::string good =
      R"({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]})";
  expect_error(good + "\n{not json\n", "d.jsonl:2: not valid JSON");
  expect_error(good + "\n[1, 2]\n", "d.jsonl:2: expected a JSON object");
  expect_error(R"({"turns": []})", "d.jsonl:1: no \"conversations\" field");
  expect_error(R"({"conversations": "hi"})", "d.jsonl:1: \"conversations\" is not a list");
  expect_error(
      R"({"conversations": [{"from": "human", "value": 3}, {"from": "gpt", "value": "b"}]})",
      "d.jsonl:1: conversations[0].value is not a string");
  expect_error(R"({"conversations": [{"from": "human", "value": "a"}, {"value": "b"}]})",
               "d.jsonl:1: conversations[1] has no \"from\"");
  expect_error(R"({"conversations": ["a", "b"]})", "conversations[0] is not an object");
  expect_error("", "d.jsonl: no conversation with a prompt and a reply");
  expect_error(R"({"conversations": [{"from": "human", "value": "a"}]})", "(1 skipped)");
  expect_error("[{\"conversations\": 1}", "d.jsonl: not a valid JSON array");
  expect_error("[{\"conversations\": []}, 5]", "d.jsonl: entry 1: expected a JSON object");
  auto missing = read_sharegpt("/nonexistent/sharegpt.jsonl");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace baton::loadtest
