#include "engine/model_config.h"

#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "engine/make_model.h"
#include "tests/engine/loader_test_util.h"

namespace baton::engine {
namespace {

using loader_testing::expect_error;
using loader_testing::ScratchDir;
using loader_testing::write_file;
using nlohmann::json;

// config.json of HuggingFaceTB/SmolLM2-135M, as published.
const char* kSmolLM2 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 0, "eos_token_id": 0, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 576, "initializer_range": 0.041666666666666664, "intermediate_size": 1536,
  "is_llama_config": true, "max_position_embeddings": 8192, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
  "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_interleaved": false, "rope_scaling": null, "rope_theta": 100000,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.42.3",
  "use_cache": true, "vocab_size": 49152})";

// meta-llama/Llama-3.1-8B.
const char* kLlama31 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

// Qwen/Qwen2.5-0.5B.
const char* kQwen25 = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

// Qwen/Qwen3-0.6B.
const char* kQwen3 = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

// mistralai/Mistral-7B-v0.3 (no sliding window).
const char* kMistral = R"({
  "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.42.0.dev0",
  "use_cache": true, "vocab_size": 32768})";

const char* kMinimal = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
  "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
  "vocab_size": 300})";

json doc(const char* text) { return json::parse(text); }

Result<ModelConfig> parse(const json& j) { return parse_model_config(j, "test/config.json"); }

TEST(ModelConfigTest, ParsesSmolLM2) {
  auto c = parse(doc(kSmolLM2));
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->hidden_size, 576);
  EXPECT_EQ(c->num_layers, 30);
  EXPECT_EQ(c->num_heads, 9);
  EXPECT_EQ(c->num_kv_heads, 3);
  EXPECT_EQ(c->group_size(), 3);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->intermediate_size, 1536);
  EXPECT_EQ(c->vocab_size, 49152);
  EXPECT_EQ(c->max_position_embeddings, 8192);
  EXPECT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_EQ(c->rope_theta, 100000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->bos_token_id, 0);
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{0});
  EXPECT_EQ(c->torch_dtype, DType::kBF16);
}

TEST(ModelConfigTest, ParsesLlama31WithLlama3RopeScaling) {
  auto c = parse(doc(kLlama31));
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->head_dim, 128);  // absent: 4096 / 32
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_EQ(c->rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_FALSE(c->tie_word_embeddings);
}

// transformers 5 writes rope_theta and the scaling inside "rope_parameters".
TEST(ModelConfigTest, ParsesTransformers5RopeParameters) {
  json j = doc(kLlama31);
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 250000.0},
                          {"factor", 4.0},           {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 4096}};
  auto c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->rope_theta, 250000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 4096);

  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);

  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 4.0}};
  c = parse(j);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(c.status().message().find("rope_parameters.rope_type"), std::string::npos);

  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", -1}};
  EXPECT_NE(parse(j).status().message().find("rope_parameters.rope_theta"), std::string::npos);

  j["rope_parameters"] = {{"rope_type", "default"}};
  j["rope_scaling"] = {{"rope_type", "llama3"}};
  EXPECT_NE(parse(j).status().message().find("rope_parameters"), std::string::npos);
}

TEST(ModelConfigTest, ParsesQwen25WithBiasAndInactiveWindow) {
  auto c = parse(doc(kQwen25));
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "Qwen2ForCausalLM");
  EXPECT_TRUE(c->attention_bias);  // Qwen2 always has q/k/v biases
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->rms_norm_eps, 1e-6f);
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{151643});
}

