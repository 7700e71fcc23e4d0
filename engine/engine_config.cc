#include "engine/engine_config.h"

#include "common/regular_file.h"
#include "engine/yaml_settings.h"

#include <yaml-cpp/yaml.h>

#include <vector>

namespace baton::engine {
namespace {

using Setting = YamlSetting<EngineConfig>;

const YamlSettings<EngineConfig>& settings() {
  using E = EngineConfig;
  static const YamlSettings<EngineConfig> table = {
      {"device",
       "where the forward pass runs and the KV pool lives: cpu, cuda (device 0) or cuda:N",
       [](const YAML::Node& node, const std::string& key, E& config) -> Status {
         BATON_ASSIGN_OR_RETURN(config.device,
                                parse_device(node.IsScalar() ? node.Scalar() : "", key));
         return Status::ok();
       },
       [](const E& config) { return config.device.name(); }},
      int_setting("threads", &E::threads, 0, 1024, "compute threads; 0 = one per hardware thread"),
      {"block_size", "tokens per KV block (a power of two)",
       [](const YAML::Node& node, const std::string& key, E& config) -> Status {
         BATON_ASSIGN_OR_RETURN(int64_t v, read_yaml_int(node, key, 1, 256));
         if ((v & (v - 1)) != 0) {
           return invalid_argument(key + ": must be a power of two in [1, 256], got " +
                                   std::to_string(v));
         }
         config.block_size = int32_t(v);
         return Status::ok();
       },
       [](const E& config) { return std::to_string(config.block_size); }},
      {"kv_dtype",
       "KV cache element type: auto (the checkpoint's), f32, bf16, f16, or an 8-bit format with "
       "a scale per token and KV head: int8, fp8_e4m3 (CPU backend)",
       [](const YAML::Node& node, const std::string& key, E& config) -> Status {
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
       },
       [](const E& config) {
         return config.kv_dtype ? std::string(dtype_name(*config.kv_dtype)) : "auto";
       }},
      byte_size_setting("kv_cache_bytes", &E::kv_cache_bytes,
                        "KV pool size in bytes (suffixes KiB, MiB, GiB, KB, MB, GB)"),
      int_setting("kv_cache_blocks", &E::kv_cache_blocks, 0, int64_t(1) << 30,
                  "KV pool size in blocks; overrides kv_cache_bytes and memory_fraction when > 0"),
      {"memory_fraction",
       "share of the memory the node computes in (the device's; the host's for a CPU node) "
       "that its weights, a step's workspace and its KV pool may take together, the pool "
       "getting what the others leave; overrides kv_cache_bytes when > 0 (0 = off); nodes "
       "sharing a device each take their part of it",
       [](const YAML::Node& node, const std::string& key, E& config) -> Status {
         BATON_ASSIGN_OR_RETURN(config.memory_fraction, read_yaml_fraction(node, key));
         return Status::ok();
       },
       [](const E& config) { return format_fraction(config.memory_fraction); }},
      int_setting("max_num_seqs", &E::max_num_seqs, 1, 65536,
                  "sequences in the running batch at once"),
      int_setting("max_num_batched_tokens", &E::max_num_batched_tokens, 1, int64_t(1) << 24,
                  "tokens per step; longer prompts are chunked"),
      int_setting("max_model_len", &E::max_model_len, 0, int64_t(1) << 24,
                  "prompt + output token limit; 0 = the model's maximum"),
      bool_setting("huge_page_weights", &E::huge_page_weights,
                   "read the weights in at start in 2 MiB pages, re-reading a checkpoint the "
                   "page cache holds in small pages (batch-1 decode ran about 5% faster); false "
                   "maps them lazily"),
      {"cpu_bf16_dot",
       "CPU backend: AVX-512 BF16 dot products (VDPBF16PS) for BF16 weights' prefill GEMM and "
       "BF16 KV's decode V pass: auto = where the CPU issues them faster than F32 FMAs (AMD's "
       "cores; an Intel Xeon issues a quarter as many), true = wherever it has them, false = "
       "never (F32 FMAs)",
       [](const YAML::Node& node, const std::string& key, E& config) -> Status {
         const std::string text = node.IsScalar() ? node.Scalar() : "";
         if (text == "auto") {
           config.cpu_bf16_dot.reset();
         } else if (text == "true" || text == "false") {
           config.cpu_bf16_dot = text == "true";
         } else {
           return invalid_argument(key + ": expected auto, true or false, got '" + text + "'");
         }
         return Status::ok();
       },
       [](const E& config) {
         return !config.cpu_bf16_dot ? "auto" : *config.cpu_bf16_dot ? "true" : "false";
       }},
      bool_setting("enable_prefix_caching", &E::enable_prefix_caching,
                   "keep computed full KV blocks findable by their tokens: a prompt that starts "
                   "like an earlier one shares its blocks instead of computing them, on a "
                   "prefill node (which still sends them) and on a decode node (which is then "
                   "not sent them)"),
      {"ssd_cache_dir",
       "directory of the prefix cache's SSD tier: blocks evicted from the KV pool are written "
       "to a file there and read back when a prompt starts with them; empty = no SSD tier",
       [](const YAML::Node& node, const std::string& key, E& config) -> Status {
         if (!node.IsScalar()) return invalid_argument(key + ": expected a directory path");
         config.ssd_cache_dir = node.Scalar();
         return Status::ok();
       },
       [](const E& config) {
         return config.ssd_cache_dir.empty() ? std::string("\"\"") : config.ssd_cache_dir;
       }},
      byte_size_setting("ssd_cache_bytes", &E::ssd_cache_bytes,
                        "size of the SSD tier's file at most"),
      int_setting("nice", &E::nice, 0, 19,
                  "scheduling niceness (0-19) of the node's process: on a host whose cores a "
                  "prefill and a decode node share, a prefill node at 10 with threads for every "
                  "core takes the cores whenever the decode node's steps leave them"),
      ms_setting("min_step_interval_ms", &E::min_step_interval, 0, 10000,
                 "a node's engine steps start at least this many ms apart (0: back to back): on "
                 "a host whose cores a decode node shares with a prefill node, the decode node's "
                 "time per output token becomes about this long and the prefill node gets the "
                 "rest of each interval"),
  };
  return table;
}

}  // namespace

Result<EngineConfig> parse_engine_config(const YAML::Node& node, std::string_view prefix) {
  EngineConfig config;
  if (node && !node.IsNull() && !node.IsMap())
    return invalid_argument(std::string(prefix) + ": expected a mapping");
  BATON_RETURN_IF_ERROR(read_yaml_settings(node, prefix, settings(), config));
  return config;
}

Result<EngineConfig> load_engine_config(const std::filesystem::path& yaml_file) {
  BATON_RETURN_IF_ERROR(check_regular_file(yaml_file));
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

std::string engine_config_reference() { return yaml_settings_reference("engine", settings()); }

}  // namespace baton::engine
