#include "engine/tokenizer.h"

#include "engine/hf_tokenizer.h"
#include "engine/json_file.h"

#include <fstream>
#include <nlohmann/json.hpp>

namespace baton::engine {

std::optional<std::vector<int32_t>> ByteTokenizer::encode_within(std::string_view text,
                                                                 size_t limit) const {
  if (text.size() > limit) return std::nullopt;
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char byte : text) ids.push_back(int32_t(byte) + kByteOffset);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= kByteOffset && id < kByteOffset + 256) {
      text.push_back(char(id - kByteOffset));
    } else if (id >= kByteOffset + 256) {
      // A made model's vocabulary is larger than 256 bytes; show the ids it
      // samples there instead of dropping them silently.
      text += "<|" + std::to_string(id) + "|>";
    }
  }
  return text;
}

Status ByteTokenizer::save(const std::filesystem::path& dir) {
  nlohmann::json doc = {{"type", "byte"},
                        {"pad_token_id", kPadId},
                        {"bos_token_id", kBosId},
                        {"eos_token_id", kEosId},
                        {"byte_offset", kByteOffset}};
  auto path = dir / kByteTokenizerFile;
  std::ofstream out(path);
  out << doc.dump(2) << "\n";
  if (!out) return io_error("cannot write " + path.string());
  return Status::ok();
}

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::filesystem::path& checkpoint_dir) {
  if (std::filesystem::exists(checkpoint_dir / kHfTokenizerFile)) {
    return load_hf_tokenizer(checkpoint_dir);
  }
  auto path = checkpoint_dir / kByteTokenizerFile;
  if (!std::filesystem::exists(path))
    return not_found("no tokenizer in " + checkpoint_dir.string());
  BATON_ASSIGN_OR_RETURN(nlohmann::json doc, read_json_file(path));
  if (!doc.is_object()) return data_loss(path.string() + ": invalid JSON");
  if (doc.value("type", "") != "byte") {
    return unimplemented(path.string() + ": field 'type' must be \"byte\"");
  }
  auto field_is = [&](const char* key, int32_t expected) {
    return doc.contains(key) && doc[key].is_number_integer() && doc[key].get<int64_t>() == expected;
  };
  if (!field_is("bos_token_id", ByteTokenizer::kBosId) ||
      !field_is("eos_token_id", ByteTokenizer::kEosId) ||
      !field_is("byte_offset", ByteTokenizer::kByteOffset)) {
    return unimplemented(path.string() +
                         ": byte tokenizer with other special ids than Baton writes");
  }
  return std::unique_ptr<Tokenizer>(std::make_unique<ByteTokenizer>());
}

}  // namespace baton::engine
