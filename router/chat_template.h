// router/chat_template.h — turning chat messages into one prompt string.
//
// Checkpoints made by `baton make-model` ship no chat template, so Baton uses
// this simple documented one (docs/API.md):
//
//   <|system|>\n{content}\n<|user|>\n{content}\n<|assistant|>\n{content}\n ... <|assistant|>\n
//
// Each message is its role tag on a line of its own, then its content and a
// newline; the prompt ends with the assistant tag so the model continues as
// the assistant. A checkpoint's own template is used when it ships one (later).
#pragma once

#include <string>
#include <vector>

#include "router/completion_request.h"

namespace baton::router {

std::string apply_default_chat_template(const std::vector<ChatMessage>& messages);

}  // namespace baton::router
