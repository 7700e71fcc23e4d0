// engine/tokenizer_steps.h — the normalizers, pre-tokenizers and decoders of
// a tokenizer.json that Baton implements, each as Hugging Face's
// `tokenizers` applies it:
//
//  * normalizers: Prepend, Replace (of a string), Sequence;
//  * pre-tokenizers: Split (a PCRE2 regex or a literal; Isolated or
//    Removed), Digits, ByteLevel (GPT-2's regex optional, add_prefix_space),
//    Metaspace (prepend_scheme always / first / never, split), Sequence;
//  * decoders: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace,
//    Sequence.
//
// Anything else is refused by the parsers with a message naming it.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <variant>
#include <vector>

#include "common/status.h"
#include "engine/pcre2_regex.h"

namespace baton::engine {

struct NormalizeStep {
  // Prepend `to` to a non-empty string, replace `from` by `to`, or NFC.
  enum class Kind { kPrepend, kReplace, kNfc } kind = Kind::kReplace;
  std::string from, to;
};

struct SplitStep {
  std::shared_ptr<Pcre2Regex> regex;
  bool removed = false;  // Removed drops the matches; Isolated keeps each as a piece
};
struct ByteLevelStep {
  bool add_prefix_space = false;
  std::shared_ptr<Pcre2Regex> regex;  // GPT-2's pattern when use_regex
};
struct MetaspaceStep {
  std::string replacement = "\u2581";
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
  bool split = true;
};
using PreTokenizeStep = std::variant<SplitStep, ByteLevelStep, MetaspaceStep>;

// A piece of text on its way through the pre-tokenizers; `at_start` when it
// begins at offset 0 of the whole input (Metaspace's "first").
struct Piece {
  std::string text;
  bool at_start = false;
};

struct DecodeStep {
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  Kind kind = Kind::kFuse;
  std::string from, to;     // Replace; Strip's content in `from`; Metaspace's replacement in `from`
  int start = 0, stop = 0;  // Strip
  bool strip_first = false;  // Metaspace: prepend_scheme is not never
};

Status parse_normalizer(const nlohmann::json& node, const std::string& name,
                        std::vector<NormalizeStep>& steps);
Status parse_pre_tokenizer(const nlohmann::json& node, const std::string& name,
                           std::vector<PreTokenizeStep>& steps);
Status parse_decoder(const nlohmann::json& node, const std::string& name,
                     std::vector<DecodeStep>& steps);

std::string normalize(std::string text, const std::vector<NormalizeStep>& steps);
// Hands each piece the pre-tokenizers make of `piece` to `emit`, in order,
// one at a time, until `emit` returns false (a caller that has seen enough
// stops the work there); false when it stopped early.
bool pre_tokenize(Piece piece, const std::vector<PreTokenizeStep>& steps,
                  const std::function<bool(Piece)>& emit);
// Turns the tokens' strings into text (the bytes of a ByteFallback run are
// kept as bytes even where they are not valid UTF-8, so a stream can hold an
// incomplete character back).
std::string decode_tokens(std::vector<std::string> tokens, const std::vector<DecodeStep>& steps);

// The "type" of a tokenizer.json component ("" when it has none).
std::string component_type(const nlohmann::json& node);

// GPT-2's byte alphabet: the character that stands for each byte.
const std::string& byte_level_char(unsigned char byte);

}  // namespace baton::engine
