// engine/yaml_settings.h — the one way Baton reads a YAML mapping into a
// settings struct, for the engine's settings and the cluster YAML alike: a
// table of the known keys, each with how it is read (errors name the key)
// and how its value reads back; unknown and repeated keys are refused.
// The defaults are the struct's own member initializers, written once: the
// reference shows them through the same printers.
#pragma once

#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace baton::engine {

template <typename T>
struct YamlSetting {
  const char* name;
  const char* doc;  // one line of what it means, for the reference; may be empty
  std::function<Status(const YAML::Node& value, const std::string& key, T& out)> read;
  // The setting's value in `settings`, as YAML would write it; null: not shown.
  std::function<std::string(const T& settings)> show;
};
template <typename T>
using YamlSettings = std::vector<YamlSetting<T>>;

// "prefix.name", or "name" without a prefix.
std::string join_yaml_key(std::string_view prefix, std::string_view name);
// A mapping's entries in order (none for a null node); a repeated or
// non-scalar key, or a node other than a mapping, is an error.
Result<std::vector<std::pair<std::string, YAML::Node>>> yaml_map_entries(const YAML::Node& node,
                                                                         std::string_view prefix);

// Reads `node`'s keys into `out` by `table`; a key not in it is an error.
template <typename T>
Status read_yaml_settings(const YAML::Node& node, std::string_view prefix,
                          const YamlSettings<T>& table, T& out) {
  BATON_ASSIGN_OR_RETURN(auto entries, yaml_map_entries(node, prefix));
  for (const auto& [name, value] : entries) {
    const std::string key = join_yaml_key(prefix, name);
    const YamlSetting<T>* setting = nullptr;
    for (const YamlSetting<T>& s : table) {
      if (name == s.name) setting = &s;
    }
    if (setting == nullptr) return invalid_argument(key + ": unknown key");
    BATON_RETURN_IF_ERROR(setting->read(value, key, out));
  }
  return Status::ok();
}

// One line per setting: "prefix.name (default D): doc", D shown from T{}.
template <typename T>
std::string yaml_settings_reference(std::string_view prefix, const YamlSettings<T>& table) {
  const T defaults{};
  std::string out;
  for (const YamlSetting<T>& s : table) {
    out += join_yaml_key(prefix, s.name);
    if (s.show) out += " (default " + s.show(defaults) + ")";
    out += ": ";
    out += s.doc;
    out += "\n";
  }
  return out;
}

// A YAML scalar as an integer in [lo, hi]; errors name `key`.
Result<int64_t> read_yaml_int(const YAML::Node& node, const std::string& key, int64_t lo,
                              int64_t hi);
// true/True/TRUE or false/False/FALSE; errors name `key`.
Result<bool> read_yaml_bool(const YAML::Node& node, const std::string& key);
// A non-empty scalar; errors name `key`.
Result<std::string> read_yaml_string(const YAML::Node& node, const std::string& key);
// A decimal number in [0, 1] ("0.45", "1", "0"); errors name `key`.
Result<double> read_yaml_fraction(const YAML::Node& node, const std::string& key);
// A fraction as read_yaml_fraction reads it back: "0.45", "0".
std::string format_fraction(double fraction);
// "512MiB", "2GiB", "1000000", "64 KB" -> bytes; errors name `key`.
Result<uint64_t> parse_byte_size(std::string_view text, std::string_view key);
// Bytes as the largest binary unit that divides them: "256MiB", "4GiB", "1000".
std::string format_byte_size(uint64_t bytes);

// Settings of one member each, read and shown the usual way.
template <typename T, typename Int>
YamlSetting<T> int_setting(const char* name, Int T::*field, int64_t lo, int64_t hi,
                           const char* doc = "") {
  return {name, doc,
          [=](const YAML::Node& node, const std::string& key, T& out) -> Status {
            BATON_ASSIGN_OR_RETURN(int64_t value, read_yaml_int(node, key, lo, hi));
            out.*field = Int(value);
            return Status::ok();
          },
          [=](const T& s) { return std::to_string(s.*field); }};
}

template <typename T>
YamlSetting<T> ms_setting(const char* name, std::chrono::milliseconds T::*field, int64_t lo,
                          int64_t hi, const char* doc = "") {
  return {name, doc,
          [=](const YAML::Node& node, const std::string& key, T& out) -> Status {
            BATON_ASSIGN_OR_RETURN(int64_t value, read_yaml_int(node, key, lo, hi));
            out.*field = std::chrono::milliseconds(value);
            return Status::ok();
          },
          [=](const T& s) { return std::to_string((s.*field).count()); }};
}

template <typename T>
YamlSetting<T> bool_setting(const char* name, bool T::*field, const char* doc = "") {
  return {name, doc,
          [=](const YAML::Node& node, const std::string& key, T& out) -> Status {
            BATON_ASSIGN_OR_RETURN(out.*field, read_yaml_bool(node, key));
            return Status::ok();
          },
          [=](const T& s) { return std::string(s.*field ? "true" : "false"); }};
}

template <typename T>
YamlSetting<T> string_setting(const char* name, std::string T::*field, const char* doc = "") {
  return {name, doc,
          [=](const YAML::Node& node, const std::string& key, T& out) -> Status {
            BATON_ASSIGN_OR_RETURN(out.*field, read_yaml_string(node, key));
            return Status::ok();
          },
          [=](const T& s) { return (s.*field).empty() ? std::string("\"\"") : s.*field; }};
}

// A positive size with a unit suffix (parse_byte_size).
template <typename T>
YamlSetting<T> byte_size_setting(const char* name, uint64_t T::*field, const char* doc = "") {
  return {name, doc,
          [=](const YAML::Node& node, const std::string& key, T& out) -> Status {
            if (!node.IsScalar()) return invalid_argument(key + ": expected a size like 512MiB");
            BATON_ASSIGN_OR_RETURN(out.*field, parse_byte_size(node.Scalar(), key));
            if (out.*field == 0) return invalid_argument(key + ": must be positive");
            return Status::ok();
          },
          [=](const T& s) { return format_byte_size(s.*field); }};
}

}  // namespace baton::engine
