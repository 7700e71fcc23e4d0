#include "engine/model_config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <numbers>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/json_file.h"

namespace baton::engine {
namespace {

using nlohmann::json;

// Reads fields of one config.json and words every error the same way:
// "<source>: field '<key>' <problem>".
class FieldReader {
 public:
  FieldReader(const json& doc, std::string_view source) : doc_(doc), source_(source) {}

  Status error(StatusCode code, std::string_view key, std::string_view problem) const {
    std::string m(source_);
    m += ": field '";
    m += key;
    m += "' ";
    m += problem;
    return Status(code, std::move(m));
  }
  Status invalid(std::string_view key, std::string_view problem) const {
    return error(StatusCode::kInvalidArgument, key, problem);
  }

  // Absent and null both mean "not given", as transformers treats them.
  const json* find(std::string_view key) const {
    auto it = doc_.find(key);
    if (it == doc_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  // A positive int32. `fallback` is used when absent; without one the field is required.
  Result<int32_t> positive_int(std::string_view key, std::optional<int32_t> fallback = {}) const {
    const json* v = find(key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return invalid(key, "is required");
    }
    if (!v->is_number_integer()) return invalid(key, "must be an integer, got " + v->dump());
    int64_t x;
    if (v->is_number_unsigned()) {
      uint64_t u = v->get<uint64_t>();
      if (u > uint64_t(std::numeric_limits<int32_t>::max())) {
        return invalid(key, "is too large: " + v->dump());
      }
      x = int64_t(u);
    } else {
      x = v->get<int64_t>();
    }
    if (x <= 0) return invalid(key, "must be positive, got " + v->dump());
    if (x > std::numeric_limits<int32_t>::max()) return invalid(key, "is too large: " + v->dump());
    return int32_t(x);
  }

  Result<double> positive_number(std::string_view key, double fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_number()) return invalid(key, "must be a number, got " + v->dump());
    double x = v->get<double>();
    if (!std::isfinite(x) || x <= 0) return invalid(key, "must be positive, got " + v->dump());
    return x;
  }

  Result<bool> boolean(std::string_view key, bool fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return invalid(key, "must be true or false, got " + v->dump());
    return v->get<bool>();
  }

  // An optional token id: int, or null/absent (-1).
  Result<int32_t> token_id(const json& v, std::string_view key) const {
    if (v.is_null()) return -1;
    if (!v.is_number_integer()) return invalid(key, "must be an integer or null, got " + v.dump());
    int64_t x = v.is_number_unsigned() ? int64_t(std::min<uint64_t>(v.get<uint64_t>(), 1ull << 40))
                                       : v.get<int64_t>();
    if (x < 0 || x > std::numeric_limits<int32_t>::max()) {
      return invalid(key, "is out of range: " + v.dump());
    }
    return int32_t(x);
  }

 private:
  const json& doc_;
  std::string_view source_;
};

// transformers' model_type for each architecture we run.
std::optional<std::string_view> model_type_of(std::string_view architecture) {
  if (architecture == "LlamaForCausalLM") return "llama";
  if (architecture == "MistralForCausalLM") return "mistral";
  if (architecture == "Qwen2ForCausalLM") return "qwen2";
  if (architecture == "Qwen3ForCausalLM") return "qwen3";
  if (architecture == "SmolLM3ForCausalLM") return "smollm3";
  if (architecture == "Phi3ForCausalLM") return "phi3";
  if (architecture == "GraniteForCausalLM") return "granite";
  return std::nullopt;
}

Result<std::string> read_architecture(const json& doc, const FieldReader& r) {
  if (const json* v = r.find("architectures")) {
    if (!v->is_array() || v->empty() || !(*v)[0].is_string()) {
      return r.invalid("architectures", "must be a non-empty list of strings, got " + v->dump());
    }
    std::string arch = (*v)[0].get<std::string>();
    if (!model_type_of(arch)) {
      return r.error(StatusCode::kUnimplemented, "architectures",
                     "\"" + arch +
                         "\" is not supported (LlamaForCausalLM, MistralForCausalLM, "
                         "Qwen2ForCausalLM, Qwen3ForCausalLM, SmolLM3ForCausalLM, "
                         "Phi3ForCausalLM, GraniteForCausalLM are)");
    }
    return arch;
  }
  // Older configs name only the model_type.
  if (const json* v = r.find("model_type"); v != nullptr && v->is_string()) {
    std::string type = v->get<std::string>();
    if (type == "llama") return std::string("LlamaForCausalLM");
    if (type == "mistral") return std::string("MistralForCausalLM");
    if (type == "qwen2") return std::string("Qwen2ForCausalLM");
    if (type == "qwen3") return std::string("Qwen3ForCausalLM");
    if (type == "smollm3") return std::string("SmolLM3ForCausalLM");
    if (type == "phi3") return std::string("Phi3ForCausalLM");
    if (type == "granite") return std::string("GraniteForCausalLM");
  }
  (void)doc;
  return r.error(StatusCode::kUnimplemented, "architectures",
                 "is missing and model_type names no supported model");
}

// `section` is "rope_scaling" (transformers 4) or "rope_parameters"
// (transformers 5, which also moves rope_theta inside it).
Status read_rope_scaling(const FieldReader& r, ModelConfig& c, const std::string& section) {
  const json* v = r.find(section);
  if (v == nullptr) return Status::ok();
  if (!v->is_object()) return r.invalid(section, "must be an object or null");
  if (auto theta = v->find("rope_theta"); theta != v->end() && !theta->is_null()) {
    if (!theta->is_number() || !std::isfinite(theta->get<double>()) || theta->get<double>() <= 0) {
      return r.invalid(section + ".rope_theta", "must be a positive number, got " + theta->dump());
    }
    c.rope_theta = theta->get<double>();
  }
  // transformers accepts both spellings; "rope_type" is the newer one.
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    auto it = v->find(key);
    if (it == v->end() || it->is_null()) continue;
    if (!it->is_string()) return r.invalid(section + "." + key, "must be a string");
    type = it->get<std::string>();
    break;
  }
  if (type.empty()) return r.invalid(section + ".rope_type", "is required");
  // Phi-4-mini rotates part of each head (transformers 5 keeps the factor here).
  if (auto partial = v->find("partial_rotary_factor");
      partial != v->end() && !partial->is_null() && *partial != 1.0) {
    return r.error(StatusCode::kUnimplemented, section + ".partial_rotary_factor",
                   partial->dump() + " is not supported (RoPE over whole heads only)");
  }
  if (type == "default") return Status::ok();
  if (type != "llama3") {
    return r.error(StatusCode::kUnimplemented, section + ".rope_type",
                   "\"" + type + "\" is not supported (only \"llama3\" and \"default\" are)");
  }
  auto number = [&](const char* key) -> Result<double> {
    auto it = v->find(key);
    std::string name = section + "." + key;
    if (it == v->end() || it->is_null()) return r.invalid(name, "is required for llama3");
    if (!it->is_number()) return r.invalid(name, "must be a number, got " + it->dump());
    double x = it->get<double>();
    if (!std::isfinite(x) || x <= 0) return r.invalid(name, "must be positive, got " + it->dump());
    return x;
  };
  c.rope_scaling.type = RopeScaling::Type::kLlama3;
  BATON_ASSIGN_OR_RETURN(c.rope_scaling.factor, number("factor"));
  BATON_ASSIGN_OR_RETURN(c.rope_scaling.low_freq_factor, number("low_freq_factor"));
  BATON_ASSIGN_OR_RETURN(c.rope_scaling.high_freq_factor, number("high_freq_factor"));
  BATON_ASSIGN_OR_RETURN(double original, number("original_max_position_embeddings"));
  auto orig_it = v->find("original_max_position_embeddings");
  if (!orig_it->is_number_integer()) {
    return r.invalid(section + ".original_max_position_embeddings", "must be an integer");
  }
  c.rope_scaling.original_max_position_embeddings = int64_t(original);
  if (c.rope_scaling.factor < 1.0) {
    return r.invalid(section + ".factor", "must be at least 1");
  }
  // The smooth interpolation divides by (high - low).
  if (c.rope_scaling.high_freq_factor <= c.rope_scaling.low_freq_factor) {
    return r.invalid(section + ".high_freq_factor", "must be greater than low_freq_factor");
  }
  return Status::ok();
}

// Granite's four scalings, each 1.0 where absent (attention_multiplier too:
// GraniteConfig's default, which replaces 1/sqrt(head_dim)).
Status read_granite_scalings(const FieldReader& r, ModelConfig& c) {
  auto scaling = [&](const char* key, float& out) -> Status {
    BATON_ASSIGN_OR_RETURN(const double value, r.positive_number(key, 1.0));
    out = float(value);
    if (!(out > 0) || !std::isfinite(out)) return r.invalid(key, "is out of float's range");
    return Status::ok();
  };
  BATON_RETURN_IF_ERROR(scaling("embedding_multiplier", c.embedding_multiplier));
  BATON_RETURN_IF_ERROR(scaling("residual_multiplier", c.residual_multiplier));
  BATON_RETURN_IF_ERROR(scaling("logits_scaling", c.logits_scaling));
  float attention = 1.0f;
  BATON_RETURN_IF_ERROR(scaling("attention_multiplier", attention));
  c.attention_multiplier = attention;
  return Status::ok();
}

// SmolLM3's layers without RoPE: no_rope_layers lists 1 (RoPE) or 0 (none)
// for each layer; where it is absent, every no_rope_layer_interval-th layer
// (default 4) has none.
Status read_rope_layers(const FieldReader& r, ModelConfig& c) {
  std::vector<bool> no_rope(size_t(c.num_layers), false);
  if (const json* v = r.find("no_rope_layers")) {
    if (!v->is_array() || v->size() != size_t(c.num_layers)) {
      return r.invalid("no_rope_layers", "must list " + std::to_string(c.num_layers) +
                                             " flags (1: RoPE, 0: none), got " +
                                             v->dump().substr(0, 80));
    }
    for (size_t i = 0; i < v->size(); ++i) {
      const json& flag = (*v)[i];
      if (flag != 0 && flag != 1) {
        return r.invalid("no_rope_layers",
                         "must hold 1 (RoPE) or 0 (none), got " + flag.dump().substr(0, 40));
      }
      no_rope[i] = flag == 0;
    }
  } else {
    BATON_ASSIGN_OR_RETURN(int32_t interval, r.positive_int("no_rope_layer_interval", 4));
    for (int32_t i = 0; i < c.num_layers; ++i) no_rope[size_t(i)] = (i + 1) % interval == 0;
  }
  if (std::find(no_rope.begin(), no_rope.end(), true) != no_rope.end()) c.no_rope = no_rope;
  return Status::ok();
}

// The sliding window of each layer, as transformers 5 forms it:
//  * Mistral: sliding_window (default 4096; null: none) on every layer.
//  * Phi3: sliding_window (default none) on every layer.
//  * Qwen2 and Qwen3: sliding_window (default 4096) only with
//    use_sliding_window, on the layers layer_types names
//    "sliding_attention", or where it is absent on layers max_window_layers
//    (default 28) and up.
//  * SmolLM3: sliding_window (default none) only with use_sliding_window, on
//    the layers layer_types names, or where it is absent on the layers
//    without RoPE.
Status read_sliding_windows(const FieldReader& r, const json& doc, ModelConfig& c) {
  const bool phi3 = c.architecture == "Phi3ForCausalLM";
  if (phi3 && (!doc.contains("sliding_window") || doc["sliding_window"].is_null())) {
    return Status::ok();
  }
  const bool mistral = c.architecture == "MistralForCausalLM" || phi3;
  const bool smollm3 = c.architecture == "SmolLM3ForCausalLM";
  const bool qwen2 =
      c.architecture == "Qwen2ForCausalLM" || c.architecture == "Qwen3ForCausalLM" || smollm3;
  if (!mistral && !qwen2) return Status::ok();
  bool use = mistral;
  if (qwen2) {
    BATON_ASSIGN_OR_RETURN(use, r.boolean("use_sliding_window", false));
  }
  if (smollm3 && (!doc.contains("sliding_window") || doc["sliding_window"].is_null())) {
    return Status::ok();
  }
  if (!use) return Status::ok();
  int32_t window = 4096;
  if (doc.contains("sliding_window")) {
    if (doc["sliding_window"].is_null()) return Status::ok();
    BATON_ASSIGN_OR_RETURN(window, r.positive_int("sliding_window"));
  }
  std::vector<bool> sliding(size_t(c.num_layers), mistral);
  if (qwen2) {
    if (const json* types = r.find("layer_types")) {
      if (!types->is_array() || types->size() != size_t(c.num_layers)) {
        return r.invalid("layer_types", "must list " + std::to_string(c.num_layers) +
                                            " layer types, got " + types->dump());
      }
      for (size_t i = 0; i < types->size(); ++i) {
        const json& type = (*types)[i];
        if (type == "sliding_attention") {
          sliding[i] = true;
        } else if (type != "full_attention") {
          return r.error(
              StatusCode::kUnimplemented, "layer_types",
              "has " + type.dump() + "; full_attention and sliding_attention are supported");
        }
      }
    } else if (smollm3) {
      for (int32_t i = 0; i < c.num_layers; ++i) sliding[size_t(i)] = !c.uses_rope(i);
    } else {
      int32_t from = 28;
      if (const json* v = r.find("max_window_layers")) {
        if (!v->is_number_integer() || v->get<int64_t>() < 0) {
          return r.invalid("max_window_layers", "must be a non-negative integer, got " + v->dump());
        }
        from = int32_t(std::min<int64_t>(v->get<int64_t>(), c.num_layers));
      }
      for (int32_t i = from; i < c.num_layers; ++i) sliding[size_t(i)] = true;
    }
  }
  if (std::find(sliding.begin(), sliding.end(), true) == sliding.end()) return Status::ok();
  c.layer_windows.assign(size_t(c.num_layers), 0);
  for (size_t i = 0; i < sliding.size(); ++i)
    if (sliding[i]) c.layer_windows[i] = window;
  return Status::ok();
}

// A float as the shortest decimal that reads back to it, so 1e-5f is written
// "1e-05" and not "9.999999747378752e-06".
double shortest_double(float f) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, f);
  *res.ptr = '\0';
  return std::strtod(buf, nullptr);
}

}  // namespace

