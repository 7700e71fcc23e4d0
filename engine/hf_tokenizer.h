// engine/hf_tokenizer.h — a checkpoint's tokenizer.json, encoded and decoded
// as Hugging Face's `tokenizers` library does, for byte-level BPE
// vocabularies (Llama 3, GPT-2 and SmolLM2 families; Qwen2's NFC normalizer
// is not implemented yet):
//
//  * added tokens found in the raw text first (leftmost, longest; lstrip,
//    rstrip, single_word), the text between them going through the rest;
//  * pre-tokenizers Split (a PCRE2 regex or a literal, Isolated or Removed),
//    Digits, ByteLevel (GPT-2's regex optional, add_prefix_space) and
//    Sequence;
//  * the BPE model: merges applied lowest rank first, ignore_merges (a piece
//    the vocabulary holds whole is one token);
//  * decoding through the ByteLevel decoder; special tokens decode to "".
//
// Anything else a tokenizer.json asks for (a normalizer, byte_fallback, a
// Metaspace pre-tokenizer, another model type) is refused at load with a
// message naming it; nothing falls back to bytes silently.
#pragma once

#include <filesystem>
#include <memory>

#include "common/status.h"
#include "engine/tokenizer.h"

namespace baton::engine {

inline constexpr const char* kHfTokenizerFile = "tokenizer.json";

// Loads `dir`/tokenizer.json, with tokenizer_config.json beside it when
// present (its bos_token, eos_token and add_bos_token).
Result<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::filesystem::path& dir);

}  // namespace baton::engine
