// What a node sends for a request is held to what the request asked of it.
#include "router/node_output_check.h"

#include <gtest/gtest.h>

#include <random>

namespace baton::router {
namespace {

std::vector<control::TokenLogprobs> entries(size_t count, size_t alternatives, std::mt19937& rng) {
  std::vector<control::TokenLogprobs> out(count);
  for (auto& e : out) {
    e.logprob = -float(rng() % 100) / 10;
    for (size_t k = 0; k < alternatives; ++k) {
      e.top_ids.push_back(int32_t(rng() % 1000));
      e.top_logprobs.push_back(-float(k));
    }
  }
  return out;
}

TEST(NodeOutputCheck, OutputLogprobsOnlyAsAskedAndNoMoreAlternatives) {
  std::mt19937 rng{std::random_device{}()};
  control::SamplingSpec asked;
  asked.logprobs = 1 + int32_t(rng() % 5);
  const size_t tokens = 1 + rng() % 4;
  const size_t k = size_t(asked.logprobs);
  SCOPED_TRACE("logprobs " + std::to_string(k) + ", tokens " + std::to_string(tokens));
  EXPECT_TRUE(check_output_logprobs(asked, {}, tokens).is_ok());
  EXPECT_TRUE(check_output_logprobs(asked, entries(tokens, k, rng), tokens).is_ok());
  EXPECT_TRUE(check_output_logprobs(asked, entries(tokens, rng() % k, rng), tokens).is_ok());
  EXPECT_FALSE(check_output_logprobs(asked, entries(tokens, k + 1, rng), tokens).is_ok());
  EXPECT_FALSE(check_output_logprobs(asked, entries(tokens + 1, k, rng), tokens).is_ok());
  auto unpaired = entries(tokens, k, rng);
  unpaired[rng() % tokens].top_logprobs.pop_back();
  EXPECT_FALSE(check_output_logprobs(asked, unpaired, tokens).is_ok());
  asked.logprobs = 0;
  const Status unasked = check_output_logprobs(asked, entries(tokens, 0, rng), tokens);
  EXPECT_FALSE(unasked.is_ok());
  EXPECT_NE(unasked.message().find("did not ask for"), std::string::npos) << unasked.message();
}

TEST(NodeOutputCheck, PromptLogprobsOnlyAsAskedOneAPositionAfterTheFirst) {
  std::mt19937 rng{std::random_device{}()};
  control::SamplingSpec asked;
  asked.prompt_logprobs = int32_t(rng() % 4);  // 0: the token's own only
  const size_t prompt = 2 + rng() % 30;
  const size_t k = size_t(asked.prompt_logprobs);
  SCOPED_TRACE("prompt_logprobs " + std::to_string(k) + ", prompt " + std::to_string(prompt));
  EXPECT_TRUE(check_prompt_logprobs(asked, entries(prompt - 1, k, rng), prompt).is_ok());
  EXPECT_FALSE(check_prompt_logprobs(asked, entries(prompt, k, rng), prompt).is_ok());
  EXPECT_FALSE(check_prompt_logprobs(asked, entries(prompt - 1, k + 1, rng), prompt).is_ok());
  asked.prompt_logprobs = -1;
  EXPECT_TRUE(check_prompt_logprobs(asked, {}, prompt).is_ok());
  EXPECT_FALSE(check_prompt_logprobs(asked, entries(1, 0, rng), prompt).is_ok());
}

}  // namespace
}  // namespace baton::router
