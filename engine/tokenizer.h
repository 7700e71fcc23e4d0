// engine/tokenizer.h — text <-> token ids.
//
// The interface every tokenizer implements, and the byte-level tokenizer that
// `baton make-model` ships with random checkpoints: byte b is token
// b + byte_offset; ids below byte_offset are specials (pad, bos, eos); ids past
// the bytes decode as "<|id|>".
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace baton::engine {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  std::vector<int32_t> encode(std::string_view text) const {
    return *encode_within(text, std::numeric_limits<size_t>::max());
  }
  // The ids of `text` when there are at most `limit` of them; nullopt when
  // there are more, found out early: encoding stops at the piece that
  // crosses the limit, or before one whose length alone shows that it
  // would (the text is still normalised and searched for added tokens whole).
  virtual std::optional<std::vector<int32_t>> encode_within(std::string_view text,
                                                            size_t limit) const = 0;
  // Special ids (pad, bos, eos) decode to "".
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when none
  virtual int32_t eos_id() const = 0;  // -1 when none
  // One past the largest id it can produce.
  virtual int32_t vocab_size() const = 0;
};

inline constexpr const char* kByteTokenizerFile = "baton_tokenizer.json";

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kPadId = 0;
  static constexpr int32_t kBosId = 1;
  static constexpr int32_t kEosId = 2;
  static constexpr int32_t kByteOffset = 3;
  static constexpr int32_t kMinVocab = kByteOffset + 256;

  std::optional<std::vector<int32_t>> encode_within(std::string_view text,
                                                    size_t limit) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t bos_id() const override { return kBosId; }
  int32_t eos_id() const override { return kEosId; }
  int32_t vocab_size() const override { return kMinVocab; }

  static Status save(const std::filesystem::path& dir);
};

// Loads the tokenizer a checkpoint ships: its tokenizer.json
// (engine/hf_tokenizer.h), else Baton's byte tokenizer. NotFound when it
// ships none (the model still runs from token ids).
Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::filesystem::path& checkpoint_dir);

}  // namespace baton::engine