// Qwen3: q/k norms, no biases unless attention_bias (which then covers
// o_proj too, as Llama's does), heads wider than hidden / heads, Qwen2's
// rules for windows and no default token ids.
TEST(ModelConfigTest, ParsesQwen3WithQkNorms) {
  auto c = parse(doc(kQwen3));
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->output_bias);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_heads * c->head_dim, 2 * c->hidden_size);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_TRUE(c->layer_windows.empty());
  EXPECT_EQ(c->bos_token_id, 151643);
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{151645});

  json j = doc(kQwen3);
  j["attention_bias"] = true;
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  j.erase("bos_token_id");
  j.erase("eos_token_id");
  c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_TRUE(c->attention_bias);
  EXPECT_TRUE(c->output_bias);
  EXPECT_EQ(c->window_of(27), 0) << "max_window_layers 28: no layer of 28 has one";
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_TRUE(c->eos_token_ids.empty());
  j["max_window_layers"] = 20;
  c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->window_of(19), 0);
  EXPECT_EQ(c->window_of(20), 4096);

  // Qwen3Config's defaults where keys are absent: heads of 128, 32 KV heads.
  j = {{"architectures", {"Qwen3ForCausalLM"}},
       {"hidden_size", 1024},
       {"num_hidden_layers", 2},
       {"num_attention_heads", 32},
       {"intermediate_size", 3072},
       {"vocab_size", 1000}};
  c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_kv_heads, 32);
  EXPECT_EQ(c->max_position_embeddings, 32768);
  EXPECT_FALSE(c->tie_word_embeddings);

  // Older configs name only the model_type.
  j = doc(kQwen3);
  j.erase("architectures");
  c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(c->qk_norm);
}

// SmolLM3: Llama with layers that apply no RoPE, listed in no_rope_layers
// or every no_rope_layer_interval-th; its config class's defaults (tied
// embeddings, 4 KV heads, Llama 3's token ids) where keys are absent, and
// windows, when used, on the layers without RoPE.
TEST(ModelConfigTest, ParsesSmolLM3LayersWithoutRope) {
  json j = {{"architectures", {"SmolLM3ForCausalLM"}},
            {"hidden_size", 2048},
            {"num_hidden_layers", 8},
            {"num_attention_heads", 16},
            {"intermediate_size", 11008},
            {"vocab_size", 128256}};
  auto c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->no_rope, (std::vector<bool>{false, false, false, true, false, false, false, true}));
  EXPECT_FALSE(c->uses_rope(3));
  EXPECT_TRUE(c->uses_rope(4));
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{128001});
  EXPECT_FALSE(c->attention_bias);
  EXPECT_TRUE(c->layer_windows.empty());

  j["no_rope_layer_interval"] = 3;
  c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->no_rope, (std::vector<bool>{false, false, true, false, false, true, false, false}));

  j["no_rope_layers"] = {1, 0, 1, 1, 1, 1, 1, 0};
  j["use_sliding_window"] = true;
  j["sliding_window"] = 512;
  j["tie_word_embeddings"] = false;
  c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->no_rope, (std::vector<bool>{false, true, false, false, false, false, false, true}));
  EXPECT_EQ(c->layer_windows, (std::vector<int32_t>{0, 512, 0, 0, 0, 0, 0, 512}));
  EXPECT_FALSE(c->tie_word_embeddings);

  j["no_rope_layers"] = {1, 1, 1, 1, 1, 1, 1, 1};
  c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_TRUE(c->no_rope.empty()) << "RoPE on every layer";

  EXPECT_EQ(c->rope_theta, 2e6) << "SmolLM3Config's default";
  EXPECT_EQ(c->max_position_embeddings, 32768);

  for (const json& bad : {json{1, 0}, json{1, 1, 1, 1, 1, 1, 1, 2}, json("1111")}) {
    j["no_rope_layers"] = bad;
    c = parse(j);
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << bad.dump();
    EXPECT_NE(c.status().message().find("no_rope_layers"), std::string::npos)
        << c.status().message();
  }
}

