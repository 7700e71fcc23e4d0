#include "engine/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "engine/pcre2_regex.h"

namespace baton::engine {
namespace {

using nlohmann::json;

// GPT-2's pre-tokenizer pattern, what ByteLevel's use_regex splits by.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

// Length of the UTF-8 character starting at s[i] (1 for a stray byte).
size_t utf8_length(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  }
  return n;
}

uint32_t decode_utf8(std::string_view s, size_t i, size_t n) {
  const auto b = [&](size_t k) { return uint32_t(static_cast<unsigned char>(s[i + k])); };
  switch (n) {
    case 2:
      return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3:
      return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    case 4:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    default:
      return b(0);
  }
}

// GPT-2's reversible map of the 256 bytes onto printable characters.
struct ByteAlphabet {
  std::array<std::string, 256> utf8;              // byte -> its character
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
      append_utf8(cp, a.utf8[size_t(b)]);
      a.to_byte[cp] = uint8_t(b);
    }
    return a;
  }();
  return alphabet;
}

std::string to_byte_level(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char c : raw) out += byte_alphabet().utf8[c];
  return out;
}

// Unicode's White_Space characters (Rust's char::is_whitespace, which
// tokenizers' lstrip and rstrip use).
bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// Bytes of the white-space character starting at `i` (0 if none there).
size_t white_space_at(std::string_view s, size_t i) {
  const size_t n = utf8_length(s, i);
  return is_white_space(decode_utf8(s, i, n)) ? n : 0;
}

// Bytes of the white-space character ending just before `i` (0 if none).
size_t white_space_before(std::string_view s, size_t i) {
  size_t begin = i;
  while (begin > 0 && i - begin < 4) {
    --begin;
    if ((static_cast<unsigned char>(s[begin]) & 0xC0) != 0x80) break;
  }
  if (begin == i) return 0;
  const size_t n = utf8_length(s, begin);
  return begin + n == i && is_white_space(decode_utf8(s, begin, n)) ? n : 0;
}
bool is_word_byte(unsigned char c) { return std::isalnum(c) != 0 || c == '_' || c >= 0x80; }

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false;
};

struct SplitStep {
  Pcre2Regex regex;
  bool removed = false;  // Removed drops the matches; Isolated keeps each as a piece
};
struct ByteLevelStep {
  bool add_prefix_space = false;
  std::unique_ptr<Pcre2Regex> regex;  // GPT-2's pattern when use_regex
};
using PreTokenizerStep = std::variant<SplitStep, ByteLevelStep>;

class HfBpeTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    size_t begin = 0;
    for (const auto& [match_begin, match_end, id] : find_added(text)) {
      encode_segment(text.substr(begin, match_begin - begin), ids);
      ids.push_back(id);
      begin = match_end;
    }
    encode_segment(text.substr(begin), ids);
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string text;
    const auto& alphabet = byte_alphabet();
    for (int32_t id : ids) {
      if (id < 0 || size_t(id) >= id_to_token_.size()) continue;
      if (special_[size_t(id)]) continue;
      const std::string& token = id_to_token_[size_t(id)];
      // The ByteLevel decoder: each alphabet character back to its byte;
      // any other character (an added token's) as it is.
      for (size_t i = 0; i < token.size();) {
        const size_t n = utf8_length(token, i);
        auto it = alphabet.to_byte.find(decode_utf8(token, i, n));
        if (it != alphabet.to_byte.end()) {
          text.push_back(char(it->second));
        } else {
          text.append(token, i, n);
        }
        i += n;
      }
    }
    return text;
  }

  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }

  Status load(const json& doc, const json& config, const std::string& name);

 private:
  struct AddedMatch {
    size_t begin, end;
    int32_t id;
  };

  // Added tokens in the raw text, leftmost and then longest, each widened by
  // its lstrip/rstrip over white space.
  std::vector<AddedMatch> find_added(std::string_view text) const {
    std::vector<AddedMatch> found;
    if (added_.empty()) return found;
    size_t i = 0;
    while (i < text.size()) {
      const AddedToken* best = nullptr;
      auto candidates = added_by_first_byte_.find(static_cast<unsigned char>(text[i]));
      if (candidates != added_by_first_byte_.end()) {
        for (const AddedToken* t : candidates->second) {  // longest first
          if (text.compare(i, t->content.size(), t->content) != 0) continue;
          const size_t end = i + t->content.size();
          if (t->single_word &&
              ((i > 0 && is_word_byte(static_cast<unsigned char>(text[i - 1]))) ||
               (end < text.size() && is_word_byte(static_cast<unsigned char>(text[end]))))) {
            continue;
          }
          best = t;
          break;
        }
      }
      if (best == nullptr) {
        ++i;
        continue;
      }
      size_t begin = i, end = i + best->content.size();
      const size_t floor = found.empty() ? 0 : found.back().end;
      if (best->lstrip) {
        for (size_t n; begin > floor && (n = white_space_before(text, begin)) > 0;) begin -= n;
      }
      if (best->rstrip) {
        for (size_t n; end < text.size() && (n = white_space_at(text, end)) > 0;) end += n;
      }
      found.push_back({begin, end, best->id});
      i = end;
    }
    return found;
  }

  // Pre-tokenizes a stretch of text with no added token in it, then BPE.
  void encode_segment(std::string_view segment, std::vector<int32_t>& ids) const {
    if (segment.empty()) return;
    std::vector<std::string> pieces{std::string(segment)};
    for (const auto& step : pre_tokenizer_) {
      std::vector<std::string> next;
      if (const auto* split = std::get_if<SplitStep>(&step)) {
        for (const auto& piece : pieces) split_piece(split->regex, split->removed, piece, next);
      } else {
        const auto& level = std::get<ByteLevelStep>(step);
        for (auto piece : pieces) {
          if (level.add_prefix_space && !piece.starts_with(' ')) piece.insert(0, 1, ' ');
          std::vector<std::string> parts;
          if (level.regex) {
            split_piece(*level.regex, false, piece, parts);
          } else {
            parts.push_back(std::move(piece));
          }
          for (const auto& part : parts) next.push_back(to_byte_level(part));
        }
      }
      pieces = std::move(next);
    }
    for (const auto& piece : pieces) bpe(piece, ids);
  }

  static void split_piece(const Pcre2Regex& regex, bool removed, const std::string& piece,
                          std::vector<std::string>& out) {
    size_t at = 0;
    for (const auto& [begin, end] : regex.find_all(piece)) {
      if (begin > at) out.emplace_back(piece, at, begin - at);
      if (!removed) out.emplace_back(piece, begin, end - begin);
      at = end;
    }
    if (at < piece.size()) out.emplace_back(piece, at, std::string::npos);
  }

  // The BPE model on one piece of byte-level characters: lowest-ranked
  // merge first, leftmost among equals, as tokenizers' Word::merge_all.
  void bpe(const std::string& word, std::vector<int32_t>& ids) const {
    if (word.empty()) return;
    if (ignore_merges_) {
      if (auto it = vocab_.find(word); it != vocab_.end()) {
        ids.push_back(it->second);
        return;
      }
    }
    struct Symbol {
      int32_t id;
      int32_t prev, next;
      bool alive;
    };
    std::vector<Symbol> symbols;
    for (size_t i = 0; i < word.size();) {
      const size_t n = utf8_length(word, i);
      auto it = vocab_.find(word.substr(i, n));
      // Every byte's character is in the vocabulary (checked at load).
      const int32_t id = it != vocab_.end() ? it->second : unk_;
      if (id >= 0) {
        symbols.push_back({id, int32_t(symbols.size()) - 1, int32_t(symbols.size()) + 1, true});
      }
      i += n;
    }
    if (symbols.empty()) return;
    symbols.back().next = -1;
    struct Candidate {
      int32_t rank, pos, new_id;
      bool operator>(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : pos > o.pos;
      }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
    auto consider = [&](int32_t pos) {
      const int32_t next = symbols[size_t(pos)].next;
      if (next < 0) return;
      auto it = merges_.find(pair_key(symbols[size_t(pos)].id, symbols[size_t(next)].id));
      if (it != merges_.end()) queue.push({it->second.first, pos, it->second.second});
    };
    for (int32_t i = 0; i < int32_t(symbols.size()); ++i) consider(i);
    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      Symbol& left = symbols[size_t(top.pos)];
      if (!left.alive || left.next < 0) continue;
      Symbol& right = symbols[size_t(left.next)];
      auto it = merges_.find(pair_key(left.id, right.id));
      if (it == merges_.end() || it->second.second != top.new_id) continue;  // stale
      left.id = top.new_id;
      right.alive = false;
      left.next = right.next;
      if (right.next >= 0) symbols[size_t(right.next)].prev = top.pos;
      if (left.prev >= 0) consider(left.prev);
      consider(top.pos);
    }
    for (const auto& s : symbols) {
      if (s.alive) ids.push_back(s.id);
    }
  }

  static uint64_t pair_key(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  }

  Status load_model(const json& model, const std::string& name);
  Status load_pre_tokenizer(const json& node, const std::string& name);
  Status load_specials(const json& doc, const json& config, const std::string& name);

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> special_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // -> (rank, merged id)
  bool ignore_merges_ = false;
  int32_t unk_ = -1;
  std::vector<AddedToken> added_;
  std::unordered_map<unsigned char, std::vector<const AddedToken*>> added_by_first_byte_;
  std::vector<PreTokenizerStep> pre_tokenizer_;
  int32_t bos_ = -1, eos_ = -1;
};

