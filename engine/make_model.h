// engine/make_model.h — random-weight checkpoints in Hugging Face's exact
// format (config.json, safetensors, plus Baton's byte tokenizer), for named
// model shapes. Deterministic from the seed; written tensor by tensor so even
// llama3-8b never needs its full size in memory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "engine/model_config.h"
#include "engine/safetensors_writer.h"

namespace baton::engine {

std::vector<std::string> model_preset_names();
// tiny, smollm2-135m, qwen2.5-0.5b, llama3-8b, ...; unknown names are an error listing the known.
Result<ModelConfig> model_preset(std::string_view name);

struct MakeModelOptions {
  uint64_t seed = 0;
  DType dtype = DType::kF32;
  // Shard into several safetensors files (with an index) above this size.
  uint64_t max_shard_bytes = uint64_t(4) << 30;
};

// The tensors make_random_checkpoint writes for `config`, in file order
// (sizes before writing anything; parameter counts).
std::vector<TensorSpec> random_checkpoint_tensors(const ModelConfig& config, DType dtype);

// Writes config.json, model.safetensors (or shards plus
// model.safetensors.index.json above max_shard_bytes) and the byte tokenizer
// into `out_dir`, through a hidden temporary sibling renamed into place at the
// end. An existing `out_dir` is replaced only when it holds nothing but
// checkpoint files.
Status make_random_checkpoint(const ModelConfig& config, const std::filesystem::path& out_dir,
                              const MakeModelOptions& options);

// Gives a made checkpoint a real tokenizer: tokenizer.json from
// `tokenizer_dir` (with tokenizer_config.json and special_tokens_map.json
// when there) replaces Baton's byte tokenizer, and config.json takes the
// tokenizer's BOS and EOS ids. The tokenizer must load and its ids must fit
// the model's vocabulary, or nothing is changed.
Status attach_tokenizer(const std::filesystem::path& checkpoint_dir,
                        const std::filesystem::path& tokenizer_dir);

}  // namespace baton::engine
