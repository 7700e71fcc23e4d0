#include "engine/tokenizer_steps.h"

#include <array>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "engine/unicode_nfc.h"
#include "engine/utf8.h"

namespace baton::engine {
namespace {

// More characters than a Strip decoder could ever meet at one end of a token.
constexpr uint64_t kMaxStripCount = 1 << 20;

using nlohmann::json;

// GPT-2's pre-tokenizer pattern, what ByteLevel's use_regex splits by.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's reversible map of the 256 bytes onto printable characters.
struct ByteAlphabet {
  std::array<std::string, 256> utf8;
  std::unordered_map<uint32_t, uint8_t> to_byte;  // code point -> byte
};

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet = [] {
    ByteAlphabet a;
    std::array<bool, 256> printable{};
    for (int b = '!'; b <= '~'; ++b) printable[size_t(b)] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[size_t(b)] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[size_t(b)] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = printable[size_t(b)] ? uint32_t(b) : next++;
      utf8::append(cp, a.utf8[size_t(b)]);
      a.to_byte[cp] = uint8_t(b);
    }
    return a;
  }();
  return alphabet;
}

// tokenizers matches its patterns with Oniguruma, where \s is Unicode's
// White_Space; PCRE2's \s also takes U+180E (a format character since
// Unicode 6.3). Spelling the set out makes the two agree.
constexpr const char* kWhiteSpaceSet =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

std::string with_unicode_white_space(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') {
        out += in_class ? std::string(kWhiteSpaceSet) : "[" + std::string(kWhiteSpaceSet) + "]";
      } else if (next == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpaceSet) + "]";
      } else {
        out += c;
        out += next;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' first in a class (after an optional '^') is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

// A pattern object {"String": s} or {"Regex": r}; only strings where
// `regex_ok` is false.
Status read_pattern(const json& node, bool regex_ok, const std::string& what, std::string& text,
                    bool& is_regex) {
  const auto pattern = node.find("pattern");
  if (pattern == node.end() || !pattern->is_object()) return data_loss(what + " has no pattern");
  if (pattern->contains("String") && (*pattern)["String"].is_string()) {
    text = (*pattern)["String"].get<std::string>();
    is_regex = false;
    return Status::ok();
  }
  if (pattern->contains("Regex") && (*pattern)["Regex"].is_string()) {
    if (!regex_ok) return unimplemented(what + " with a Regex pattern is not supported");
    text = (*pattern)["Regex"].get<std::string>();
    is_regex = true;
    return Status::ok();
  }
  return data_loss(what + " has no String or Regex pattern");
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = s.find(from, at)) != std::string::npos; at = hit + from.size()) {
    out.append(s, at, hit - at);
    out += to;
  }
  out.append(s, at, std::string::npos);
  s = std::move(out);
}

// The pieces `regex` cuts `piece` into, each handed to `emit` until it returns false.
bool split_by(const Pcre2Regex& regex, bool removed, const Piece& piece,
              const std::function<bool(Piece)>& emit) {
  size_t at = 0;
  auto part = [&](size_t begin, size_t end) {
    return emit({piece.text.substr(begin, end - begin), piece.at_start && begin == 0});
  };
  const bool whole = regex.for_each_match(piece.text, [&](size_t begin, size_t end) {
    if (begin > at && !part(at, begin)) return false;
    if (!removed && !part(begin, end)) return false;
    at = end;
    return true;
  });
  return whole && (at >= piece.text.size() || part(at, piece.text.size()));
}

std::string to_byte_level(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char c : raw) out += byte_alphabet().utf8[c];
  return out;
}

}  // namespace

const std::string& byte_level_char(unsigned char byte) { return byte_alphabet().utf8[byte]; }

std::string component_type(const json& node) {
  return node.is_object() && node.contains("type") && node["type"].is_string()
             ? node["type"].get<std::string>()
             : "";
}

