// router/incremental_text.h — a generation's text, grown token by token
// without decoding the whole output again at every update.
//
// Re-decoding every token at every update costs O(n^2) over a long output:
// 4k tokens re-decoded 4k times. As vLLM does, only a few tokens before the
// new ones are decoded again, as context: the new text is what decoding the
// window adds to decoding the window without the new tokens. That is exact
// for tokenizers whose text for a token depends on at most that much left
// context (byte-level BPE: none; SentencePiece's leading-space rule: one
// token), and it falls back to decoding everything if the window's text ever
// fails to extend its prefix's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace baton::router {

using DecodeFn = std::function<std::string(const std::vector<int32_t>&)>;

// Tokens decoded again before the new ones, as context.
inline constexpr size_t kDetokenizeContextTokens = 6;

// Appends to `text` (the text of tokens [0, decoded)) the text of tokens
// [decoded, tokens.size()) and sets `decoded` to tokens.size(). Returns false
// when it had to decode everything again (then `text` may differ anywhere).
// `lead` (the prompt's last tokens) is the context the first tokens are read
// after, as vLLM reads an output after its prompt: a SentencePiece decoder
// strips the leading space of a text's first token, which an output's first
// token keeps.
bool append_decoded(const std::vector<int32_t>& tokens, size_t& decoded, std::string& text,
                    const DecodeFn& decode, const std::vector<int32_t>& lead = {});

}  // namespace baton::router