std::string type_of(const json& node) {
  return node.is_object() && node.contains("type") && node["type"].is_string()
             ? node["type"].get<std::string>()
             : "";
}

Status HfBpeTokenizer::load_model(const json& model, const std::string& name) {
  const std::string type = type_of(model);
  if (type != "BPE") {
    return unimplemented(name + ": model type '" + type + "' is not supported (BPE is)");
  }
  if (model.value("byte_fallback", false)) {
    return unimplemented(name + ": BPE with byte_fallback (SentencePiece-style) is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"}) {
    if (model.contains(key) && !model[key].is_null() &&
        !(model[key].is_string() && model[key].get<std::string>().empty())) {
      return unimplemented(name + ": BPE " + key + " is not supported");
    }
  }
  ignore_merges_ = model.value("ignore_merges", false);
  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object() || vocab->empty()) {
    return data_loss(name + ": model.vocab is missing or empty");
  }
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= (int64_t(1) << 24)) {
      return data_loss(name + ": model.vocab['" + it.key() + "'] is not a token id");
    }
    vocab_[it.key()] = it.value().get<int32_t>();
  }
  const auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) {
    return data_loss(name + ": model.merges is missing or not a list");
  }
  int32_t rank = 0;
  for (const auto& m : *merges) {
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == s.size()) {
        return data_loss(name + ": merge " + std::to_string(rank) + " '" + s + "' is not 'a b'");
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return data_loss(name + ": merge " + std::to_string(rank) + " is neither 'a b' nor [a, b]");
    }
    auto a = vocab_.find(left), b = vocab_.find(right), ab = vocab_.find(left + right);
    if (a == vocab_.end() || b == vocab_.end() || ab == vocab_.end()) {
      return data_loss(name + ": merge " + std::to_string(rank) + " ('" + left + "', '" + right +
                       "') names a token the vocabulary lacks");
    }
    merges_.emplace(pair_key(a->second, b->second), std::pair{rank, ab->second});
    ++rank;
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = vocab_.find(model["unk_token"].get<std::string>());
    if (it != vocab_.end()) unk_ = it->second;
  }
  for (const auto& c : byte_alphabet().utf8) {
    if (!vocab_.contains(c) && unk_ < 0) {
      return unimplemented(name + ": a byte-level BPE vocabulary lacks the byte character '" + c +
                           "'");
    }
  }
  return Status::ok();
}