Result<ModelConfig> parse_model_config(const nlohmann::json& doc, std::string_view source) {
  if (!doc.is_object()) {
    return invalid_argument(std::string(source) + ": config must be a JSON object");
  }
  FieldReader r(doc, source);
  ModelConfig c;
  BATON_ASSIGN_OR_RETURN(c.architecture, read_architecture(doc, r));
  const bool is_qwen2 = c.architecture == "Qwen2ForCausalLM";
  const bool is_qwen3 = c.architecture == "Qwen3ForCausalLM";
  const bool is_smollm3 = c.architecture == "SmolLM3ForCausalLM";
  const bool is_phi3 = c.architecture == "Phi3ForCausalLM";
  const bool is_granite = c.architecture == "GraniteForCausalLM";
  const bool is_llama = c.architecture == "LlamaForCausalLM";

  BATON_ASSIGN_OR_RETURN(c.hidden_size, r.positive_int("hidden_size"));
  BATON_ASSIGN_OR_RETURN(c.num_layers, r.positive_int("num_hidden_layers"));
  // Far past any checkpoint (Llama 3 405B has 126), and refused before a
  // table a layer long is sized by it.
  constexpr int32_t kMaxLayers = 1024;
  if (c.num_layers > kMaxLayers) {
    return r.invalid("num_hidden_layers", "must be at most " + std::to_string(kMaxLayers) +
                                              ", got " + std::to_string(c.num_layers));
  }
  BATON_ASSIGN_OR_RETURN(c.num_heads, r.positive_int("num_attention_heads"));
  BATON_ASSIGN_OR_RETURN(c.intermediate_size, r.positive_int("intermediate_size"));
  BATON_ASSIGN_OR_RETURN(c.vocab_size, r.positive_int("vocab_size"));
  // Keys config.json leaves out take transformers' config class defaults,
  // some of which differ by architecture.
  const int32_t default_kv_heads = is_qwen3 ? 32 : is_smollm3 ? 4 : c.num_heads;
  const int32_t default_max_positions = is_qwen3 || is_smollm3 ? 32768 : is_phi3 ? 4096 : 2048;
  const double default_eps = is_phi3 ? 1e-5 : 1e-6;
  const double default_theta = is_smollm3 ? 2000000.0 : 10000.0;
  BATON_ASSIGN_OR_RETURN(c.num_kv_heads, r.positive_int("num_key_value_heads", default_kv_heads));
  if (c.num_kv_heads > c.num_heads || c.num_heads % c.num_kv_heads != 0) {
    return r.invalid("num_key_value_heads", "(" + std::to_string(c.num_kv_heads) +
                                                ") must divide num_attention_heads (" +
                                                std::to_string(c.num_heads) + ")");
  }
  if (r.find("head_dim") != nullptr) {
    BATON_ASSIGN_OR_RETURN(c.head_dim, r.positive_int("head_dim"));
  } else if (is_qwen3) {
    c.head_dim = 128;
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      return r.invalid("head_dim", "is absent and hidden_size (" + std::to_string(c.hidden_size) +
                                       ") is not a multiple of num_attention_heads (" +
                                       std::to_string(c.num_heads) + ")");
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  // RoPE rotates pairs of dimensions.
  if (c.head_dim % 2 != 0) {
    return r.invalid("head_dim", "must be even for RoPE, got " + std::to_string(c.head_dim));
  }
  BATON_ASSIGN_OR_RETURN(c.max_position_embeddings,
                         r.positive_int("max_position_embeddings", default_max_positions));
  BATON_ASSIGN_OR_RETURN(double eps, r.positive_number("rms_norm_eps", default_eps));
  c.rms_norm_eps = float(eps);
  // A float is what the kernels add; past its range it would be infinite
  // (and written back as null).
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps))
    return r.invalid("rms_norm_eps", "is out of float's range");
  BATON_ASSIGN_OR_RETURN(c.rope_theta, r.positive_number("rope_theta", default_theta));
  BATON_ASSIGN_OR_RETURN(c.tie_word_embeddings,
                         r.boolean("tie_word_embeddings", /*fallback=*/is_smollm3));

  if (const json* v = r.find("hidden_act")) {
    if (!v->is_string()) return r.invalid("hidden_act", "must be a string, got " + v->dump());
    if (v->get<std::string>() != "silu") {
      return r.error(StatusCode::kUnimplemented, "hidden_act",
                     v->dump() + " is not supported (only \"silu\" is)");
    }
  }
  // Qwen2 always has q/k/v biases and no o_proj bias; Mistral and Phi3
  // never have any; Llama, Qwen3, SmolLM3 and Granite say in attention_bias
  // whether q/k/v and o_proj have them. Qwen3 normalizes each head of q and
  // k before RoPE.
  if (is_qwen2) {
    c.attention_bias = true;
  } else if (is_llama || is_qwen3 || is_smollm3 || is_granite) {
    BATON_ASSIGN_OR_RETURN(c.attention_bias, r.boolean("attention_bias", false));
    c.output_bias = c.attention_bias;
  }
  c.qk_norm = is_qwen3;
  if (is_granite) BATON_RETURN_IF_ERROR(read_granite_scalings(r, c));
  c.fused_projections = is_phi3;
  // transformers 4's Phi-4-mini configs give it at the top level.
  if (const json* partial = r.find("partial_rotary_factor");
      partial != nullptr && !partial->is_null() && *partial != 1.0) {
    return r.error(StatusCode::kUnimplemented, "partial_rotary_factor",
                   partial->dump() + " is not supported (RoPE over whole heads only)");
  }
  if (is_smollm3) BATON_RETURN_IF_ERROR(read_rope_layers(r, c));
  BATON_ASSIGN_OR_RETURN(bool mlp_bias, r.boolean("mlp_bias", false));
  if (mlp_bias) {
    return r.error(StatusCode::kUnimplemented, "mlp_bias", "true is not supported");
  }

  const json* rope_scaling = r.find("rope_scaling");
  const json* rope_parameters = r.find("rope_parameters");
  if (rope_scaling != nullptr && !rope_scaling->is_null() && rope_parameters != nullptr &&
      !rope_parameters->is_null()) {
    return r.invalid("rope_parameters", "given together with rope_scaling; give one of them");
  }
  BATON_RETURN_IF_ERROR(read_rope_scaling(r, c, "rope_scaling"));
  BATON_RETURN_IF_ERROR(read_rope_scaling(r, c, "rope_parameters"));
  BATON_RETURN_IF_ERROR(read_sliding_windows(r, doc, c));

  // Token ids: transformers defaults Llama and Mistral to bos 1 / eos 2,
  // SmolLM3 to Llama 3's 128000 / 128001, Phi3 to 1 / 32000, Qwen2 and
  // Qwen3 to none.
  const bool has_default_ids = !is_qwen2 && !is_qwen3;
  const int32_t default_bos = is_smollm3 ? 128000 : 1, default_eos = is_smollm3 ? 128001
                                                                     : is_phi3  ? 32000
                                                                                : 2;
  {
    auto it = doc.find("bos_token_id");
    if (it == doc.end()) {
      c.bos_token_id = has_default_ids ? default_bos : -1;
    } else {
      BATON_ASSIGN_OR_RETURN(c.bos_token_id, r.token_id(*it, "bos_token_id"));
    }
  }
  {
    auto it = doc.find("eos_token_id");
    if (it == doc.end()) {
      if (has_default_ids) c.eos_token_ids = {default_eos};
    } else if (it->is_array()) {
      for (const json& e : *it) {
        if (e.is_null()) return r.invalid("eos_token_id", "list must not contain null");
        BATON_ASSIGN_OR_RETURN(int32_t id, r.token_id(e, "eos_token_id"));
        c.eos_token_ids.push_back(id);
      }
    } else {
      BATON_ASSIGN_OR_RETURN(int32_t id, r.token_id(*it, "eos_token_id"));
      if (id >= 0) c.eos_token_ids.push_back(id);
    }
  }

  // Newer transformers write "dtype", older "torch_dtype".
  for (const char* key : {"torch_dtype", "dtype"}) {
    const json* v = r.find(key);
    if (v == nullptr) continue;
    if (!v->is_string()) return r.invalid(key, "must be a string, got " + v->dump());
    std::string name = v->get<std::string>();
    if (name == "float32") {
      c.torch_dtype = DType::kF32;
    } else if (name == "float16") {
      c.torch_dtype = DType::kF16;
    } else if (name == "bfloat16") {
      c.torch_dtype = DType::kBF16;
    } else {
      return r.error(StatusCode::kUnimplemented, key,
                     "\"" + name + "\" is not supported (float32, float16, bfloat16 are)");
    }
    break;
  }
  return c;
}

