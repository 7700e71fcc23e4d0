// engine/json_file.h — reading a checkpoint's files (config.json,
// tokenizer.json, tokenizer_config.json, generation_config.json,
// chat_template.jinja): a missing file is NotFound, a corrupt one DataLoss
// naming it; never an exception.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "common/json_depth.h"
#include "common/regular_file.h"
#include "common/status.h"

namespace baton::engine {

// Json: nlohmann::json, or nlohmann::ordered_json to keep the file's key
// order (what a template's tojson prints).
inline Result<std::string> read_text_file(const std::filesystem::path& path) {
  if (Status regular = check_regular_file(path); !regular.is_ok()) {
    if (regular.code() == StatusCode::kNotFound) return not_found("cannot open " + path.string());
    return regular;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open " + path.string());
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return io_error("cannot read " + path.string());
  return text.str();
}

// Deeper than any checkpoint file nests (a tokenizer's Sequences of steps
// take a few levels).
inline constexpr int kMaxCheckpointJsonDepth = 64;

template <typename Json = nlohmann::json>
Result<Json> read_json_file(const std::filesystem::path& path) {
  BATON_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  if (json_nests_deeper_than(text, kMaxCheckpointJsonDepth)) {
    return data_loss(path.string() + ": nests lists and objects deeper than " +
                     std::to_string(kMaxCheckpointJsonDepth) + " levels");
  }
  Json doc = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return data_loss(path.string() + ": invalid JSON");
  return doc;
}

}  // namespace baton::engine
