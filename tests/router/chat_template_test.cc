// What a chat template sees of a request, and which format a checkpoint's
// chats get. Rendering itself is held against jinja2 in
// tests/engine/chat_template_test.py.
#include "router/chat_template.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

namespace baton::router {
namespace {

namespace fs = std::filesystem;

TEST(ChatRequest, TemplateMessagesKeepOrderFlattenContentAndParseToolArguments) {
  auto r = parse_chat_request(R"({
    "messages": [
      {"role": "developer", "content": "sys", "zeta": 1, "alpha": 2},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": [2]}"}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}],
    "add_generation_prompt": false,
    "chat_template_kwargs": {"enable_thinking": false}})");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const auto& m = r->template_messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0].dump(), R"({"role":"system","content":"sys","zeta":1,"alpha":2})");
  EXPECT_EQ(m[1]["content"], "a\nb");
  EXPECT_TRUE(m[2]["content"].is_null());
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"].dump(), R"({"z":1,"a":[2]})");
  EXPECT_EQ(m[2]["tool_calls"][1]["function"]["arguments"], "not json");
  EXPECT_EQ(m[3]["tool_call_id"], "c1");
  EXPECT_EQ(r->messages[2].content, "");
  EXPECT_EQ(r->tools[0]["function"]["parameters"].dump(), R"({"z":1,"a":2})");
  EXPECT_FALSE(r->add_generation_prompt);
  EXPECT_EQ(r->chat_template_kwargs.dump(), R"({"enable_thinking":false})");

  auto none = parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}],
    "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"})");
  ASSERT_TRUE(none.is_ok()) << none.status().to_string();
  EXPECT_TRUE(none->tools.is_null());
}

TEST(ChatRequest, MalformedToolFieldsNameTheField) {
  struct Case {
    const char* body;
    const char* expect;
  } cases[] = {
      {R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})",
       "'messages[0].tool_calls' is for assistant messages"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]})",
       "'messages[0].tool_calls[0].function.name'"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]})",
       "'messages[0].tool_calls[0].function.arguments'"},
      {R"({"messages": [{"role": "assistant", "tool_calls": {}}]})",
       "'messages[0].tool_calls' must be a list"},
      {R"({"messages": [{"role": "tool", "content": "x", "tool_call_id": 7}]})",
       "'messages[0].tool_call_id' must be a string"},
      {R"({"messages": [{"role": "tool", "content": "x"}]})",
       "'messages[0].tool_call_id' is required for a tool message"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})",
       "'tools' must be a list"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "code"}]})",
       "'tools[0].type'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})",
       "'tools[0].function.name'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})",
       "'tool_choice'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": [1]})",
       "'chat_template_kwargs' must be an object"},
      {R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"messages": []}})",
       "'chat_template_kwargs.messages'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": "yes"})",
       "'add_generation_prompt'"},
  };
  for (const auto& c : cases) {
    auto bad = parse_chat_request(c.body);
    ASSERT_FALSE(bad.is_ok()) << c.body;
    EXPECT_NE(bad.status().message().find(c.expect), std::string::npos)
        << c.body << " -> " << bad.status().message();
  }
}

class ChatPrompterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("baton-chat-" + std::to_string(::getpid()) + "-" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  ChatRequest chat(const std::string& body) {
    auto r = parse_chat_request(body);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? *r : ChatRequest{};
  }
  fs::path dir_;
};

TEST_F(ChatPrompterTest, ACheckpointsTemplateWritesTheWholePromptWithItsSpecialTokens) {
  write("tokenizer_config.json", R"({"bos_token": {"content": "<B>"}, "eos_token": "<E>",
    "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}|{{ m.content }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}{{ eos_token }}"})");
  auto prompter = ChatPrompter::for_checkpoint(dir_);
  ASSERT_TRUE(prompter.is_ok()) << prompter.status().to_string();
  EXPECT_FALSE(prompter->adds_bos());
  auto text = prompter->render(chat(R"({"messages": [{"role": "user", "content": "hi"}]})"));
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  EXPECT_EQ(*text, "<B>[user|hi]><E>");
  text = prompter->render(
      chat(R"({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": false})"));
  ASSERT_TRUE(text.is_ok());
  EXPECT_EQ(*text, "<B>[user|hi]<E>");
}

TEST_F(ChatPrompterTest, ChatTemplateJinjaWinsAndNamedTemplatesPickToolUseForTools) {
  write("tokenizer_config.json", R"({"chat_template": [
    {"name": "default", "template": "plain"}, {"name": "tool_use", "template": "tools:{{ tools|length }}"}]})");
  auto prompter = ChatPrompter::for_checkpoint(dir_);
  ASSERT_TRUE(prompter.is_ok()) << prompter.status().to_string();
  EXPECT_EQ(*prompter->render(chat(R"({"messages": [{"role": "user", "content": "x"}]})")),
            "plain");
  EXPECT_EQ(*prompter->render(chat(R"({"messages": [{"role": "user", "content": "x"}],
    "tools": [{"type": "function", "function": {"name": "f"}}]})")),
            "tools:1");
  write("chat_template.jinja", "from the file\n");
  prompter = ChatPrompter::for_checkpoint(dir_);
  ASSERT_TRUE(prompter.is_ok());
  EXPECT_EQ(*prompter->render(chat(R"({"messages": [{"role": "user", "content": "x"}]})")),
            "from the file");
}

