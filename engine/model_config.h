// engine/model_config.h — the model's shape and numerics, read from a Hugging
// Face config.json (Llama family: LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM, SmolLM3ForCausalLM, Phi3ForCausalLM,
// GraniteForCausalLM; SmolLM2 is a Llama). Anything the engine
// does not implement is refused with an error naming the field, never run with wrong output.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/dtype.h"
#include "common/kv_layout.h"
#include "common/status.h"
#include "kernels/attention_params.h"

namespace baton::engine {

struct RopeScaling {
  enum class Type { kNone, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  int32_t hidden_size = 0;
  int32_t num_layers = 0;    // num_hidden_layers
  int32_t num_heads = 0;     // num_attention_heads
  int32_t num_kv_heads = 0;  // num_key_value_heads (defaults to num_heads)
  int32_t head_dim = 0;      // head_dim, or hidden_size / num_heads
  int32_t intermediate_size = 0;
  int32_t vocab_size = 0;
  int32_t max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (always on for Qwen2)
  bool output_bias = false;     // an o_proj bias (Llama's and Qwen3's attention_bias)
  bool qk_norm = false;         // RMSNorm over each head of q and of k before RoPE (Qwen3)
  // Granite's scalings: the embeddings are multiplied by
  // embedding_multiplier, each block's output by residual_multiplier before
  // it joins the residual stream, the logits divided by logits_scaling, and
  // attention scores scaled by attention_multiplier instead of
  // 1/sqrt(head_dim).
  float embedding_multiplier = 1.0f;
  float residual_multiplier = 1.0f;
  float logits_scaling = 1.0f;
  std::optional<float> attention_multiplier;
  // Phi3's: q/k/v in one qkv_proj, gate and up in one gate_up_proj.
  bool fused_projections = false;
  // Per layer: true where the layer applies no RoPE (SmolLM3's NoPE layers).
  // Empty: every layer applies it.
  std::vector<bool> no_rope;
  int32_t bos_token_id = -1;  // -1: none
  std::vector<int32_t> eos_token_ids;
  DType torch_dtype = DType::kF32;
  // Per layer, as transformers forms it from sliding_window,
  // use_sliding_window, max_window_layers and layer_types: > 0, the
  // sliding window of that layer's attention; 0, full attention. Empty
  // means no layer has a window.
  std::vector<int32_t> layer_windows;

  int32_t group_size() const { return num_heads / num_kv_heads; }
  float attention_scale() const {
    return attention_multiplier ? *attention_multiplier : 1.0f / std::sqrt(float(head_dim));
  }
  bool uses_rope(int32_t layer) const { return no_rope.empty() || !no_rope[size_t(layer)]; }
  int32_t window_of(int32_t layer) const { return kernels::layer_window(layer_windows, layer); }
  // kernels::kv_window of the layers: keys further back than this are read
  // by no layer, so their blocks can be given back.
  int32_t kv_window() const { return kernels::kv_window(layer_windows); }
};

// Parses and validates a config.json document. `source` names it in errors.
Result<ModelConfig> parse_model_config(const nlohmann::json& doc, std::string_view source);
Result<ModelConfig> load_model_config(const std::filesystem::path& config_json);
// Adds the eos_token_id of a checkpoint's generation_config.json (one id or
// a list) to config.eos_token_ids, as vLLM stops on both: instruct models
// list their end-of-turn tokens there (Llama 3's <|eot_id|>). A missing
// file changes nothing; an unreadable one or a bad id is an error naming it.
Status merge_generation_config(const std::filesystem::path& generation_config_json,
                               ModelConfig& config);

// The sampling defaults of a checkpoint's generation_config.json, which
// requests that leave a field out get (as vLLM applies them); unset where
// the file is missing or does not set them.
struct GenerationDefaults {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
};
Result<GenerationDefaults> load_generation_defaults(
    const std::filesystem::path& generation_config_json);

// The inverse, as Hugging Face writes it (used by make-model).
nlohmann::json model_config_to_json(const ModelConfig& config);

// θ_i of RoPE for i < head_dim / 2, with rope_scaling applied.
std::vector<float> rope_inv_freq(const ModelConfig& config);

// The paged KV pool's geometry for `config`'s layers and KV heads: the one
// place a KvLayout is made from a model (the engine's pool, the model's
// views of it, the cluster YAML's sizing checks).
KvLayout kv_layout_of(const ModelConfig& config, int32_t block_size, DType dtype,
                      KeyOrder key_order, int32_t num_blocks = 0);

}  // namespace baton::engine
