// engine/bpe_model.h — the BPE model of a tokenizer.json, as Hugging Face's
// `tokenizers` runs it on one pre-tokenized piece: the piece's characters
// looked up (unknown ones as their UTF-8 bytes' <0xXX> tokens with
// byte_fallback, else as unk_token, consecutive ones fused with fuse_unk),
// then merges applied lowest rank first, leftmost among equals
// (tokenizers' Word::merge_all); with ignore_merges a piece the vocabulary
// holds whole is one token.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"

namespace baton::engine {

class BpeModel {
 public:
  // model: the "model" object of a tokenizer.json; `name` prefixes errors.
  static Result<BpeModel> load(const nlohmann::json& model, const std::string& name);

  void encode(std::string_view piece, std::vector<int32_t>& ids) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }
  int32_t unk_id() const { return unk_; }
  // The longest vocabulary entry, in bytes.
  size_t max_token_bytes() const { return max_token_bytes_; }
  // Whether each character outside the vocabulary becomes ids of its own
  // (its bytes' <0xXX> tokens, or an unk_token not fused with its
  // neighbours') rather than being dropped or merged into one unk run.
  bool unknown_characters_each_count() const;

 private:
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  }

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // -> (rank, merged id)
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  int32_t unk_ = -1;
  std::array<int32_t, 256> byte_tokens_{};  // id of "<0xXX>", or -1
  size_t max_token_bytes_ = 0;
};

}  // namespace baton::engine