TEST_F(ChatPrompterTest, AnUnsupportedTemplateRefusesChatsNamingTheConstruct) {
  write("tokenizer_config.json",
        R"({"chat_template": "{% for m in messages %}\n{% include 'x' %}{% endfor %}"})");
  auto prompter = ChatPrompter::for_checkpoint(dir_);
  ASSERT_TRUE(prompter.is_ok()) << prompter.status().to_string();
  auto text = prompter->render(chat(R"({"messages": [{"role": "user", "content": "x"}]})"));
  ASSERT_FALSE(text.is_ok());
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(text.status().message().find("unsupported tag 'include'"), std::string::npos)
      << text.status().message();
  EXPECT_NE(text.status().message().find("line 2"), std::string::npos) << text.status().message();
}

TEST_F(ChatPrompterTest, ATemplatesOwnErrorIsTheRequestsError) {
  write(
      "tokenizer_config.json",
      R"({"chat_template": "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok"})");
  auto prompter = ChatPrompter::for_checkpoint(dir_);
  ASSERT_TRUE(prompter.is_ok());
  auto text = prompter->render(chat(R"({"messages": [{"role": "assistant", "content": "x"}]})"));
  ASSERT_FALSE(text.is_ok());
  EXPECT_NE(text.status().message().find("first must be user"), std::string::npos)
      << text.status().message();
}

// A request whose messages drive the template past its bounds (here, steps:
// a loop over the messages inside one over them) fails as that request's
// error, which no retry mends: invalid, not "resource exhausted" (a 429).
TEST_F(ChatPrompterTest, ARequestThatRunsTheTemplatePastItsBoundsIsTheRequestsError) {
  write(
      "tokenizer_config.json",
      R"({"chat_template": "{% for a in messages %}{% for b in messages %}{% endfor %}{% endfor %}ok"})");
  auto prompter = ChatPrompter::for_checkpoint(dir_);
  ASSERT_TRUE(prompter.is_ok());
  auto messages = [](int n) {
    nlohmann::json doc = {{"messages", nlohmann::json::array()}};
    for (int i = 0; i < n; ++i) doc["messages"].push_back({{"role", "user"}, {"content", "x"}});
    return doc.dump();
  };
  EXPECT_EQ(*prompter->render(chat(messages(100))), "ok");
  auto text = prompter->render(chat(messages(1500)));
  ASSERT_FALSE(text.is_ok());
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(text.status().message().find("steps"), std::string::npos) << text.status().message();
}

TEST_F(ChatPrompterTest, WithoutATemplateBatonsFormatFollowsTheBos) {
  write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  auto prompter = ChatPrompter::for_checkpoint(dir_);
  ASSERT_TRUE(prompter.is_ok());
  EXPECT_TRUE(prompter->adds_bos());
  EXPECT_EQ(*prompter->render(chat(R"({"messages": [{"role": "system", "content": "s"},
    {"role": "user", "content": "u"}]})")),
            "<|system|>\ns\n<|user|>\nu\n<|assistant|>\n");
}

// Without a template, what the fixed format cannot show is refused naming
// the field, not dropped: tools, the template's arguments, and a message's
// keys beyond role and content (a null one asks for nothing).
TEST_F(ChatPrompterTest, WithoutATemplateWhatTheFormatCannotShowIsRefused) {
  auto prompter = ChatPrompter::for_checkpoint(dir_);
  ASSERT_TRUE(prompter.is_ok());
  const std::string user = R"({"role": "user", "content": "u"})";
  for (const auto& [body, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"messages": [)" + user +
                R"(], "tools": [{"type": "function", "function": {"name": "f"}}]})",
            "'tools'"},
           {R"({"messages": [)" + user + R"(], "chat_template_kwargs": {"enable_thinking": true}})",
            "'chat_template_kwargs'"},
           {R"({"messages": [{"role": "user", "content": "u", "name": "ann"}]})",
            "'messages[0].name'"},
           {R"({"messages": [)" + user +
                R"(, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                 "function": {"name": "f", "arguments": "{}"}}]}]})",
            "'messages[1].tool_calls'"},
           {R"({"messages": [{"role": "tool", "content": "42", "tool_call_id": "c"}]})",
            "'messages[0].tool_call_id'"},
           {R"({"messages": [{"role": "user", "content": "u", "zeta": 1}]})",
            "'messages[0].zeta'"}}) {
    auto text = prompter->render(chat(body));
    ASSERT_FALSE(text.is_ok()) << body;
    EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument) << body;
    EXPECT_EQ(text.status().message().rfind(field + " cannot be shown", 0), 0u)
        << body << " -> " << text.status().message();
  }
  EXPECT_EQ(*prompter->render(chat(R"({"messages": [{"role": "user", "content": "u", "name": null,
    "annotations": {}}, {"role": "assistant", "content": "a", "tool_calls": []}], "tools": []})")),
            "<|user|>\nu\n<|assistant|>\na\n<|assistant|>\n");
}

TEST_F(ChatPrompterTest, ACorruptTokenizerConfigIsAnErrorNamingIt) {
  write("tokenizer_config.json", R"({"chat_template": "x")");
  auto prompter = ChatPrompter::for_checkpoint(dir_);
  ASSERT_FALSE(prompter.is_ok());
  EXPECT_NE(prompter.status().message().find("tokenizer_config.json"), std::string::npos);
}

}  // namespace
}  // namespace baton::router
