// engine/engine_config.h — every setting of the engine, declared once.
//
// Read from the `engine:` mapping of a YAML file (yaml-cpp), validated as a
// whole, then passed around as this immutable struct. Missing keys take their
// defaults; an unknown key or an out-of-range value is an error naming it
// (e.g. "engine.block_size: must be a power of two in [1, 256], got 24").
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "engine/device.h"

namespace YAML {
class Node;
}

namespace baton::engine {

struct EngineConfig {
  Device device;                           // where the forward pass runs
  int32_t threads = 0;                     // 0: one per hardware thread
  int32_t block_size = 16;                 // tokens per KV block
  std::optional<DType> kv_dtype;           // unset: the checkpoint's torch_dtype
  uint64_t kv_cache_bytes = 256ull << 20;  // pool size when kv_cache_blocks is unset
  int32_t kv_cache_blocks = 0;             // > 0 overrides kv_cache_bytes
  // > 0: the share of its memory (the device's, or the host's for the CPU
  // backend) the node may hold in weights, a step's workspace and the KV
  // pool, which gets what the first two leave; overrides kv_cache_bytes,
  // kv_cache_blocks overrides it. Nodes sharing a device give each its part.
  double memory_fraction = 0;
  int32_t max_num_seqs = 256;             // running sequences at once
  int32_t max_num_batched_tokens = 2048;  // tokens per step (chunked prefill above it)
  int32_t max_model_len = 0;              // 0: the model's max_position_embeddings
  bool huge_page_weights = true;          // read weights in at start, in 2 MiB pages (CPU)
  // CPU backend: whether BF16 weights' prefill GEMM and BF16 KV's decode V
  // pass take AVX-512 BF16 dot products (VDPBF16PS) where the CPU has them;
  // unset: where it issues them faster than F32 FMAs (AMD's cores, not
  // Intel's; kernels/cpu/cpu_features.h). The setting is the process's.
  // Where the CPU has AMX, BF16 prefill runs on its tiles either way
  // (BATON_MAX_CPU_ISA=avx512 turns them off).
  std::optional<bool> cpu_bf16_dot;
  bool enable_prefix_caching = true;      // share computed full blocks by their tokens
  std::string ssd_cache_dir;              // the prefix cache's SSD tier; empty: none
  uint64_t ssd_cache_bytes = 4ull << 30;  // its file's size at most
  // Scheduling niceness (0-19) the node's process takes at start, before its
  // threads; the engine itself does not read it (tools/process_priority.h).
  int32_t nice = 0;
  // A node's steps start at least this far apart (0: back to back); the
  // engine itself does not read it (node/node_runtime.h).
  std::chrono::milliseconds min_step_interval{0};

  // Whether memory_fraction sizes the KV pool (where the memory is known,
  // at start: `baton up` cannot hold it against the model beforehand).
  bool sized_by_memory_fraction() const { return kv_cache_blocks == 0 && memory_fraction > 0; }
  // The setting that sized the KV pool, for messages about its size.
  const char* pool_size_setting() const {
    return kv_cache_blocks > 0   ? "engine.kv_cache_blocks"
           : memory_fraction > 0 ? "engine.memory_fraction"
                                 : "engine.kv_cache_bytes";
  }
};

// Parses `node` (a mapping). `prefix` names it in errors, e.g. "engine".
Result<EngineConfig> parse_engine_config(const YAML::Node& node, std::string_view prefix);
// Reads the `engine:` mapping of a YAML file (absent: all defaults).
Result<EngineConfig> load_engine_config(const std::filesystem::path& yaml_file);

// The setting names, in declaration order (CLI flags are derived from them).
std::vector<std::string> engine_config_keys();
// One line per setting: name, default, meaning (shown by `baton generate --help`).
std::string engine_config_reference();

}  // namespace baton::engine
