// router/chat_template.h — turning a chat request into one prompt.
//
// A checkpoint that ships a chat template (engine/chat_template.h) gets its
// own: rendered as transformers renders it, and tokenised without an added
// BOS, since templates write their own. A checkpoint without one (those
// `baton make-model` writes) gets Baton's simple documented format
// (docs/API.md), after the tokenizer's BOS:
//
//   <|system|>\n{content}\n<|user|>\n{content}\n<|assistant|>\n{content}\n ... <|assistant|>\n
//
// Each message is its role tag on a line of its own, then its content and a
// newline; with add_generation_prompt the prompt ends with the assistant tag
// so the model continues as the assistant.
//
// A template Baton cannot render is never replaced by the fixed format:
// chat requests are refused with the reason (the construct and its
// position), while completions still work.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/chat_template.h"
#include "router/completion_request.h"

namespace baton::router {

std::string apply_default_chat_template(const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt = true);

class ChatPrompter {
 public:
  // Baton's fixed format.
  ChatPrompter() = default;
  // The checkpoint's template if it ships one (a warning is logged when
  // Baton cannot render it), else the fixed format. Errors only for files
  // that cannot be read.
  static Result<ChatPrompter> for_checkpoint(const std::filesystem::path& dir);

  Result<std::string> render(const ChatRequest& chat) const;
  // Whether the tokenizer's BOS goes before the rendered prompt (Baton's
  // format; a template writes its own).
  bool adds_bos() const { return !template_; }

 private:
  std::shared_ptr<const engine::ChatTemplate> template_;
  Status refusal_;  // why the checkpoint's template cannot be used
};

}  // namespace baton::router