Status parse_normalizer(const json& node, const std::string& name,
                        std::vector<NormalizeStep>& steps) {
  if (node.is_null()) return Status::ok();
  const std::string type = component_type(node);
  if (type == "Sequence") {
    if (!node.contains("normalizers") || !node["normalizers"].is_array()) {
      return data_loss(name + ": normalizer Sequence without a normalizers list");
    }
    for (const auto& step : node["normalizers"]) {
      BATON_RETURN_IF_ERROR(parse_normalizer(step, name, steps));
    }
    return Status::ok();
  }
  if (type == "Prepend" && node.contains("prepend") && node["prepend"].is_string()) {
    NormalizeStep step;
    step.kind = NormalizeStep::Kind::kPrepend;
    step.to = node["prepend"].get<std::string>();
    steps.push_back(std::move(step));
    return Status::ok();
  }
  if (type == "Replace" && node.contains("content") && node["content"].is_string()) {
    NormalizeStep step;
    step.to = node["content"].get<std::string>();
    bool is_regex = false;
    BATON_RETURN_IF_ERROR(
        read_pattern(node, false, name + ": normalizer Replace", step.from, is_regex));
    steps.push_back(std::move(step));
    return Status::ok();
  }
  if (type == "NFC") {
    BATON_RETURN_IF_ERROR(nfc_available().with_context(name + ": normalizer NFC"));
    NormalizeStep step;
    step.kind = NormalizeStep::Kind::kNfc;
    steps.push_back(std::move(step));
    return Status::ok();
  }
  return unimplemented(name + ": normalizer '" + type + "' is not supported");
}

