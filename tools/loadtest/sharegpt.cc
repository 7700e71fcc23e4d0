#include "tools/loadtest/sharegpt.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/regular_file.h"

namespace baton::loadtest {
namespace {

using json = nlohmann::json;

// Adds one entry's conversation to `out`; `where` is "name:LINE" or "name: entry N".
Status read_entry(const json& entry, const std::string& where, ShareGptData* out) {
  if (!entry.is_object()) return invalid_argument(where + ": expected a JSON object");
  auto it = entry.find("conversations");
  if (it == entry.end()) return invalid_argument(where + ": no \"conversations\" field");
  if (!it->is_array()) return invalid_argument(where + ": \"conversations\" is not a list");
  const json& turns = *it;
  for (size_t i = 0; i < turns.size(); ++i) {
    const std::string field = where + ": conversations[" + std::to_string(i) + "]";
    if (!turns[i].is_object()) return invalid_argument(field + " is not an object");
    for (const char* key : {"from", "value"}) {
      auto member = turns[i].find(key);
      if (member == turns[i].end()) return invalid_argument(field + " has no \"" + key + "\"");
      if (!member->is_string()) return invalid_argument(field + "." + key + " is not a string");
    }
  }
  if (turns.size() < 2 || turns[0]["value"].get_ref<const std::string&>().empty()) {
    ++out->skipped;
    return Status::ok();
  }
  out->conversations.push_back({turns[0]["value"], turns[1]["value"]});
  return Status::ok();
}

}  // namespace

Result<ShareGptData> parse_sharegpt(std::string_view text, const std::string& name) {
  ShareGptData data;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && text[first] == '[') {
    json all = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (all.is_discarded()) return invalid_argument(name + ": not a valid JSON array");
    for (size_t i = 0; i < all.size(); ++i)
      BATON_RETURN_IF_ERROR(read_entry(all[i], name + ": entry " + std::to_string(i), &data));
  } else {
    size_t line_number = 0, pos = 0;
    while (pos < text.size()) {
      size_t end = text.find('\n', pos);
      if (end == std::string_view::npos) end = text.size();
      std::string_view line = text.substr(pos, end - pos);
      pos = end + 1;
      ++line_number;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      const std::string where = name + ":" + std::to_string(line_number);
      json entry = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (entry.is_discarded()) return invalid_argument(where + ": not valid JSON");
      BATON_RETURN_IF_ERROR(read_entry(entry, where, &data));
    }
  }
  if (data.conversations.empty()) {
    return invalid_argument(name + ": no conversation with a prompt and a reply (" +
                            std::to_string(data.skipped) + " skipped)");
  }
  return data;
}

Result<ShareGptData> read_sharegpt(const std::string& path) {
  // ShareGPT's own file is 0.6 GiB: the bound only keeps out what is not a
  // dataset at all.
  BATON_RETURN_IF_ERROR(check_regular_file(path, uintmax_t(16) << 30));
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open the dataset");
  std::stringstream text;
  text << in.rdbuf();
  return parse_sharegpt(text.str(), path);
}

}  // namespace baton::loadtest