Status HfBpeTokenizer::load_pre_tokenizer(const json& node, const std::string& name) {
  const std::string type = type_of(node);
  if (type == "Sequence") {
    const auto steps = node.find("pretokenizers");
    if (steps == node.end() || !steps->is_array()) {
      return data_loss(name + ": pre_tokenizer Sequence without a pretokenizers list");
    }
    for (const auto& step : *steps) BATON_RETURN_IF_ERROR(load_pre_tokenizer(step, name));
    return Status::ok();
  }
  if (type == "ByteLevel") {
    ByteLevelStep step;
    step.add_prefix_space = node.value("add_prefix_space", false);
    if (node.value("use_regex", true)) {
      BATON_ASSIGN_OR_RETURN(Pcre2Regex regex, Pcre2Regex::compile(kGpt2Pattern));
      step.regex = std::make_unique<Pcre2Regex>(std::move(regex));
    }
    pre_tokenizer_.emplace_back(std::move(step));
    return Status::ok();
  }
  if (type == "Digits") {
    // Rust's char::is_numeric, each digit alone or runs of them, isolated.
    BATON_ASSIGN_OR_RETURN(
        Pcre2Regex regex,
        Pcre2Regex::compile(node.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+"));
    pre_tokenizer_.emplace_back(SplitStep{std::move(regex), /*removed=*/false});
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
    const auto pattern = node.find("pattern");
    Result<Pcre2Regex> regex = data_loss(name + ": pre_tokenizer Split has no pattern");
    if (pattern != node.end() && pattern->is_object()) {
      if (pattern->contains("Regex") && (*pattern)["Regex"].is_string()) {
        regex = Pcre2Regex::compile((*pattern)["Regex"].get<std::string>());
      } else if (pattern->contains("String") && (*pattern)["String"].is_string()) {
        regex = Pcre2Regex::literal((*pattern)["String"].get<std::string>());
      }
    }
    if (!regex.is_ok()) return regex.status().with_context(name);
    pre_tokenizer_.emplace_back(SplitStep{std::move(regex).value(), behavior == "Removed"});
    return Status::ok();
  }
  return unimplemented(name + ": pre_tokenizer '" + type + "' is not supported");
}

// Added tokens, and which ids are BOS and EOS: the post-processor's leading
// special token (TemplateProcessing), else tokenizer_config.json's bos_token
// when add_bos_token asks for it; its eos_token.
Status HfBpeTokenizer::load_specials(const json& doc, const json& config, const std::string& name) {
  if (doc.contains("added_tokens") && doc["added_tokens"].is_array()) {
    for (const auto& t : doc["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
          !t.contains("content") || !t["content"].is_string() ||
          t["content"].get<std::string>().empty()) {
        return data_loss(name + ": an added token lacks an id or content");
      }
      AddedToken a{.id = t["id"].get<int32_t>(),
                   .content = t["content"].get<std::string>(),
                   .special = t.value("special", false),
                   .lstrip = t.value("lstrip", false),
                   .rstrip = t.value("rstrip", false),
                   .single_word = t.value("single_word", false)};
      if (a.id < 0 || a.id >= (1 << 24)) return data_loss(name + ": added token id out of range");
      added_.push_back(std::move(a));
    }
  }
  int32_t size = 0;
  for (const auto& [token, id] : vocab_) size = std::max(size, id + 1);
  for (const auto& a : added_) size = std::max(size, a.id + 1);
  id_to_token_.assign(size_t(size), "");
  special_.assign(size_t(size), false);
  for (const auto& [token, id] : vocab_) id_to_token_[size_t(id)] = token;
  for (const auto& a : added_) {
    id_to_token_[size_t(a.id)] = a.content;
    special_[size_t(a.id)] = a.special;
  }
  for (const auto& a : added_)
    added_by_first_byte_[static_cast<unsigned char>(a.content[0])].push_back(&a);
  for (auto& [byte, list] : added_by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [](const AddedToken* x, const AddedToken* y) {
      return x->content.size() > y->content.size();
    });
  }

  auto id_of = [&](const std::string& content) -> int32_t {
    for (const auto& a : added_)
      if (a.content == content) return a.id;
    auto it = vocab_.find(content);
    return it != vocab_.end() ? it->second : -1;
  };
  auto token_text = [](const json& v) -> std::string {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string())
      return v["content"].get<std::string>();
    return "";
  };
  const json& post = doc.contains("post_processor") ? doc["post_processor"] : json();
  const std::string post_type = type_of(post);
  if (post_type == "TemplateProcessing") {
    const auto single = post.find("single");
    if (single == post.end() || !single->is_array()) {
      return data_loss(name + ": TemplateProcessing without a 'single' template");
    }
    bool seen_sequence = false;
    for (const auto& piece : *single) {
      if (piece.contains("Sequence")) {
        seen_sequence = true;
      } else if (piece.contains("SpecialToken") && piece["SpecialToken"].contains("id")) {
        if (seen_sequence) {
          return unimplemented(name + ": TemplateProcessing adding tokens after the text");
        }
        const int32_t id = id_of(piece["SpecialToken"]["id"].get<std::string>());
        if (id < 0) return data_loss(name + ": TemplateProcessing names an unknown token");
        if (bos_ >= 0) return unimplemented(name + ": TemplateProcessing adding two tokens first");
        bos_ = id;
      }
    }
  } else if (!post.is_null() && post_type != "ByteLevel") {
    return unimplemented(name + ": post_processor '" + post_type + "' is not supported");
  }
  if (bos_ < 0 && config.is_object() && config.value("add_bos_token", false) &&
      config.contains("bos_token")) {
    bos_ = id_of(token_text(config["bos_token"]));
  }
  if (config.is_object() && config.contains("eos_token"))
    eos_ = id_of(token_text(config["eos_token"]));
  return Status::ok();
}

