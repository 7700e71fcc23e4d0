// Named model shapes for make-model: tiny ones for tests, real models' shapes
// (with random weights) for benchmarks.
#include <functional>
#include <utility>

#include "engine/make_model.h"
#include "engine/tokenizer.h"

namespace baton::engine {
namespace {

ModelConfig base(std::string architecture) {
  ModelConfig c;
  c.architecture = std::move(architecture);
  // Random checkpoints ship Baton's byte tokenizer; its special ids.
  c.bos_token_id = ByteTokenizer::kBosId;
  c.eos_token_ids = {ByteTokenizer::kEosId};
  c.torch_dtype = DType::kF32;
  return c;
}

// The tiny presets' common shape: 2 layers of 4 heads of 16 over a hidden
// size of 64, 2 KV heads, FFN 128, a 512-token vocabulary.
ModelConfig tiny_shape(std::string architecture) {
  ModelConfig c = base(std::move(architecture));
  c.hidden_size = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.intermediate_size = 128;
  c.vocab_size = 512;
  c.max_position_embeddings = 2048;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = false;
  return c;
}

ModelConfig tiny() {
  ModelConfig c = tiny_shape("LlamaForCausalLM");
  c.num_kv_heads = 1;  // GQA 4:1
  c.rms_norm_eps = 1e-5f;
  return c;
}

ModelConfig tiny_qwen2() {
  ModelConfig c = tiny_shape("Qwen2ForCausalLM");
  c.rope_theta = 1000000.0;
  c.tie_word_embeddings = true;
  c.attention_bias = true;
  return c;
}

// Qwen3's q and k norms, with heads wider than hidden_size / num_heads, and
// attention_bias (q/k/v and o_proj biases; off in the real Qwen3 models).
ModelConfig tiny_qwen3() {
  ModelConfig c = tiny_shape("Qwen3ForCausalLM");
  c.head_dim = 32;
  c.rope_theta = 1000000.0;
  c.tie_word_embeddings = true;
  c.attention_bias = true;
  c.output_bias = true;
  c.qk_norm = true;
  return c;
}

// SmolLM3's layers without RoPE (every fourth, as its config class makes
// them), with heads of 16 over a hidden size of 64.
ModelConfig tiny_smollm3() {
  ModelConfig c = tiny_shape("SmolLM3ForCausalLM");
  c.num_layers = 4;
  c.rope_theta = 5000000.0;
  c.tie_word_embeddings = true;
  c.no_rope = {false, false, false, true};
  return c;
}

// Granite's four scalings, with attention_bias (q/k/v and o_proj biases).
ModelConfig tiny_granite() {
  ModelConfig c = tiny_shape("GraniteForCausalLM");
  c.rms_norm_eps = 1e-5f;
  c.tie_word_embeddings = true;
  c.attention_bias = true;
  c.output_bias = true;
  c.embedding_multiplier = 12.0f;
  c.residual_multiplier = 0.22f;
  c.logits_scaling = 8.0f;
  c.attention_multiplier = 0.015625f;
  return c;
}

// Phi3's fused q/k/v and gate/up projections, with a window on every layer.
ModelConfig tiny_phi3() {
  ModelConfig c = tiny_shape("Phi3ForCausalLM");
  c.num_kv_heads = 4;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-5f;
  c.fused_projections = true;
  c.layer_windows = {2047, 2047};
  return c;
}

ModelConfig smollm2_135m() {
  ModelConfig c = base("LlamaForCausalLM");
  c.hidden_size = 576;
  c.num_layers = 30;
  c.num_heads = 9;
  c.num_kv_heads = 3;
  c.head_dim = 64;
  c.intermediate_size = 1536;
  c.vocab_size = 49152;
  c.max_position_embeddings = 8192;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 100000.0;
  c.tie_word_embeddings = true;
  return c;
}

ModelConfig qwen25_05b() {
  ModelConfig c = base("Qwen2ForCausalLM");
  c.hidden_size = 896;
  c.num_layers = 24;
  c.num_heads = 14;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 4864;
  c.vocab_size = 151936;
  c.max_position_embeddings = 32768;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 1000000.0;
  c.tie_word_embeddings = true;
  c.attention_bias = true;
  return c;
}

ModelConfig qwen3_06b() {
  ModelConfig c = base("Qwen3ForCausalLM");
  c.hidden_size = 1024;
  c.num_layers = 28;
  c.num_heads = 16;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.intermediate_size = 3072;
  c.vocab_size = 151936;
  c.max_position_embeddings = 40960;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 1000000.0;
  c.tie_word_embeddings = true;
  c.qk_norm = true;
  return c;
}

// Phi-3-mini-4k: fused projections, a 2047-token window on every layer.
ModelConfig phi3_mini() {
  ModelConfig c = base("Phi3ForCausalLM");
  c.hidden_size = 3072;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 32;
  c.head_dim = 96;
  c.intermediate_size = 8192;
  c.vocab_size = 32064;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 10000.0;
  c.fused_projections = true;
  c.layer_windows.assign(32, 2047);
  return c;
}

ModelConfig llama3_8b() {
  ModelConfig c = base("LlamaForCausalLM");
  c.hidden_size = 4096;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.intermediate_size = 14336;
  c.vocab_size = 128256;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 500000.0;
  c.rope_scaling.type = RopeScaling::Type::kLlama3;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 8192;
  c.tie_word_embeddings = false;
  return c;
}

const std::pair<const char*, ModelConfig (*)()> kPresets[] = {
    {"tiny", tiny},
    {"tiny-qwen2", tiny_qwen2},
    {"tiny-qwen3", tiny_qwen3},
    {"tiny-smollm3", tiny_smollm3},
    {"tiny-phi3", tiny_phi3},
    {"tiny-granite", tiny_granite},
    {"smollm2-135m", smollm2_135m},
    {"qwen2.5-0.5b", qwen25_05b},
    {"qwen3-0.6b", qwen3_06b},
    {"phi3-mini", phi3_mini},
    {"llama3-8b", llama3_8b},
};

}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, make] : kPresets) names.emplace_back(name);
  return names;
}

Result<ModelConfig> model_preset(std::string_view name) {
  std::string known;
  for (const auto& [preset, make] : kPresets) {
    if (name == preset) return make();
    if (!known.empty()) known += ", ";
    known += preset;
  }
  return not_found("unknown model preset '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace baton::engine
