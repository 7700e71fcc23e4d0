// engine/hf_tokenizer.h — a checkpoint's tokenizer.json, encoded and decoded
// as Hugging Face's `tokenizers` library does, for BPE vocabularies:
// byte-level ones (Llama 3, GPT-2, SmolLM2) and SentencePiece-style ones
// with byte_fallback (Llama 2, Mistral, TinyLlama):
//
//  * added tokens found in the raw text first (leftmost, longest; lstrip,
//    rstrip, single_word), the text between them going through the rest;
//  * the normalizers, pre-tokenizers and decoders of engine/tokenizer_steps.h;
//  * the BPE model of engine/bpe_model.h;
//  * BOS from the post-processor (TemplateProcessing's leading special token)
//    or tokenizer_config.json's add_bos_token, EOS from its eos_token;
//    encode() adds neither; special tokens decode to "".
//
// Anything else a tokenizer.json asks for (Qwen2's NFC normalizer, WordPiece
// or Unigram models, other pre-tokenizers) is refused at load with a message
// naming it; nothing falls back to bytes silently.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "engine/tokenizer.h"

namespace baton::engine {

inline constexpr const char* kHfTokenizerFile = "tokenizer.json";

// Loads `dir`/tokenizer.json, with tokenizer_config.json beside it when
// present (its bos_token, eos_token and add_bos_token).
Result<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::filesystem::path& dir);
// The same from parsed tokenizer.json and tokenizer_config.json (null when
// absent); `name` names the file in errors.
Result<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const nlohmann::json& tokenizer_json,
                                                     const nlohmann::json& tokenizer_config,
                                                     const std::string& name);

}  // namespace baton::engine
