#include "engine/yaml_settings.h"

#include <cctype>
#include <charconv>
#include <cstdio>
#include <set>

namespace baton::engine {

std::string join_yaml_key(std::string_view prefix, std::string_view name) {
  if (prefix.empty()) return std::string(name);
  return std::string(prefix) + "." + std::string(name);
}

// The names of a mapping's keys, in order; a repeated or non-scalar key is an error.
Result<std::vector<std::pair<std::string, YAML::Node>>> yaml_map_entries(const YAML::Node& node,
                                                                         std::string_view prefix) {
  std::vector<std::pair<std::string, YAML::Node>> entries;
  if (!node || node.IsNull()) return entries;
  if (!node.IsMap()) {
    return invalid_argument((prefix.empty() ? std::string("top level") : std::string(prefix)) +
                            ": expected a mapping");
  }
  std::set<std::string> seen;
  for (const auto& entry : node) {
    if (!entry.first.IsScalar()) {
      return invalid_argument(join_yaml_key(prefix, "?") + ": keys must be plain names");
    }
    std::string name = entry.first.Scalar();
    if (!seen.insert(name).second) {
      return invalid_argument(join_yaml_key(prefix, name) + ": given twice");
    }
    entries.emplace_back(std::move(name), entry.second);
  }
  return entries;
}

Result<std::string> read_yaml_string(const YAML::Node& node, const std::string& key) {
  if (!node.IsScalar() || node.Scalar().empty()) {
    return invalid_argument(key + ": expected a non-empty string");
  }
  return node.Scalar();
}

Result<int64_t> read_yaml_int(const YAML::Node& node, const std::string& key, int64_t lo,
                              int64_t hi) {
  if (!node.IsScalar()) return invalid_argument(key + ": expected an integer");
  const std::string& text = node.Scalar();
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    return invalid_argument(key + ": expected an integer, got '" + text + "'");
  }
  if (value < lo || value > hi) {
    return invalid_argument(key + ": must be in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "], got " + text);
  }
  return value;
}

Result<bool> read_yaml_bool(const YAML::Node& node, const std::string& key) {
  const std::string text = node.IsScalar() ? node.Scalar() : "";
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  return invalid_argument(key + ": expected true or false, got '" + text + "'");
}

Result<double> read_yaml_fraction(const YAML::Node& node, const std::string& key) {
  if (!node.IsScalar()) return invalid_argument(key + ": expected a number in [0, 1] like 0.45");
  const std::string& text = node.Scalar();
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    return invalid_argument(key + ": expected a number in [0, 1] like 0.45, got '" + text + "'");
  if (!(value >= 0 && value <= 1))
    return invalid_argument(key + ": must be in [0, 1], got " + text);
  return value;
}

std::string format_fraction(double fraction) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", fraction);
  return text;
}

Result<uint64_t> parse_byte_size(std::string_view text, std::string_view key) {
  auto fail = [&] {
    return invalid_argument(std::string(key) + ": expected a size like 512MiB, got '" +
                            std::string(text) + "'");
  };
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0) return fail();
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + digits, value);
  if (ec != std::errc()) return fail();
  std::string_view unit = text.substr(digits);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  static const std::pair<std::string_view, uint64_t> kUnits[] = {{"", 1},
                                                                 {"B", 1},
                                                                 {"KiB", 1ull << 10},
                                                                 {"MiB", 1ull << 20},
                                                                 {"GiB", 1ull << 30},
                                                                 {"TiB", 1ull << 40},
                                                                 {"KB", 1000ull},
                                                                 {"MB", 1000000ull},
                                                                 {"GB", 1000000000ull},
                                                                 {"TB", 1000000000000ull}};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name) {
      if (value > UINT64_MAX / scale) return fail();
      return value * scale;
    }
  }
  return fail();
}

std::string format_byte_size(uint64_t bytes) {
  static const std::pair<const char*, int> kUnits[] = {
      {"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}};
  for (const auto& [unit, shift] : kUnits) {
    const uint64_t scale = uint64_t(1) << shift;
    if (bytes != 0 && bytes % scale == 0) return std::to_string(bytes / scale) + unit;
  }
  return std::to_string(bytes);
}

}  // namespace baton::engine