// microsoft/Phi-3-mini-4k-instruct's config, in transformers 4's layout.
const char* kPhi3Mini = R"({
  "architectures": ["Phi3ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
  "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 4096,
  "model_type": "phi3", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 32, "original_max_position_embeddings": 4096, "pad_token_id": 32000,
  "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
  "sliding_window": 2047, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.2", "use_cache": true, "vocab_size": 32064})";

// Phi3: fused projections, its window on every layer; the long-context
// variants' longrope and Phi-4-mini's partial rotation are refused by name.
TEST(ModelConfigTest, ParsesPhi3MiniWithFusedProjections) {
  auto c = parse(doc(kPhi3Mini));
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "Phi3ForCausalLM");
  EXPECT_TRUE(c->fused_projections);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->head_dim, 96);
  EXPECT_EQ(c->layer_windows, std::vector<int32_t>(32, 2047));
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{32000});

  json j = doc(kPhi3Mini);
  j["sliding_window"] = nullptr;
  for (const char* key : {"eos_token_id", "rms_norm_eps", "max_position_embeddings"}) j.erase(key);
  c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_TRUE(c->layer_windows.empty());
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{32000}) << "Phi3Config's default";
  EXPECT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_EQ(c->max_position_embeddings, 4096);

  j = doc(kPhi3Mini);
  j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {1.0}}};
  EXPECT_EQ(parse(j).status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(parse(j).status().message().find("longrope"), std::string::npos);
  j = doc(kPhi3Mini);
  j["partial_rotary_factor"] = 0.75;
  EXPECT_EQ(parse(j).status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(parse(j).status().message().find("partial_rotary_factor"), std::string::npos);
  j.erase("partial_rotary_factor");
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {
      {"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.75}};
  EXPECT_EQ(parse(j).status().code(), StatusCode::kUnimplemented);
  j["rope_parameters"]["partial_rotary_factor"] = 1.0;
  EXPECT_TRUE(parse(j).is_ok()) << parse(j).status().to_string();
}

TEST(ModelConfigTest, ParsesMistralWithoutWindow) {
  auto c = parse(doc(kMistral));
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->architecture, "MistralForCausalLM");
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->vocab_size, 32768);
  EXPECT_EQ(c->max_position_embeddings, 32768);
}

TEST(ModelConfigTest, MistralWindowAtLeastContextIsKept) {
  json j = doc(kMistral);
  j["sliding_window"] = 32768;
  auto c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->window_of(5), 32768) << "kept: engine.max_model_len may go past it";
}

// As transformers 5 forms them: Mistral's window on every layer (4096
// where the key is absent, none where it is null); Qwen2's only with
// use_sliding_window, on layers from max_window_layers or as layer_types
// names them.
TEST(ModelConfigTest, SlidingWindowsPerLayerAsTransformersFormsThem) {
  auto windows = [](json j) {
    auto c = parse(j);
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    std::vector<int32_t> w;
    for (int32_t i = 0; c.is_ok() && i < c->num_layers; ++i) w.push_back(c->window_of(i));
    return w;
  };
  json mistral = doc(kMistral);  // 32 layers
  mistral["sliding_window"] = 4096;
  EXPECT_EQ(windows(mistral), std::vector<int32_t>(32, 4096));
  mistral.erase("sliding_window");
  EXPECT_EQ(windows(mistral), std::vector<int32_t>(32, 4096));
  mistral["sliding_window"] = nullptr;
  EXPECT_EQ(windows(mistral), std::vector<int32_t>(32, 0));

  json qwen = doc(kQwen25);  // 24 layers
  qwen["sliding_window"] = 512;
  EXPECT_EQ(windows(qwen), std::vector<int32_t>(24, 0)) << "use_sliding_window is false";
  qwen["use_sliding_window"] = true;
  qwen["max_window_layers"] = 20;
  std::vector<int32_t> want(24, 0);
  for (int i = 20; i < 24; ++i) want[size_t(i)] = 512;
  EXPECT_EQ(windows(qwen), want);
  qwen["max_window_layers"] = 0;
  EXPECT_EQ(windows(qwen), std::vector<int32_t>(24, 512));
  std::vector<std::string> types(24, "full_attention");
  types[1] = types[5] = "sliding_attention";
  qwen["layer_types"] = types;
  want.assign(24, 0);
  want[1] = want[5] = 512;
  EXPECT_EQ(windows(qwen), want) << "layer_types wins over max_window_layers";

  // Written back (make-model), each reads back the same.
  for (json j : {mistral, qwen}) {
    auto c = parse(j);
    ASSERT_TRUE(c.is_ok());
    auto again = parse(model_config_to_json(*c));
    ASSERT_TRUE(again.is_ok()) << again.status().to_string();
    EXPECT_EQ(again->layer_windows, c->layer_windows);
  }
  mistral["sliding_window"] = 300;
  auto c = parse(mistral);
  ASSERT_TRUE(c.is_ok());
  auto again = parse(model_config_to_json(*c));
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->layer_windows, std::vector<int32_t>(32, 300));
}