Status HfBpeTokenizer::load(const json& doc, const json& config, const std::string& name) {
  if (!doc.is_object()) return data_loss(name + ": not a JSON object");
  if (doc.contains("normalizer") && !doc["normalizer"].is_null()) {
    return unimplemented(name + ": normalizer '" + type_of(doc["normalizer"]) +
                         "' is not supported");
  }
  if (!doc.contains("model")) return data_loss(name + ": no model");
  BATON_RETURN_IF_ERROR(load_model(doc["model"], name));
  if (!doc.contains("pre_tokenizer") || doc["pre_tokenizer"].is_null()) {
    return unimplemented(name + ": a BPE tokenizer without a ByteLevel pre_tokenizer");
  }
  BATON_RETURN_IF_ERROR(load_pre_tokenizer(doc["pre_tokenizer"], name));
  if (std::none_of(pre_tokenizer_.begin(), pre_tokenizer_.end(),
                   [](const auto& s) { return std::holds_alternative<ByteLevelStep>(s); })) {
    return unimplemented(name + ": a BPE tokenizer without a ByteLevel pre_tokenizer");
  }
  const std::string decoder = doc.contains("decoder") ? type_of(doc["decoder"]) : "";
  if (decoder != "ByteLevel") {
    return unimplemented(name + ": decoder '" + decoder + "' is not supported (ByteLevel is)");
  }
  return load_specials(doc, config, name);
}

Result<json> read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open " + path.string());
  auto doc = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return data_loss(path.string() + ": invalid JSON");
  return doc;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::filesystem::path& dir) {
  BATON_ASSIGN_OR_RETURN(json doc, read_json(dir / kHfTokenizerFile));
  json config;
  if (std::filesystem::exists(dir / "tokenizer_config.json")) {
    BATON_ASSIGN_OR_RETURN(config, read_json(dir / "tokenizer_config.json"));
  }
  auto tokenizer = std::make_unique<HfBpeTokenizer>();
  try {
    BATON_RETURN_IF_ERROR(tokenizer->load(doc, config, (dir / kHfTokenizerFile).string()));
  } catch (const json::exception& e) {
    // A field of the wrong JSON type somewhere we read it.
    return data_loss((dir / kHfTokenizerFile).string() + ": " + e.what());
  }
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

}  // namespace baton::engine
