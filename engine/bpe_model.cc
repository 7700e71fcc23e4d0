#include "engine/bpe_model.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>

#include "engine/utf8.h"

namespace baton::engine {

Result<BpeModel> BpeModel::load(const nlohmann::json& model, const std::string& name) {
  BpeModel m;
  const std::string type = model.is_object() ? model.value("type", "") : "";
  if (type != "BPE") {
    return unimplemented(name + ": model type '" + type + "' is not supported (BPE is)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"}) {
    if (model.contains(key) && !model[key].is_null() &&
        !(model[key].is_string() && model[key].get<std::string>().empty())) {
      return unimplemented(name + ": BPE " + key + " is not supported");
    }
  }
  m.ignore_merges_ = model.value("ignore_merges", false);
  m.byte_fallback_ = model.value("byte_fallback", false);
  m.fuse_unk_ = model.value("fuse_unk", false);
  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object() || vocab->empty()) {
    return data_loss(name + ": model.vocab is missing or empty");
  }
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= (int64_t(1) << 24)) {
      return data_loss(name + ": model.vocab['" + it.key() + "'] is not a token id");
    }
    m.vocab_[it.key()] = it.value().get<int32_t>();
  }
  const auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) {
    return data_loss(name + ": model.merges is missing or not a list");
  }
  int32_t rank = 0;
  for (const auto& merge : *merges) {
    std::string left, right;
    if (merge.is_string()) {
      const std::string s = merge.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == s.size()) {
        return data_loss(name + ": merge " + std::to_string(rank) + " '" + s + "' is not 'a b'");
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return data_loss(name + ": merge " + std::to_string(rank) + " is neither 'a b' nor [a, b]");
    }
    auto a = m.vocab_.find(left), b = m.vocab_.find(right), ab = m.vocab_.find(left + right);
    if (a == m.vocab_.end() || b == m.vocab_.end() || ab == m.vocab_.end()) {
      return data_loss(name + ": merge " + std::to_string(rank) + " ('" + left + "', '" + right +
                       "') names a token the vocabulary lacks");
    }
    // A repeated pair takes its last rank, as tokenizers' map of them does.
    m.merges_.insert_or_assign(pair_key(a->second, b->second), std::pair{rank, ab->second});
    ++rank;
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const std::string unk = model["unk_token"].get<std::string>();
    auto it = m.vocab_.find(unk);
    if (it == m.vocab_.end()) return data_loss(name + ": unk_token '" + unk + "' is not in vocab");
    m.unk_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char token[8];
    std::snprintf(token, sizeof token, "<0x%02X>", b);
    auto it = m.vocab_.find(token);
    m.byte_tokens_[size_t(b)] = it != m.vocab_.end() ? it->second : -1;
  }
  for (const auto& [token, id] : m.vocab_)
    m.max_token_bytes_ = std::max(m.max_token_bytes_, token.size());
  return m;
}

bool BpeModel::unknown_characters_each_count() const {
  const bool every_byte =
      std::all_of(byte_tokens_.begin(), byte_tokens_.end(), [](int32_t id) { return id >= 0; });
  return (byte_fallback_ && every_byte) || (unk_ >= 0 && !fuse_unk_);
}

void BpeModel::encode(std::string_view piece, std::vector<int32_t>& ids) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(std::string(piece)); it != vocab_.end()) {
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
  auto push = [&](int32_t id) {
    symbols.push_back({id, int32_t(symbols.size()) - 1, int32_t(symbols.size()) + 1, true});
  };
  bool last_was_unk = false;
  for (size_t i = 0; i < piece.size();) {
    const size_t n = utf8::length_at(piece, i);
    auto it = vocab_.find(std::string(piece.substr(i, n)));
    if (it != vocab_.end()) {
      push(it->second);
      last_was_unk = false;
    } else {
      bool fell_back = byte_fallback_;
      for (size_t k = 0; fell_back && k < n; ++k) {
        fell_back = byte_tokens_[static_cast<unsigned char>(piece[i + k])] >= 0;
      }
      if (fell_back) {
        for (size_t k = 0; k < n; ++k) push(byte_tokens_[static_cast<unsigned char>(piece[i + k])]);
        last_was_unk = false;
      } else if (unk_ >= 0) {
        if (!(fuse_unk_ && last_was_unk)) push(unk_);
        last_was_unk = true;
      }
      // With neither, tokenizers fails the encoding; the character is dropped.
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

}  // namespace baton::engine
