#include "router/chat_template.h"

namespace baton::router {

std::string apply_default_chat_template(const std::vector<ChatMessage>& messages) {
  std::string prompt;
  for (const auto& m : messages) {
    prompt += "<|" + m.role + "|>\n";
    prompt += m.content;
    prompt += "\n";
  }
  prompt += "<|assistant|>\n";
  return prompt;
}

}  // namespace baton::router