Result<ModelConfig> load_model_config(const std::filesystem::path& config_json) {
  BATON_ASSIGN_OR_RETURN(json doc, read_json_file(config_json));
  return parse_model_config(doc, config_json.string());
}

namespace {

// A generation_config.json as a JSON object; an empty one where the file is
// missing (it is optional).
Result<json> read_generation_config(const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return json::object();
  BATON_ASSIGN_OR_RETURN(json doc, read_json_file(file));
  if (!doc.is_object()) {
    return data_loss(file.string() + ": not a JSON object");
  }
  return doc;
}

}  // namespace

Status merge_generation_config(const std::filesystem::path& file, ModelConfig& c) {
  BATON_ASSIGN_OR_RETURN(json doc, read_generation_config(file));
  auto it = doc.find("eos_token_id");
  if (it == doc.end() || it->is_null()) return Status::ok();
  const json ids = it->is_array() ? *it : json::array({*it});
  for (const json& id : ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= int64_t(c.vocab_size)) {
      return data_loss(file.string() + ": eos_token_id " + id.dump() +
                       " is not a token id of the vocabulary of " + std::to_string(c.vocab_size));
    }
    const auto token = id.get<int32_t>();
    if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), token) == c.eos_token_ids.end()) {
      c.eos_token_ids.push_back(token);
    }
  }
  return Status::ok();
}

