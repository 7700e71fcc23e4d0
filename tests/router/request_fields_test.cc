// Every request field of OpenAI's and vLLM's completion and chat schemas is
// either honoured or refused with a 400 naming it; none is silently ignored.
// The lists below are typed in from OpenAI's API reference and vLLM's
// protocol (CompletionRequest, ChatCompletionRequest), not taken from the
// code under test.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "router/completion_request.h"

namespace baton::router {
namespace {

using nlohmann::json;

const std::set<std::string> kOpenAiCompletion = {"model",
                                                 "prompt",
                                                 "best_of",
                                                 "echo",
                                                 "frequency_penalty",
                                                 "logit_bias",
                                                 "logprobs",
                                                 "max_tokens",
                                                 "n",
                                                 "presence_penalty",
                                                 "seed",
                                                 "stop",
                                                 "stream",
                                                 "stream_options",
                                                 "suffix",
                                                 "temperature",
                                                 "top_p",
                                                 "user"};
const std::set<std::string> kOpenAiChat = {"messages",
                                           "model",
                                           "audio",
                                           "frequency_penalty",
                                           "function_call",
                                           "functions",
                                           "logit_bias",
                                           "logprobs",
                                           "max_completion_tokens",
                                           "max_tokens",
                                           "metadata",
                                           "modalities",
                                           "n",
                                           "parallel_tool_calls",
                                           "prediction",
                                           "presence_penalty",
                                           "reasoning_effort",
                                           "response_format",
                                           "seed",
                                           "service_tier",
                                           "stop",
                                           "store",
                                           "stream",
                                           "stream_options",
                                           "temperature",
                                           "tool_choice",
                                           "tools",
                                           "top_logprobs",
                                           "top_p",
                                           "user",
                                           "web_search_options"};
const std::set<std::string> kVllmExtras = {"use_beam_search",
                                           "top_k",
                                           "min_p",
                                           "repetition_penalty",
                                           "length_penalty",
                                           "stop_token_ids",
                                           "include_stop_str_in_output",
                                           "ignore_eos",
                                           "min_tokens",
                                           "skip_special_tokens",
                                           "spaces_between_special_tokens",
                                           "truncate_prompt_tokens",
                                           "allowed_token_ids",
                                           "prompt_logprobs",
                                           "bad_words",
                                           "add_special_tokens",
                                           "response_format",
                                           "guided_json",
                                           "guided_regex",
                                           "guided_choice",
                                           "guided_grammar",
                                           "guided_decoding_backend",
                                           "guided_whitespace_pattern",
                                           "structured_outputs",
                                           "priority",
                                           "request_id",
                                           "logits_processors",
                                           "return_tokens_as_token_ids",
                                           "return_token_ids",
                                           "cache_salt",
                                           "kv_transfer_params",
                                           "vllm_xargs",
                                           "echo",
                                           "add_generation_prompt",
                                           "continue_final_message",
                                           "documents",
                                           "chat_template",
                                           "chat_template_kwargs",
                                           "mm_processor_kwargs",
                                           "best_of"};

// Fields Baton implements (completion_request.cc reads them).
const std::set<std::string> kSamplingExtras = {
    "min_p",      "presence_penalty", "frequency_penalty", "repetition_penalty",
    "min_tokens", "logit_bias"};
// Read by both endpoints, then by each alone.
const std::set<std::string> kImplementedShared = {
    "model",   "max_tokens", "temperature",    "top_p",      "top_k",
    "seed",    "stop",       "stop_token_ids", "ignore_eos", "n",
    "best_of", "stream",     "stream_options", "logprobs",   "return_tokens_as_token_ids"};
std::set<std::string> with_shared(std::set<std::string> own) {
  own.insert(kImplementedShared.begin(), kImplementedShared.end());
  return own;
}
const std::set<std::string> kImplementedCompletion = with_shared({"prompt", "echo"});
const std::set<std::string> kImplementedChat =
    with_shared({"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                 "add_generation_prompt", "chat_template_kwargs"});
// Changing nothing generated, so accepted whatever their value.
const std::set<std::string> kInformational = {"user", "metadata", "store", "service_tier",
                                              "request_id"};

// A value that asks for something (a penalty, a bias, a grammar, ...).
json asking_value(const std::string& field) {
  if (field == "logit_bias") return json{{"50", 5}};
  if (field == "response_format") return json{{"type", "json_object"}};
  if (field == "repetition_penalty" || field == "length_penalty") return 1.3;
  if (field == "skip_special_tokens" || field == "spaces_between_special_tokens" ||
      field == "parallel_tool_calls") {
    return false;
  }
  if (field == "echo" || field == "use_beam_search" || field == "include_stop_str_in_output" ||
      field == "continue_final_message" || field == "return_tokens_as_token_ids" ||
      field == "return_token_ids") {
    return true;
  }
  if (field == "add_special_tokens") return "yes";
  if (field == "suffix") return "tail";
  if (field == "functions" || field == "allowed_token_ids" || field == "bad_words" ||
      field == "documents" || field == "modalities") {
    return json::array({1});
  }
  return 0.5;  // penalties, min_p, min_tokens, and anything else
}

void check_endpoint(bool chat) {
  std::set<std::string> fields = chat ? kOpenAiChat : kOpenAiCompletion;
  fields.insert(kVllmExtras.begin(), kVllmExtras.end());
  const std::set<std::string>& implemented = chat ? kImplementedChat : kImplementedCompletion;
  const json base =
      chat ? json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}} : json{{"prompt", "hi"}};
  int refused = 0;
  for (const std::string& field : fields) {
    if (implemented.contains(field) || kSamplingExtras.contains(field) || field == "messages" ||
        field == "prompt") {
      continue;
    }
    json body = base;
    body[field] = asking_value(field);
    const Status status = chat ? parse_chat_request(body.dump()).status()
                               : parse_completion_request(body.dump()).status();
    if (kInformational.contains(field)) {
      EXPECT_TRUE(status.is_ok()) << field << ": " << status.message();
      continue;
    }
    ASSERT_FALSE(status.is_ok()) << (chat ? "chat " : "completions ") << field
                                 << " was silently accepted";
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("'" + field + "'"), std::string::npos) << status.message();
    ++refused;
  }
  EXPECT_GT(refused, 30);
}

TEST(RequestFields, EveryFieldOfTheSchemasIsHonouredOrRefused) {
  check_endpoint(false);
  check_endpoint(true);
}

TEST(RequestFields, NeutralValuesThatAskForNothingAreAccepted) {
  const json neutral = {{"best_of", 2},
                        {"n", 2},
                        {"echo", false},
                        {"response_format", {{"type", "text"}}},
                        {"skip_special_tokens", true},
                        {"user", "u-1"},
                        {"suffix", nullptr}};
  json completion = neutral;
  completion["prompt"] = "hi";
  auto c = parse_completion_request(completion.dump());
  EXPECT_TRUE(c.is_ok()) << c.status().message();
  json chat = neutral;
  chat.erase("suffix");
  chat["messages"] = {{{"role", "user"}, {"content", "hi"}}};
  chat["parallel_tool_calls"] = true;
  auto h = parse_chat_request(chat.dump());
  EXPECT_TRUE(h.is_ok()) << h.status().message();
}

// best_of: at least n, at most the largest n, and above n not streamed
// (the best are known only at the end).
TEST(RequestFields, BestOfIsAtLeastNAndNotStreamedAboveIt) {
  const auto parsed = [](const json& extra) {
    json body = {{"prompt", "hi"}};
    body.update(extra);
    return parse_completion_request(body.dump());
  };
  auto ok = parsed({{"n", 2}, {"best_of", 5}});
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_EQ(ok->sampling.n, 2);
  EXPECT_EQ(ok->sampling.best_of, 5);
  auto plain = parsed({{"n", 3}});
  ASSERT_TRUE(plain.is_ok());
  EXPECT_EQ(plain->sampling.best_of, 3);
  for (const json& bad : {json{{"n", 3}, {"best_of", 2}}, json{{"best_of", 0}},
                          json{{"best_of", 1000}}, json{{"best_of", 2}, {"stream", true}}}) {
    const auto refused = parsed(bad);
    ASSERT_FALSE(refused.is_ok()) << bad.dump();
    EXPECT_NE(refused.status().message().find("best_of"), std::string::npos)
        << refused.status().message();
  }
  EXPECT_TRUE(parsed({{"n", 2}, {"best_of", 2}, {"stream", true}}).is_ok());
}

// echo: completions put the prompt's text before the choice's, and with
// logprobs its tokens' log-probabilities before the choice's; chat has none.
TEST(RequestFields, EchoOnCompletionsOnly) {
  auto echo = parse_completion_request(json{{"prompt", "hi"}, {"echo", true}}.dump());
  ASSERT_TRUE(echo.is_ok()) << echo.status().message();
  EXPECT_TRUE(echo->sampling.echo);
  const auto with_logprobs =
      parse_completion_request(json{{"prompt", "hi"}, {"echo", true}, {"logprobs", 2}}.dump());
  ASSERT_TRUE(with_logprobs.is_ok()) << with_logprobs.status().message();
  EXPECT_TRUE(with_logprobs->sampling.echo);
  EXPECT_EQ(with_logprobs->sampling.logprobs, 2);
  const auto chat = parse_chat_request(
      json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"echo", true}}.dump());
  ASSERT_FALSE(chat.is_ok());
  EXPECT_NE(chat.status().message().find("'echo'"), std::string::npos);
}

}  // namespace
}  // namespace baton::router
