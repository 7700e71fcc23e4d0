#include "router/openai_response.h"

#include <gtest/gtest.h>

#include "router/chat_template.h"

namespace baton::router {
namespace {

using nlohmann::json;

TEST(OpenAiResponse, CompletionBodyHasTheOpenAiShape) {
  auto body = completion_response(Endpoint::kCompletions, "cmpl-1", "m", 42,
                                  {{0, "ab", FinishReason::kLength}, {1, "c", FinishReason::kStop}},
                                  {5, 3});
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["id"], "cmpl-1");
  EXPECT_EQ(body["created"], 42);
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][1]["text"], "c");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["total_tokens"], 8);

  auto chat = completion_response(Endpoint::kChatCompletions, "chatcmpl-1", "m", 1,
                                  {{0, "hi", FinishReason::kStop}}, {1, 1});
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(chat["choices"][0]["message"]["content"], "hi");
}

TEST(OpenAiResponse, StreamChunksAndSse) {
  auto first =
      stream_chunk(Endpoint::kChatCompletions, "c", "m", 1, 0, "he", FinishReason::kNone, true);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  auto later =
      stream_chunk(Endpoint::kChatCompletions, "c", "m", 1, 0, "y", FinishReason::kLength, false);
  EXPECT_FALSE(later["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(later["choices"][0]["finish_reason"], "length");

  auto usage = usage_chunk(Endpoint::kCompletions, "c", "m", 1, {2, 4});
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 4);

  // Text with newlines and invalid UTF-8 still makes one well-formed event.
  std::string event = sse_event(stream_chunk(Endpoint::kCompletions, "c", "m", 1, 0,
                                             "line\nbreak\xff", FinishReason::kNone, false));
  ASSERT_EQ(event.rfind("data: ", 0), 0u);
  ASSERT_EQ(event.substr(event.size() - 2), "\n\n");
  EXPECT_EQ(event.find('\n'), event.size() - 2);
  auto parsed = json::parse(event.substr(6));
  EXPECT_EQ(parsed["choices"][0]["text"].get<std::string>().substr(0, 10), "line\nbreak");
}

TEST(ChatTemplate, RolesInOrderEndingWithAssistant) {
  std::string prompt = apply_default_chat_template(
      {{"system", "be brief"}, {"user", "hi"}, {"assistant", "yo"}, {"user", "again"}});
  EXPECT_EQ(prompt,
            "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\nyo\n<|user|>\nagain\n"
            "<|assistant|>\n");
}

}  // namespace
}  // namespace baton::router
