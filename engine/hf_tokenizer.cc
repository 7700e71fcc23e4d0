#include "engine/hf_tokenizer.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/bpe_model.h"
#include "engine/json_file.h"
#include "engine/tokenizer_steps.h"
#include "engine/utf8.h"

namespace baton::engine {
namespace {

using nlohmann::json;

// nlohmann's message without its "[json.exception.type_error.302] ".
std::string without_exception_id(const std::string& what) {
  if (what.rfind("[json.exception.", 0) != 0) return what;
  const size_t end = what.find("] ");
  return end == std::string::npos ? what : what.substr(end + 2);
}

// fn(), with a field of the wrong JSON type (which nlohmann throws for
// without naming it) reported in the section of tokenizer.json it is in.
template <typename Fn>
auto in_section(const std::string& name, const char* section, Fn fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const json::exception& e) {
    return data_loss(name + ": " + section + ": " + without_exception_id(e.what()));
  }
}

bool is_word_byte(unsigned char c) { return std::isalnum(c) != 0 || c == '_' || c >= 0x80; }

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false;
};

class HfBpeTokenizer final : public Tokenizer {
 public:
  explicit HfBpeTokenizer(BpeModel model) : model_(std::move(model)) {}

  std::optional<std::vector<int32_t>> encode_within(std::string_view text,
                                                    size_t limit) const override {
    std::vector<int32_t> ids;
    size_t begin = 0;
    for (const auto& [match_begin, match_end, id] : find_added(text)) {
      if (!encode_segment(text.substr(begin, match_begin - begin), begin == 0, limit, ids)) {
        return std::nullopt;
      }
      ids.push_back(id);
      if (ids.size() > limit) return std::nullopt;
      begin = match_end;
    }
    if (!encode_segment(text.substr(begin), begin == 0, limit, ids)) return std::nullopt;
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int32_t id : ids) {
      if (id < 0 || size_t(id) >= id_to_token_.size() || special_[size_t(id)]) continue;
      tokens.push_back(id_to_token_[size_t(id)]);
    }
    return decode_tokens(std::move(tokens), decoder_);
  }

  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  int32_t vocab_size() const override { return int32_t(id_to_token_.size()); }

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
        for (size_t n; begin > floor && (n = utf8::white_space_before(text, begin)) > 0;) {
          begin -= n;
        }
      }
      if (best->rstrip) {
        for (size_t n; end < text.size() && (n = utf8::white_space_at(text, end)) > 0;) end += n;
      }
      found.push_back({begin, end, best->id});
      i = end;
    }
    return found;
  }

  // A stretch of text with no added token in it: normalized, pre-tokenized,
  // then each piece through the BPE model; false once there are, or a
  // piece's length shows there would be, more than `limit` ids.
  bool encode_segment(std::string_view segment, bool at_start, size_t limit,
                      std::vector<int32_t>& ids) const {
    if (segment.empty()) return true;
    return pre_tokenize(
        {normalize(std::string(segment), normalizer_), at_start}, pre_tokenizer_, [&](Piece piece) {
          if (bytes_per_id_ > 0 &&
              (piece.text.size() + bytes_per_id_ - 1) / bytes_per_id_ > limit - ids.size()) {
            return false;  // one long word is costly to merge: skipped
          }
          model_.encode(piece.text, ids);
          return ids.size() <= limit;
        });
  }

  Status load_specials(const json& doc, const json& config, const std::string& name);

  BpeModel model_;
  std::vector<NormalizeStep> normalizer_;
  std::vector<PreTokenizeStep> pre_tokenizer_;
  std::vector<DecodeStep> decoder_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> special_;
  std::vector<AddedToken> added_;
  std::unordered_map<unsigned char, std::vector<const AddedToken*>> added_by_first_byte_;
  int32_t bos_ = -1, eos_ = -1;
  // The most bytes of a piece one id can stand for; 0 when some characters
  // make no id of their own (dropped, or fused into one unk_token).
  size_t bytes_per_id_ = 0;
};

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
      // Read wide: an id past 2^31 narrowed first could land in range.
      const auto wide_id = t["id"].get<int64_t>();
      if (wide_id < 0 || wide_id >= (1 << 24)) {
        return data_loss(name + ": added token id " + t["id"].dump() + " out of range");
      }
      AddedToken a{.id = int32_t(wide_id),
                   .content = t["content"].get<std::string>(),
                   .special = t.value("special", false),
                   .lstrip = t.value("lstrip", false),
                   .rstrip = t.value("rstrip", false),
                   .single_word = t.value("single_word", false)};
      added_.push_back(std::move(a));
    }
  }
  int32_t size = 0;
  for (const auto& [token, id] : model_.vocab()) size = std::max(size, id + 1);
  for (const auto& a : added_) size = std::max(size, a.id + 1);
  id_to_token_.assign(size_t(size), "");
  special_.assign(size_t(size), false);
  for (const auto& [token, id] : model_.vocab()) id_to_token_[size_t(id)] = token;
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
    auto it = model_.vocab().find(content);
    return it != model_.vocab().end() ? it->second : -1;
  };
  auto token_text = [](const json& v) -> std::string {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string())
      return v["content"].get<std::string>();
    return "";
  };
  const json& post = doc.contains("post_processor") ? doc["post_processor"] : json();
  const std::string post_type = component_type(post);
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
  BATON_RETURN_IF_ERROR(in_section(name, "normalizer", [&] {
    return parse_normalizer(doc.contains("normalizer") ? doc["normalizer"] : json(), name,
                            normalizer_);
  }));
  BATON_RETURN_IF_ERROR(in_section(name, "pre_tokenizer", [&] {
    return parse_pre_tokenizer(doc.contains("pre_tokenizer") ? doc["pre_tokenizer"] : json(), name,
                               pre_tokenizer_);
  }));
  if (!doc.contains("decoder") || doc["decoder"].is_null()) {
    return unimplemented(name + ": a tokenizer without a decoder is not supported");
  }
  BATON_RETURN_IF_ERROR(
      in_section(name, "decoder", [&] { return parse_decoder(doc["decoder"], name, decoder_); }));
  // A byte-level vocabulary must hold every byte's character, or text it
  // cannot spell would be dropped.
  const bool byte_level = std::any_of(pre_tokenizer_.begin(), pre_tokenizer_.end(), [](auto& s) {
    return std::holds_alternative<ByteLevelStep>(s);
  });
  bool whole_alphabet = byte_level;  // every byte's character in the vocabulary
  for (int b = 0; byte_level && b < 256; ++b) {
    const std::string& c = byte_level_char(static_cast<unsigned char>(b));
    if (model_.vocab().contains(c)) continue;
    whole_alphabet = false;
    if (model_.unk_id() < 0) {
      return unimplemented(name + ": a byte-level BPE vocabulary lacks the byte character '" + c +
                           "'");
    }
  }
  // Each id stands for one vocabulary entry, a character (unk_token) or a
  // byte (<0xXX>), so a piece has at least length / bytes_per_id_ ids, when
  // every character makes ids of its own: with a byte alphabet the
  // vocabulary holds whole, or with unknown characters kept one by one.
  const bool metaspace = std::any_of(pre_tokenizer_.begin(), pre_tokenizer_.end(), [](auto& s) {
    return std::holds_alternative<MetaspaceStep>(s);
  });
  if ((whole_alphabet && !metaspace) || model_.unknown_characters_each_count()) {
    bytes_per_id_ = std::max<size_t>(4, model_.max_token_bytes());
  }
  return in_section(name, "added_tokens or post_processor",
                    [&] { return load_specials(doc, config, name); });
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::filesystem::path& dir) {
  const std::string name = (dir / kHfTokenizerFile).string();
  BATON_ASSIGN_OR_RETURN(json doc, read_json_file(dir / kHfTokenizerFile));
  json config;
  if (std::filesystem::exists(dir / "tokenizer_config.json")) {
    BATON_ASSIGN_OR_RETURN(config, read_json_file(dir / "tokenizer_config.json"));
  }
  return load_hf_tokenizer(doc, config, name);
}

Result<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const json& doc, const json& config,
                                                     const std::string& name) {
  if (!doc.is_object()) return data_loss(name + ": not a JSON object");
  try {
    if (!doc.contains("model")) return data_loss(name + ": no model");
    BATON_ASSIGN_OR_RETURN(BpeModel model, in_section(name, "model", [&] {
                             return BpeModel::load(doc["model"], name);
                           }));
    auto tokenizer = std::make_unique<HfBpeTokenizer>(std::move(model));
    BATON_RETURN_IF_ERROR(tokenizer->load(doc, config, name));
    return std::unique_ptr<Tokenizer>(std::move(tokenizer));
  } catch (const json::exception& e) {
    return data_loss(name + ": " + without_exception_id(e.what()));
  }
}

}  // namespace baton::engine