TEST(ModelConfigTest, DefaultsFollowTransformers) {
  auto c = parse(doc(kMinimal));
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->rms_norm_eps, 1e-6f);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->torch_dtype, DType::kF32);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);

  json j = doc(kMinimal);
  j["head_dim"] = nullptr;
  j["num_key_value_heads"] = nullptr;
  j["rope_scaling"] = {{"rope_type", "default"}};
  j["dtype"] = "float16";  // newer transformers spell torch_dtype so
  j["bos_token_id"] = nullptr;
  j["eos_token_id"] = nullptr;
  c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->torch_dtype, DType::kF16);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_TRUE(c->eos_token_ids.empty());

  j["head_dim"] = 32;  // explicit head_dim need not be hidden / heads
  j["attention_bias"] = true;
  j["rope_scaling"] = {{"type", "llama3"},
                       {"factor", 2},
                       {"low_freq_factor", 1},
                       {"high_freq_factor", 2},
                       {"original_max_position_embeddings", 1024}};
  c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
}

struct Refusal {
  std::string label;
  const char* base;
  json patch;  // merged into the base document; null values remove keys
  StatusCode code;
  std::string field;
};

TEST(ModelConfigTest, RefusalsNameTheirField) {
  const std::vector<Refusal> cases = {
      {"layers_past_any_model",
       kMinimal,
       {{"num_hidden_layers", 100000000}},
       StatusCode::kInvalidArgument,
       "num_hidden_layers"},
      {"unknown_arch",
       kMinimal,
       {{"architectures", {"GPT2LMHeadModel"}}},
       StatusCode::kUnimplemented,
       "architectures"},
      {"arch_not_list",
       kMinimal,
       {{"architectures", "LlamaForCausalLM"}},
       StatusCode::kInvalidArgument,
       "architectures"},
      {"yarn",
       kMinimal,
       {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}},
       StatusCode::kUnimplemented,
       "rope_scaling.rope_type"},
      {"linear_old_key",
       kMinimal,
       {{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}},
       StatusCode::kUnimplemented,
       "rope_scaling.rope_type"},
      {"dynamic",
       kMinimal,
       {{"rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}}},
       StatusCode::kUnimplemented,
       "rope_scaling.rope_type"},
      {"llama3_missing_factor",
       kMinimal,
       {{"rope_scaling",
         {{"rope_type", "llama3"},
          {"low_freq_factor", 1},
          {"high_freq_factor", 4},
          {"original_max_position_embeddings", 8192}}}},
       StatusCode::kInvalidArgument,
       "rope_scaling.factor"},
      {"mistral_window_zero",
       kMistral,
       {{"sliding_window", 0}},
       StatusCode::kInvalidArgument,
       "sliding_window"},
      {"qwen2_window_text",
       kQwen25,
       {{"use_sliding_window", true}, {"sliding_window", "4096"}},
       StatusCode::kInvalidArgument,
       "sliding_window"},
      {"qwen2_layer_types_short",
       kQwen25,
       {{"use_sliding_window", true}, {"sliding_window", 64}, {"layer_types", {"full_attention"}}},
       StatusCode::kInvalidArgument,
       "layer_types"},
      {"qwen2_layer_type_unknown",
       kQwen25,
       {{"use_sliding_window", true},
        {"sliding_window", 64},
        {"layer_types", std::vector<std::string>(24, "chunked_attention")}},
       StatusCode::kUnimplemented,
       "layer_types"},
      {"mlp_bias", kMinimal, {{"mlp_bias", true}}, StatusCode::kUnimplemented, "mlp_bias"},
      {"gelu", kMinimal, {{"hidden_act", "gelu"}}, StatusCode::kUnimplemented, "hidden_act"},
      {"heads_not_divisible",
       kMinimal,
       {{"num_attention_heads", 6}, {"num_key_value_heads", 4}, {"head_dim", 16}},
       StatusCode::kInvalidArgument,
       "num_key_value_heads"},
      {"more_kv_than_heads",
       kMinimal,
       {{"num_key_value_heads", 8}},
       StatusCode::kInvalidArgument,
       "num_key_value_heads"},
      {"missing_hidden",
       kMinimal,
       {{"hidden_size", nullptr}},
       StatusCode::kInvalidArgument,
       "hidden_size"},
      {"missing_layers",
       kMinimal,
       {{"num_hidden_layers", nullptr}},
       StatusCode::kInvalidArgument,
       "num_hidden_layers"},
      {"missing_heads",
       kMinimal,
       {{"num_attention_heads", nullptr}},
       StatusCode::kInvalidArgument,
       "num_attention_heads"},
      {"missing_ffn",
       kMinimal,
       {{"intermediate_size", nullptr}},
       StatusCode::kInvalidArgument,
       "intermediate_size"},
      {"missing_vocab",
       kMinimal,
       {{"vocab_size", nullptr}},
       StatusCode::kInvalidArgument,
       "vocab_size"},
      {"hidden_string",
       kMinimal,
       {{"hidden_size", "64"}},
       StatusCode::kInvalidArgument,
       "hidden_size"},
      {"hidden_float",
       kMinimal,
       {{"hidden_size", 64.5}},
       StatusCode::kInvalidArgument,
       "hidden_size"},
      {"hidden_zero", kMinimal, {{"hidden_size", 0}}, StatusCode::kInvalidArgument, "hidden_size"},
      {"vocab_negative",
       kMinimal,
       {{"vocab_size", -5}},
       StatusCode::kInvalidArgument,
       "vocab_size"},
      {"vocab_huge",
       kMinimal,
       {{"vocab_size", 1ll << 40}},
       StatusCode::kInvalidArgument,
       "vocab_size"},
      {"head_dim_odd", kMinimal, {{"head_dim", 15}}, StatusCode::kInvalidArgument, "head_dim"},
      {"head_dim_indivisible",
       kMinimal,
       {{"hidden_size", 66}},
       StatusCode::kInvalidArgument,
       "head_dim"},
      {"eps_zero", kMinimal, {{"rms_norm_eps", 0.0}}, StatusCode::kInvalidArgument, "rms_norm_eps"},
      {"eps_past_float",
       kMinimal,
       {{"rms_norm_eps", 1e205}},
       StatusCode::kInvalidArgument,
       "rms_norm_eps"},
      {"eps_below_float",
       kMinimal,
       {{"rms_norm_eps", 1e-60}},
       StatusCode::kInvalidArgument,
       "rms_norm_eps"},
      {"eps_negative",
       kMinimal,
       {{"rms_norm_eps", -1e-5}},
       StatusCode::kInvalidArgument,
       "rms_norm_eps"},
      {"theta_string",
       kMinimal,
       {{"rope_theta", "1e4"}},
       StatusCode::kInvalidArgument,
       "rope_theta"},
      {"tie_int",
       kMinimal,
       {{"tie_word_embeddings", 1}},
       StatusCode::kInvalidArgument,
       "tie_word_embeddings"},
      {"bos_string",
       kMinimal,
       {{"bos_token_id", "1"}},
       StatusCode::kInvalidArgument,
       "bos_token_id"},
      {"eos_bad_list",
       kMinimal,
       {{"eos_token_id", {1, "2"}}},
       StatusCode::kInvalidArgument,
       "eos_token_id"},
      {"dtype_int8",
       kMinimal,
       {{"torch_dtype", "int8"}},
       StatusCode::kUnimplemented,
       "torch_dtype"},
      {"dtype_number",
       kMinimal,
       {{"torch_dtype", 16}},
       StatusCode::kInvalidArgument,
       "torch_dtype"},
  };
  for (const Refusal& r : cases) {
    SCOPED_TRACE(r.label);
    json j = doc(r.base);
    j.merge_patch(r.patch);
    auto c = parse(j);
    expect_error(c.status(), r.code, {"'" + r.field + "'", "test/config.json"});
  }
  expect_error(parse(json::array()).status(), StatusCode::kInvalidArgument, {"test/config.json"});
}

TEST(ModelConfigTest, LoadFromFile) {
  ScratchDir dir;
  write_file(dir / "config.json", kQwen25);
  auto c = load_model_config(dir / "config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->vocab_size, 151936);

  write_file(dir / "bad.json", "{\"hidden_size\": ");
  expect_error(load_model_config(dir / "bad.json").status(), StatusCode::kDataLoss, {"bad.json"});
  expect_error(load_model_config(dir / "none.json").status(), StatusCode::kNotFound, {"none.json"});
  write_file(dir / "gelu.json", json(doc(kMinimal)).dump());
  json g = doc(kMinimal);
  g["hidden_act"] = "gelu_pytorch_tanh";
  write_file(dir / "gelu.json", g.dump());
  expect_error(load_model_config(dir / "gelu.json").status(), StatusCode::kUnimplemented,
               {"gelu.json", "'hidden_act'"});
}

TEST(ModelConfigTest, JsonRoundTripForEveryPreset) {
  for (const std::string& name : model_preset_names()) {
    SCOPED_TRACE(name);
    auto preset = model_preset(name);
    ASSERT_TRUE(preset.is_ok());
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      ModelConfig a = *preset;
      a.torch_dtype = dt;
      json j = model_config_to_json(a);
      // Fields transformers needs to pick the model class and dtype.
      ASSERT_TRUE(j["architectures"].is_array());
      EXPECT_EQ(j["architectures"][0], a.architecture);
      EXPECT_TRUE(j["model_type"].is_string());
      // Not a config class's default pad id, which may lie past a tiny
      // vocabulary (Phi3's 32000): transformers would refuse the model.
      ASSERT_TRUE(j.contains("pad_token_id"));
      EXPECT_TRUE(j["pad_token_id"].is_null());
      EXPECT_EQ(j["torch_dtype"], dt == DType::kF32   ? "float32"
                                  : dt == DType::kF16 ? "float16"
                                                      : "bfloat16");
      auto b = parse_model_config(j, name);
      ASSERT_TRUE(b.is_ok()) << b.status().to_string();
      EXPECT_EQ(b->architecture, a.architecture);
      EXPECT_EQ(b->hidden_size, a.hidden_size);
      EXPECT_EQ(b->num_layers, a.num_layers);
      EXPECT_EQ(b->num_heads, a.num_heads);
      EXPECT_EQ(b->num_kv_heads, a.num_kv_heads);
      EXPECT_EQ(b->head_dim, a.head_dim);
      EXPECT_EQ(b->intermediate_size, a.intermediate_size);
      EXPECT_EQ(b->vocab_size, a.vocab_size);
      EXPECT_EQ(b->max_position_embeddings, a.max_position_embeddings);
      EXPECT_EQ(b->rms_norm_eps, a.rms_norm_eps);
      EXPECT_EQ(b->rope_theta, a.rope_theta);
      EXPECT_EQ(b->rope_scaling.type, a.rope_scaling.type);
      EXPECT_EQ(b->rope_scaling.factor, a.rope_scaling.factor);
      EXPECT_EQ(b->rope_scaling.original_max_position_embeddings,
                a.rope_scaling.original_max_position_embeddings);
      EXPECT_EQ(b->tie_word_embeddings, a.tie_word_embeddings);
      EXPECT_EQ(b->attention_bias, a.attention_bias);
      EXPECT_EQ(b->output_bias, a.output_bias);
      EXPECT_EQ(b->qk_norm, a.qk_norm);
      EXPECT_EQ(b->no_rope, a.no_rope);
      EXPECT_EQ(b->fused_projections, a.fused_projections);
      EXPECT_EQ(b->embedding_multiplier, a.embedding_multiplier);
      EXPECT_EQ(b->residual_multiplier, a.residual_multiplier);
      EXPECT_EQ(b->logits_scaling, a.logits_scaling);
      EXPECT_EQ(b->attention_scale(), a.attention_scale());
      EXPECT_EQ(b->layer_windows, a.layer_windows);
      EXPECT_EQ(b->bos_token_id, a.bos_token_id);
      EXPECT_EQ(b->eos_token_ids, a.eos_token_ids);
      EXPECT_EQ(b->torch_dtype, dt);
    }
  }
  // 1e-5f is written as the decimal people write, not its binary expansion.
  auto tiny = model_preset("tiny");
  ASSERT_TRUE(tiny.is_ok());
  EXPECT_NE(model_config_to_json(*tiny).dump().find("\"rms_norm_eps\":1e-05"), std::string::npos);
}

// transformers' _compute_default_rope_parameters and _compute_llama3_parameters,
// transcribed array-at-a-time in long double.
std::vector<long double> reference_inv_freq(double base, int dim, bool llama3, double factor,
                                            double low, double high, double old_ctx) {
  std::vector<long double> inv_freq;
  for (int k = 0; k < dim; k += 2)
    inv_freq.push_back(1.0L / std::pow((long double)base, (long double)k / dim));
  if (!llama3) return inv_freq;
  const long double pi = 3.141592653589793238462643383279502884L;
  const long double low_freq_wavelen = old_ctx / low;
  const long double high_freq_wavelen = old_ctx / high;
  std::vector<long double> wavelen, llama, smooth, smoothed;
  for (long double f : inv_freq) wavelen.push_back(2 * pi / f);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    llama.push_back(wavelen[i] > low_freq_wavelen ? inv_freq[i] / factor : inv_freq[i]);
  }
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    smooth.push_back((old_ctx / wavelen[i] - low) / (high - low));
    smoothed.push_back((1 - smooth[i]) * llama[i] / factor + smooth[i] * llama[i]);
  }
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const bool is_medium = !(wavelen[i] < high_freq_wavelen) && !(wavelen[i] > low_freq_wavelen);
    if (is_medium) llama[i] = smoothed[i];
  }
  return llama;
}

