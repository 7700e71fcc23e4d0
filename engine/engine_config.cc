#include "engine/engine_config.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <charconv>
#include <functional>
#include <vector>

namespace baton::engine {
namespace {

using Setter = std::function<Status(const YAML::Node&, const std::string& key, EngineConfig&)>;

struct Setting {
  const char* name;
  const char* default_text;
  const char* doc;
  Setter set;
};

Setter bool_setting(bool EngineConfig::*field) {
  return [=](const YAML::Node& node, const std::string& key, EngineConfig& config) -> Status {
    BATON_ASSIGN_OR_RETURN(config.*field, read_yaml_bool(node, key));
    return Status::ok();
  };
}

// Integer settings share one shape: range-checked, then stored into a field.
Setter int_setting(int32_t EngineConfig::*field, int64_t lo, int64_t hi) {
  return [=](const YAML::Node& node, const std::string& key, EngineConfig& config) -> Status {
    BATON_ASSIGN_OR_RETURN(int64_t value, read_yaml_int(node, key, lo, hi));
    config.*field = int32_t(value);
    return Status::ok();
  };
}

const std::vector<Setting>& settings() {
  static const std::vector<Setting> table = {
      {"device", "cpu",
       "where the forward pass runs and the KV pool lives: cpu, cuda (device 0) or cuda:N",
       [](const YAML::Node& node, const std::string& key, EngineConfig& config) -> Status {
         BATON_ASSIGN_OR_RETURN(config.device,
                                parse_device(node.IsScalar() ? node.Scalar() : "", key));
         return Status::ok();
       }},
      {"threads", "0", "compute threads; 0 = one per hardware thread",
       int_setting(&EngineConfig::threads, 0, 1024)},
      {"block_size", "16", "tokens per KV block (a power of two)",
       [](const YAML::Node& node, const std::string& key, EngineConfig& config) -> Status {
         BATON_ASSIGN_OR_RETURN(int64_t v, read_yaml_int(node, key, 1, 256));
         if ((v & (v - 1)) != 0) {
           return invalid_argument(key + ": must be a power of two in [1, 256], got " +
                                   std::to_string(v));
         }
         config.block_size = int32_t(v);
         return Status::ok();
       }},
      {"kv_dtype", "auto",
       "KV cache element type: auto (the checkpoint's), f32, bf16, f16, or an 8-bit format with "
       "a scale per token and KV head: int8, fp8_e4m3 (CPU backend)",
       [](const YAML::Node& node, const std::string& key, EngineConfig& config) -> Status {
         std::string text = node.IsScalar() ? node.Scalar() : "";
         if (text == "auto") {
           config.kv_dtype.reset();
           return Status::ok();
         }
         auto dtype = parse_kv_dtype(text);
         if (!dtype)
           return invalid_argument(
               key + ": expected auto, f32, bf16, f16, int8 or fp8_e4m3, got '" + text + "'");
         config.kv_dtype = *dtype;
         return Status::ok();
       }},
      {"kv_cache_bytes", "256MiB", "KV pool size in bytes (suffixes KiB, MiB, GiB, KB, MB, GB)",
       [](const YAML::Node& node, const std::string& key, EngineConfig& config) -> Status {
         if (!node.IsScalar()) return invalid_argument(key + ": expected a size like 512MiB");
         BATON_ASSIGN_OR_RETURN(config.kv_cache_bytes, parse_byte_size(node.Scalar(), key));
         if (config.kv_cache_bytes == 0) return invalid_argument(key + ": must be positive");
         return Status::ok();
       }},
      {"kv_cache_blocks", "0", "KV pool size in blocks; overrides kv_cache_bytes when > 0",
       int_setting(&EngineConfig::kv_cache_blocks, 0, int64_t(1) << 30)},
      {"max_num_seqs", "256", "sequences in the running batch at once",
       int_setting(&EngineConfig::max_num_seqs, 1, 65536)},
      {"max_num_batched_tokens", "2048", "tokens per step; longer prompts are chunked",
       int_setting(&EngineConfig::max_num_batched_tokens, 1, int64_t(1) << 24)},
      {"max_model_len", "0", "prompt + output token limit; 0 = the model's maximum",
       int_setting(&EngineConfig::max_model_len, 0, int64_t(1) << 24)},
      {"huge_page_weights", "true",
       "read the weights in at start in 2 MiB pages, re-reading a checkpoint the page cache "
       "holds in small pages (batch-1 decode ran about 5% faster); false maps them lazily",
       bool_setting(&EngineConfig::huge_page_weights)},
      {"cpu_bf16_dot", "auto",
       "CPU backend: AVX-512 BF16 dot products (VDPBF16PS) for BF16 weights' prefill GEMM and "
       "BF16 KV's decode V pass: auto = where the CPU issues them faster than F32 FMAs (AMD's "
       "cores; an Intel Xeon issues a quarter as many), true = wherever it has them, false = "
       "never (F32 FMAs)",
       [](const YAML::Node& node, const std::string& key, EngineConfig& config) -> Status {
         const std::string text = node.IsScalar() ? node.Scalar() : "";
         if (text == "auto") {
           config.cpu_bf16_dot.reset();
         } else if (text == "true" || text == "false") {
           config.cpu_bf16_dot = text == "true";
         } else {
           return invalid_argument(key + ": expected auto, true or false, got '" + text + "'");
         }
         return Status::ok();
       }},
      {"enable_prefix_caching", "true",
       "keep computed full KV blocks findable by their tokens: a prompt that starts like an "
       "earlier one shares its blocks instead of computing them, on a prefill node (which still "
       "sends them) and on a decode node (which is then not sent them)",
       bool_setting(&EngineConfig::enable_prefix_caching)},
      {"ssd_cache_dir", "\"\"",
       "directory of the prefix cache's SSD tier: blocks evicted from the KV pool are written "
       "to a file there and read back when a prompt starts with them; empty = no SSD tier",
       [](const YAML::Node& node, const std::string& key, EngineConfig& config) -> Status {
         if (!node.IsScalar()) return invalid_argument(key + ": expected a directory path");
         config.ssd_cache_dir = node.Scalar();
         return Status::ok();
       }},
      {"ssd_cache_bytes", "4GiB", "size of the SSD tier's file at most",
       [](const YAML::Node& node, const std::string& key, EngineConfig& config) -> Status {
         if (!node.IsScalar()) return invalid_argument(key + ": expected a size like 4GiB");
         BATON_ASSIGN_OR_RETURN(config.ssd_cache_bytes, parse_byte_size(node.Scalar(), key));
         if (config.ssd_cache_bytes == 0) return invalid_argument(key + ": must be positive");
         return Status::ok();
       }},
      {"nice", "0",
       "scheduling niceness (0-19) of the node's process: on a host whose cores a prefill and "
       "a decode node share, a prefill node at 10 with threads for every core takes the cores "
       "whenever the decode node's steps leave them",
       int_setting(&EngineConfig::nice, 0, 19)},
  };
  return table;
}

}  // namespace

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

Result<EngineConfig> parse_engine_config(const YAML::Node& node, std::string_view prefix) {
  EngineConfig config;
  if (!node || node.IsNull()) return config;
  if (!node.IsMap()) return invalid_argument(std::string(prefix) + ": expected a mapping");
  for (const auto& entry : node) {
    const std::string name = entry.first.as<std::string>("");
    const std::string key = std::string(prefix) + "." + name;
    const Setting* setting = nullptr;
    for (const auto& s : settings()) {
      if (name == s.name) setting = &s;
    }
    if (setting == nullptr) return invalid_argument(key + ": unknown key");
    BATON_RETURN_IF_ERROR(setting->set(entry.second, key, config));
  }
  return config;
}

Result<EngineConfig> load_engine_config(const std::filesystem::path& yaml_file) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(yaml_file.string());
  } catch (const YAML::Exception& e) {
    return invalid_argument(yaml_file.string() + ": " + e.what());
  }
  if (!root.IsMap() && !root.IsNull()) {
    return invalid_argument(yaml_file.string() + ": expected a mapping at the top level");
  }
  for (const auto& entry : root) {
    std::string name = entry.first.as<std::string>("");
    if (name != "engine")
      return invalid_argument(yaml_file.string() + ": " + name + ": unknown key");
  }
  auto config = parse_engine_config(root["engine"], "engine");
  if (!config.is_ok()) return config.status().with_context(yaml_file.string());
  return config;
}

std::vector<std::string> engine_config_keys() {
  std::vector<std::string> keys;
  for (const auto& s : settings()) keys.emplace_back(s.name);
  return keys;
}

std::string engine_config_reference() {
  std::string out;
  for (const auto& s : settings()) {
    out += "engine.";
    out += s.name;
    out += " (default ";
    out += s.default_text;
    out += "): ";
    out += s.doc;
    out += "\n";
  }
  return out;
}

}  // namespace baton::engine