Status parse_pre_tokenizer(const json& node, const std::string& name,
                           std::vector<PreTokenizeStep>& steps) {
  if (node.is_null()) return Status::ok();
  const std::string type = component_type(node);
  if (type == "Sequence") {
    if (!node.contains("pretokenizers") || !node["pretokenizers"].is_array()) {
      return data_loss(name + ": pre_tokenizer Sequence without a pretokenizers list");
    }
    for (const auto& step : node["pretokenizers"]) {
      BATON_RETURN_IF_ERROR(parse_pre_tokenizer(step, name, steps));
    }
    return Status::ok();
  }
  if (type == "ByteLevel") {
    ByteLevelStep step;
    step.add_prefix_space = node.value("add_prefix_space", false);
    if (node.value("use_regex", true)) {
      BATON_ASSIGN_OR_RETURN(Pcre2Regex regex,
                             Pcre2Regex::compile(with_unicode_white_space(kGpt2Pattern)));
      step.regex = std::make_shared<Pcre2Regex>(std::move(regex));
    }
    steps.emplace_back(std::move(step));
    return Status::ok();
  }
  if (type == "Digits") {
    // Rust's char::is_numeric, each digit alone or runs of them, isolated.
    BATON_ASSIGN_OR_RETURN(
        Pcre2Regex regex,
        Pcre2Regex::compile(node.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+"));
    steps.emplace_back(SplitStep{std::make_shared<Pcre2Regex>(std::move(regex)), false});
    return Status::ok();
  }
  if (type == "Metaspace") {
    MetaspaceStep step;
    if (node.contains("replacement") && node["replacement"].is_string()) {
      step.replacement = node["replacement"].get<std::string>();
    }
    step.split = node.value("split", true);
    std::string scheme = node.value("prepend_scheme", "");
    if (scheme.empty()) scheme = node.value("add_prefix_space", true) ? "always" : "never";
    if (scheme == "always") {
      step.prepend = MetaspaceStep::Prepend::kAlways;
    } else if (scheme == "first") {
      step.prepend = MetaspaceStep::Prepend::kFirst;
    } else if (scheme == "never") {
      step.prepend = MetaspaceStep::Prepend::kNever;
    } else {
      return unimplemented(name + ": Metaspace prepend_scheme '" + scheme + "'");
    }
    steps.emplace_back(std::move(step));
    return Status::ok();
  }
  if (type == "Split") {
    if (node.value("invert", false)) {
      return unimplemented(name + ": pre_tokenizer Split with invert is not supported");
    }
    const std::string behavior = node.value("behavior", "");
    if (behavior != "Isolated" && behavior != "Removed") {
      return unimplemented(name + ": pre_tokenizer Split behavior '" + behavior +
                           "' is not supported (Isolated and Removed are)");
    }
    std::string pattern;
    bool is_regex = false;
    BATON_RETURN_IF_ERROR(
        read_pattern(node, true, name + ": pre_tokenizer Split", pattern, is_regex));
    auto regex = is_regex ? Pcre2Regex::compile(with_unicode_white_space(pattern))
                          : Pcre2Regex::literal(pattern);
    if (!regex.is_ok()) return regex.status().with_context(name);
    steps.emplace_back(
        SplitStep{std::make_shared<Pcre2Regex>(std::move(regex).value()), behavior == "Removed"});
    return Status::ok();
  }
  return unimplemented(name + ": pre_tokenizer '" + type + "' is not supported");
}

Status parse_decoder(const json& node, const std::string& name, std::vector<DecodeStep>& steps) {
  const std::string type = component_type(node);
  using Kind = DecodeStep::Kind;
  if (type == "Sequence") {
    if (!node.contains("decoders") || !node["decoders"].is_array()) {
      return data_loss(name + ": decoder Sequence without a decoders list");
    }
    for (const auto& step : node["decoders"]) {
      BATON_RETURN_IF_ERROR(parse_decoder(step, name, steps));
    }
    return Status::ok();
  }
  DecodeStep step;
  if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
  } else if (type == "ByteFallback") {
    step.kind = Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Kind::kFuse;
  } else if (type == "Replace" && node.contains("content") && node["content"].is_string()) {
    step.kind = Kind::kReplace;
    step.to = node["content"].get<std::string>();
    bool is_regex = false;
    BATON_RETURN_IF_ERROR(
        read_pattern(node, false, name + ": decoder Replace", step.from, is_regex));
  } else if (type == "Strip" && node.contains("content") && node["content"].is_string()) {
    step.kind = Kind::kStrip;
    step.from = node["content"].get<std::string>();
    // Counts of characters (usize in `tokenizers`): a float or a huge
    // number is a corrupt file, not a cast.
    for (auto [key, out] : {std::pair{"start", &step.start}, std::pair{"stop", &step.stop}}) {
      const auto it = node.find(key);
      if (it == node.end()) continue;
      if (!it->is_number_unsigned() || it->get<uint64_t>() > kMaxStripCount) {
        return data_loss(name + ": decoder Strip " + key + " must be a count of at most " +
                         std::to_string(kMaxStripCount) + ", got " + it->dump().substr(0, 40));
      }
      *out = int(it->get<uint64_t>());
    }
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    step.from = node.contains("replacement") && node["replacement"].is_string()
                    ? node["replacement"].get<std::string>()
                    : "\u2581";
    std::string scheme = node.value("prepend_scheme", "");
    if (scheme.empty()) scheme = node.value("add_prefix_space", true) ? "always" : "never";
    step.strip_first = scheme != "never";
  } else {
    return unimplemented(name + ": decoder '" + type + "' is not supported");
  }
  steps.push_back(std::move(step));
  return Status::ok();
}

std::string normalize(std::string text, const std::vector<NormalizeStep>& steps) {
  for (const auto& step : steps) {
    switch (step.kind) {
      case NormalizeStep::Kind::kPrepend:
        if (!text.empty()) text.insert(0, step.to);
        break;
      case NormalizeStep::Kind::kReplace:
        replace_all(text, step.from, step.to);
        break;
      case NormalizeStep::Kind::kNfc:
        text = to_nfc(text);
        break;
    }
  }
  return text;
}

namespace {

// Steps `step` onwards over one piece; each step's empty pieces are dropped.
bool pre_tokenize_from(size_t step, Piece piece, const std::vector<PreTokenizeStep>& steps,
                       const std::function<bool(Piece)>& emit) {
  if (step == steps.size()) return emit(std::move(piece));
  const std::function<bool(Piece)> next = [&](Piece part) {
    return part.text.empty() || pre_tokenize_from(step + 1, std::move(part), steps, emit);
  };
  if (const auto* split = std::get_if<SplitStep>(&steps[step])) {
    return split_by(*split->regex, split->removed, piece, next);
  }
  if (const auto* level = std::get_if<ByteLevelStep>(&steps[step])) {
    if (level->add_prefix_space && !piece.text.starts_with(' ')) piece.text.insert(0, 1, ' ');
    if (!level->regex) return next({to_byte_level(piece.text), piece.at_start});
    return split_by(*level->regex, false, piece, [&](Piece part) {
      return next({to_byte_level(part.text), part.at_start});
    });
  }
  const auto& meta = std::get<MetaspaceStep>(steps[step]);
  replace_all(piece.text, " ", meta.replacement);
  const bool prepend = meta.prepend == MetaspaceStep::Prepend::kAlways ||
                       (meta.prepend == MetaspaceStep::Prepend::kFirst && piece.at_start);
  if (prepend && !piece.text.starts_with(meta.replacement)) piece.text.insert(0, meta.replacement);
  if (!meta.split) return next(std::move(piece));
  // MergedWithNext: each replacement character starts a new piece.
  size_t begin = 0;
  for (size_t hit = piece.text.find(meta.replacement, 1); hit != std::string::npos;
       hit = piece.text.find(meta.replacement, hit + meta.replacement.size())) {
    if (!next({piece.text.substr(begin, hit - begin), piece.at_start && begin == 0})) return false;
    begin = hit;
  }
  return next({piece.text.substr(begin), piece.at_start && begin == 0});
}

}  // namespace

bool pre_tokenize(Piece piece, const std::vector<PreTokenizeStep>& steps,
                  const std::function<bool(Piece)>& emit) {
  return pre_tokenize_from(0, std::move(piece), steps, emit);
}

std::string decode_tokens(std::vector<std::string> tokens, const std::vector<DecodeStep>& steps) {
  using Kind = DecodeStep::Kind;
  for (const auto& step : steps) {
    switch (step.kind) {
      case Kind::kByteLevel:
        for (auto& token : tokens) {
          // Each alphabet character back to its byte; any other character
          // (an added token's) as it is.
          std::string bytes;
          for (size_t i = 0; i < token.size();) {
            const size_t n = utf8::length_at(token, i);
            auto it = byte_alphabet().to_byte.find(utf8::decode_at(token, i, n));
            if (it != byte_alphabet().to_byte.end()) {
              bytes.push_back(char(it->second));
            } else {
              bytes.append(token, i, n);
            }
            i += n;
          }
          token = std::move(bytes);
        }
        break;
      case Kind::kReplace:
        for (auto& token : tokens) replace_all(token, step.from, step.to);
        break;
      case Kind::kByteFallback: {
        std::vector<std::string> out;
        std::string run;  // bytes of consecutive <0xXX> tokens
        bool in_run = false;
        auto hex = [](char c) {
          return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        };
        for (auto& token : tokens) {
          const bool is_byte = token.size() == 6 && token.starts_with("<0x") && token[5] == '>' &&
                               hex(token[3]) >= 0 && hex(token[4]) >= 0;
          if (is_byte) {
            run.push_back(char(hex(token[3]) * 16 + hex(token[4])));
            in_run = true;
            continue;
          }
          if (in_run) out.push_back(std::move(run));
          run.clear();
          in_run = false;
          out.push_back(std::move(token));
        }
        if (in_run) out.push_back(std::move(run));
        tokens = std::move(out);
        break;
      }
      case Kind::kFuse: {
        std::string all;
        for (const auto& token : tokens) all += token;
        tokens.assign(1, std::move(all));
        break;
      }
      case Kind::kStrip:
        for (auto& token : tokens) {
          for (int k = 0; k < step.start && token.starts_with(step.from); ++k) {
            token.erase(0, step.from.size());
          }
          for (int k = 0; k < step.stop && token.ends_with(step.from); ++k) {
            token.erase(token.size() - step.from.size());
          }
        }
        break;
      case Kind::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          // tokenizers drops every replacement character of the first token
          // (not only a leading one) unless prepend_scheme is never.
          replace_all(tokens[i], step.from, i == 0 && step.strip_first ? "" : " ");
        }
        break;
    }
  }
  std::string text;
  for (const auto& token : tokens) text += token;
  return text;
}

}  // namespace baton::engine