Result<GenerationDefaults> load_generation_defaults(const std::filesystem::path& file) {
  GenerationDefaults defaults;
  BATON_ASSIGN_OR_RETURN(json doc, read_generation_config(file));
  auto number = [&](const char* key, double lo, double hi) -> Result<std::optional<double>> {
    auto it = doc.find(key);
    if (it == doc.end() || it->is_null()) return std::optional<double>();
    if (!it->is_number() || !(it->get<double>() >= lo && it->get<double>() <= hi)) {
      return data_loss(file.string() + ": " + key + " must be a number in [" + std::to_string(lo) +
                       ", " + std::to_string(hi) + "], got " + it->dump().substr(0, 40));
    }
    return std::optional<double>(it->get<double>());
  };
  BATON_ASSIGN_OR_RETURN(auto temperature, number("temperature", 0, 1e6));
  BATON_ASSIGN_OR_RETURN(auto top_p, number("top_p", 1e-9, 1));
  BATON_ASSIGN_OR_RETURN(auto top_k, number("top_k", -1, 1 << 30));
  if (temperature) defaults.temperature = float(*temperature);
  if (top_p) defaults.top_p = float(*top_p);
  if (top_k) defaults.top_k = int32_t(*top_k);
  return defaults;
}

nlohmann::json model_config_to_json(const ModelConfig& c) {
  json doc = json::object();
  std::string_view type = model_type_of(c.architecture).value_or("llama");
  doc["architectures"] = json::array({c.architecture});
  doc["model_type"] = type;
  doc["hidden_size"] = c.hidden_size;
  doc["intermediate_size"] = c.intermediate_size;
  doc["num_hidden_layers"] = c.num_layers;
  doc["num_attention_heads"] = c.num_heads;
  doc["num_key_value_heads"] = c.num_kv_heads;
  doc["head_dim"] = c.head_dim;
  doc["hidden_act"] = "silu";
  doc["max_position_embeddings"] = c.max_position_embeddings;
  doc["rms_norm_eps"] = shortest_double(c.rms_norm_eps);
  doc["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    doc["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling.factor},
        {"low_freq_factor", c.rope_scaling.low_freq_factor},
        {"high_freq_factor", c.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  } else {
    doc["rope_scaling"] = nullptr;
  }
  doc["tie_word_embeddings"] = c.tie_word_embeddings;
  doc["vocab_size"] = c.vocab_size;
  doc["initializer_range"] = 0.02;
  doc["attention_dropout"] = 0.0;
  doc["use_cache"] = true;
  if (type == "llama" || type == "qwen3" || type == "smollm3" || type == "granite") {
    doc["attention_bias"] = c.attention_bias;
  }
  if (type == "granite") {
    doc["embedding_multiplier"] = shortest_double(c.embedding_multiplier);
    doc["residual_multiplier"] = shortest_double(c.residual_multiplier);
    doc["logits_scaling"] = shortest_double(c.logits_scaling);
    doc["attention_multiplier"] = shortest_double(c.attention_multiplier.value_or(1.0f));
  }
  if (type == "smollm3") {
    json layers = json::array();
    for (int32_t i = 0; i < c.num_layers; ++i) layers.push_back(c.uses_rope(i) ? 1 : 0);
    doc["no_rope_layers"] = layers;
  }
  if (type == "llama") {
    doc["mlp_bias"] = false;
    doc["pretraining_tp"] = 1;
  } else if (type == "mistral" || type == "phi3") {
    // Mistral's (and Phi3's) one window covers every layer: the first layer's that has one.
    json window = nullptr;
    for (int32_t w : c.layer_windows) {
      if (w > 0) {
        window = w;
        break;
      }
    }
    doc["sliding_window"] = window;
  } else if (type == "qwen2" || type == "qwen3" || type == "smollm3") {
    const bool windowed = std::any_of(c.layer_windows.begin(), c.layer_windows.end(),
                                      [](int32_t w) { return w > 0; });
    doc["use_sliding_window"] = windowed;
    int32_t window = c.max_position_embeddings;
    json types = json::array();
    for (int32_t i = 0; i < c.num_layers; ++i) {
      if (c.window_of(i) > 0) window = c.window_of(i);
      types.push_back(c.window_of(i) > 0 ? "sliding_attention" : "full_attention");
    }
    doc["sliding_window"] = window;
    doc["max_window_layers"] = c.num_layers;
    if (windowed) doc["layer_types"] = types;
  }
  // Some config classes default the pad id past a small vocabulary
  // (SmolLM3's 128004, Phi3's 32000), which transformers then refuses.
  doc["pad_token_id"] = nullptr;
  doc["bos_token_id"] = c.bos_token_id >= 0 ? json(c.bos_token_id) : json(nullptr);
  if (c.eos_token_ids.empty()) {
    doc["eos_token_id"] = nullptr;
  } else if (c.eos_token_ids.size() == 1) {
    doc["eos_token_id"] = c.eos_token_ids[0];
  } else {
    doc["eos_token_id"] = c.eos_token_ids;
  }
  switch (c.torch_dtype) {
    case DType::kF32:
      doc["torch_dtype"] = "float32";
      break;
    case DType::kF16:
      doc["torch_dtype"] = "float16";
      break;
    case DType::kBF16:
      doc["torch_dtype"] = "bfloat16";
      break;
    case DType::kI8:
    case DType::kFP8E4M3:
      break;  // KV formats, never a checkpoint's
  }
  doc["transformers_version"] = "4.46.0";
  return doc;
}

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> out(size_t(std::max(half, 0)));
  const RopeScaling& s = c.rope_scaling;
  // transformers' _compute_llama3_parameters, in double.
  const double old_context = double(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  for (int i = 0; i < half; ++i) {
    double inv = 1.0 / std::pow(c.rope_theta, double(2 * i) / double(c.head_dim));
    if (s.type == RopeScaling::Type::kLlama3) {
      const double wavelen = 2.0 * std::numbers::pi / inv;
      if (wavelen > low_freq_wavelen) {
        inv = inv / s.factor;  // low frequencies: fully interpolated
      } else if (wavelen >= high_freq_wavelen) {
        const double smooth =
            (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        inv = (1.0 - smooth) * inv / s.factor + smooth * inv;
      }  // high frequencies: unchanged
    }
    out[size_t(i)] = float(inv);
  }
  return out;
}

KvLayout kv_layout_of(const ModelConfig& config, int32_t block_size, DType dtype,
                      KeyOrder key_order, int32_t num_blocks) {
  return KvLayout{.num_layers = config.num_layers,
                  .num_blocks = num_blocks,
                  .block_size = block_size,
                  .num_kv_heads = config.num_kv_heads,
                  .head_dim = config.head_dim,
                  .dtype = dtype,
                  .key_order = key_order};
}

}  // namespace baton::engine