void expect_close(const std::vector<float>& got, const std::vector<long double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(double(got[i]), double(want[i]), double(want[i]) * 1e-6) << "i=" << i;
  }
}

TEST(ModelConfigTest, RopeInvFreqDefault) {
  auto c = parse(doc(kSmolLM2));
  ASSERT_TRUE(c.is_ok());
  expect_close(rope_inv_freq(*c), reference_inv_freq(100000, 64, false, 0, 0, 0, 0));
  EXPECT_EQ(rope_inv_freq(*c)[0], 1.0f);
}

TEST(ModelConfigTest, RopeInvFreqLlama3MatchesTransformersFormula) {
  auto c = parse(doc(kLlama31));
  ASSERT_TRUE(c.is_ok());
  const auto got = rope_inv_freq(*c);
  const auto want = reference_inv_freq(500000, 128, true, 8, 1, 4, 8192);
  expect_close(got, want);
  // All three regimes occur: unchanged, divided by the factor, interpolated.
  const auto plain = reference_inv_freq(500000, 128, false, 0, 0, 0, 0);
  int unchanged = 0, divided = 0, between = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double ratio = double(plain[i] / want[i]);
    if (std::abs(ratio - 1) < 1e-12)
      ++unchanged;
    else if (std::abs(ratio - 8) < 1e-9)
      ++divided;
    else
      ++between;
  }
  EXPECT_GT(unchanged, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(between, 0);

  // Other parameters (factor 4, low 2, high 8, context 2048, head_dim 64).
  json j = doc(kMinimal);
  j["hidden_size"] = 256;
  j["rope_theta"] = 10000;
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 4.0},
                       {"low_freq_factor", 2.0},
                       {"high_freq_factor", 8.0},
                       {"original_max_position_embeddings", 2048}};
  auto c2 = parse(j);
  ASSERT_TRUE(c2.is_ok()) << c2.status().to_string();
  expect_close(rope_inv_freq(*c2), reference_inv_freq(10000, 64, true, 4, 2, 8, 2048));
}

}  // namespace
}  // namespace baton::engine
