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

namespace {

// A model without a chat template takes the fixed format, which shows each
// message's role and content and nothing else: what it would drop is
// refused, naming the field, rather than ignored (a tool message among it:
// the format cannot show which call it answers).
Status check_fixed_format_shows(const ChatRequest& chat) {
  auto refuse = [](const std::string& field) {
    return invalid_argument("'" + field +
                            "' cannot be shown: this model has no chat template, and Baton's "
                            "fixed chat format shows only each message's role and content");
  };
  if (chat.tools.is_array() && !chat.tools.empty()) return refuse("tools");
  if (!chat.chat_template_kwargs.empty()) return refuse("chat_template_kwargs");
  for (size_t i = 0; i < chat.template_messages.size(); ++i) {
    for (const auto& [key, value] : chat.template_messages[i].items()) {
      // null, [] and {} ask for nothing (a client sending back an
      // assistant message with no tool calls).
      const bool nothing =
          value.is_null() || ((value.is_array() || value.is_object()) && value.empty());
      if (key != "role" && key != "content" && !nothing)
        return refuse("messages[" + std::to_string(i) + "]." + key);
    }
  }
  return Status::ok();
}

}  // namespace

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
  if (!template_) {
    BATON_RETURN_IF_ERROR(check_fixed_format_shows(chat));
    return apply_default_chat_template(chat.messages, chat.add_generation_prompt);
  }
  engine::ChatTemplateInputs inputs;
  inputs.messages = chat.template_messages;
  inputs.tools = chat.tools;
  inputs.add_generation_prompt = chat.add_generation_prompt;
  inputs.extra = chat.chat_template_kwargs;
  return template_->render(inputs);
}

}  // namespace baton::router
