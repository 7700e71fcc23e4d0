// libFuzzer target: a checkpoint's config.json. Parsing gives a model
// config or an error naming the field; a config that parses has a shape the
// engine can size (heads that divide, windows and RoPE flags per layer) and
// writes back (model_config_to_json, what make-model saves) as a document
// that parses to the same config.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <nlohmann/json.hpp>

#include "engine/model_config.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using baton::engine::ModelConfig;
  using nlohmann::json;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  auto parsed = baton::engine::parse_model_config(doc, "config.json");
  if (!parsed.is_ok()) return 0;
  const ModelConfig& c = *parsed;
  check(c.hidden_size > 0 && c.num_layers > 0 && c.num_heads > 0 && c.num_kv_heads > 0);
  check(c.num_heads % c.num_kv_heads == 0);
  check(c.head_dim > 0 && c.head_dim % 2 == 0);
  check(c.layer_windows.empty() || c.layer_windows.size() == size_t(c.num_layers));
  check(c.no_rope.empty() || c.no_rope.size() == size_t(c.num_layers));
  check(c.attention_scale() > 0);
  check(baton::engine::rope_inv_freq(c).size() == size_t(c.head_dim / 2));
  auto again = baton::engine::parse_model_config(baton::engine::model_config_to_json(c), "again");
  check(again.is_ok());
  const ModelConfig& b = *again;
  check(b.architecture == c.architecture && b.hidden_size == c.hidden_size &&
        b.num_layers == c.num_layers && b.num_heads == c.num_heads &&
        b.num_kv_heads == c.num_kv_heads && b.head_dim == c.head_dim &&
        b.intermediate_size == c.intermediate_size && b.vocab_size == c.vocab_size);
  check(b.attention_bias == c.attention_bias && b.output_bias == c.output_bias &&
        b.qk_norm == c.qk_norm && b.fused_projections == c.fused_projections &&
        b.no_rope == c.no_rope && b.tie_word_embeddings == c.tie_word_embeddings);
  check(b.layer_windows == c.layer_windows && b.rope_theta == c.rope_theta &&
        b.rms_norm_eps == c.rms_norm_eps &&
        b.max_position_embeddings == c.max_position_embeddings &&
        b.rope_scaling.type == c.rope_scaling.type && b.bos_token_id == c.bos_token_id &&
        b.eos_token_ids == c.eos_token_ids);
  check(b.attention_scale() == c.attention_scale() &&
        b.embedding_multiplier == c.embedding_multiplier &&
        b.residual_multiplier == c.residual_multiplier && b.logits_scaling == c.logits_scaling);
  return 0;
}
