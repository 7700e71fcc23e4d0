// engine/chat_template.h — a checkpoint's chat template: the Jinja program
// (engine/jinja/) that turns a conversation into the prompt the model was
// trained on, rendered as transformers' apply_chat_template renders it.
//
// Where it comes from, as transformers reads it: chat_template.jinja in the
// checkpoint directory, else tokenizer_config.json's "chat_template" (a
// string, or a list of {"name", "template"} where "default" is used, and
// "tool_use" when the request has tools). The special tokens the template
// sees (bos_token, eos_token, ...) are tokenizer_config.json's.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace baton::engine {

struct ChatTemplateInputs {
  // The conversation as the client sent it (key order kept: templates print
  // tool calls and tool definitions with tojson), each content a string.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  // The request's tool definitions; null without tools.
  nlohmann::ordered_json tools;
  bool add_generation_prompt = true;
  // chat_template_kwargs: further names for the template (enable_thinking).
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // NotFound when the checkpoint ships no template; InvalidArgument naming
  // the file, the position and the construct when Baton cannot render it.
  static Result<ChatTemplate> load(const std::filesystem::path& checkpoint_dir);
  // A template's source with the special tokens it sees (a JSON object of
  // names to strings).
  static Result<ChatTemplate> from_source(const std::string& source,
                                          const nlohmann::ordered_json& special_tokens,
                                          const std::string& origin = "chat template");

  // The prompt; an InvalidArgument naming the position when the template
  // fails, or raises (raise_exception) for this conversation.
  Result<std::string> render(const ChatTemplateInputs& inputs) const;

  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

 private:
  struct Impl;
  explicit ChatTemplate(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace baton::engine
