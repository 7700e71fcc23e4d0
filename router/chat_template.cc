#include "router/chat_template.h"

#include <spdlog/spdlog.h>

namespace baton::router {

std::string apply_default_chat_template(const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt) {
  std::string prompt;
  for (const auto& m : messages) {
    prompt += "<|" + m.role + "|>\n";
    prompt += m.content;
    prompt += "\n";
  }
  if (add_generation_prompt) prompt += "<|assistant|>\n";
  return prompt;
}

Result<ChatPrompter> ChatPrompter::for_checkpoint(const std::filesystem::path& dir) {
  ChatPrompter prompter;
  Result<engine::ChatTemplate> loaded = engine::ChatTemplate::load(dir);
  if (loaded.is_ok()) {
    prompter.template_ = std::make_shared<const engine::ChatTemplate>(std::move(loaded).value());
    return prompter;
  }
  switch (loaded.status().code()) {
    case StatusCode::kNotFound:
      return prompter;
    case StatusCode::kInvalidArgument:
      spdlog::warn("router: {}; chat requests are refused, completions still work",
                   loaded.status().message());
      prompter.refusal_ = loaded.status();
      return prompter;
    default:
      return loaded.status();
  }
}

Result<std::string> ChatPrompter::render(const ChatRequest& chat) const {
  if (!refusal_.is_ok()) return refusal_;
  if (!template_) return apply_default_chat_template(chat.messages, chat.add_generation_prompt);
  engine::ChatTemplateInputs inputs;
  inputs.messages = chat.template_messages;
  inputs.tools = chat.tools;
  inputs.add_generation_prompt = chat.add_generation_prompt;
  inputs.extra = chat.chat_template_kwargs;
  return template_->render(inputs);
}

}  // namespace baton::router
