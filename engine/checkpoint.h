// engine/checkpoint.h — a Hugging Face checkpoint directory, memory-mapped.
//
// config.json plus model.safetensors, or model-XXXXX-of-YYYYY.safetensors with
// model.safetensors.index.json. Every tensor is validated against the file
// (offsets in range, not overlapping, size = shape x dtype) before use, and
// every weight against the shape the config implies.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/file_mapping.h"
#include "engine/model_config.h"
#include "kernels/cpu/linear.h"

namespace baton::engine {

struct LayerWeights {
  kernels::cpu::WeightView q_proj, k_proj, v_proj, o_proj;
  kernels::cpu::WeightView gate_proj, up_proj, down_proj;
  std::vector<float> q_bias, k_bias, v_bias;  // empty unless attention_bias
  std::vector<float> o_bias;                  // empty unless output_bias
  std::vector<float> q_norm, k_norm;          // [head_dim] each; empty unless qk_norm
  std::vector<float> input_norm;              // input_layernorm.weight, as F32
  std::vector<float> post_attention_norm;     // post_attention_layernorm.weight, as F32
};

struct ModelWeights {
  kernels::cpu::WeightView embed_tokens;  // [vocab, hidden]
  kernels::cpu::WeightView lm_head;       // [vocab, hidden]; embed_tokens when tied
  std::vector<float> final_norm;          // model.norm.weight, as F32
  std::vector<LayerWeights> layers;
};

class SafetensorsFile;  // engine/safetensors.h

// Owns the mapped files; WeightViews in `weights()` point into them.
class Checkpoint {
 public:
  static Result<std::unique_ptr<Checkpoint>> open(const std::filesystem::path& dir);
  // open(), then every file read in now, in 2 MiB pages where the kernel
  // allows it (engine/file_mapping.h; the weights' addresses do not change),
  // holding the directory's LoadLock so processes loading it at once take
  // turns. `report` sums the files'; its note is the first file's that fell
  // short.
  static Result<std::unique_ptr<Checkpoint>> open_in_huge_pages(const std::filesystem::path& dir,
                                                                HugePageReport& report);
  ~Checkpoint();

  const std::filesystem::path& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  // Bytes of all weights the forward pass reads (lm_head counted once when tied):
  // every matrix in its stored dtype, embed_tokens included, plus the F32
  // copies of norms and biases.
  uint64_t weight_bytes() const;
  // The mapped safetensors files (one, or one per shard).
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  Checkpoint() = default;
  HugePageReport map_in_huge_pages();
  std::filesystem::path dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  ModelWeights weights_;
  uint64_t weight_bytes_ = 0;
};

}  // namespace baton::engine
