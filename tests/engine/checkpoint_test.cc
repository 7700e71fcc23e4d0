#include "engine/checkpoint.h"

#include <gtest/gtest.h>

#include <fstream>

#include <cstring>
#include <functional>

#include <nlohmann/json.hpp>

#include "engine/make_model.h"
#include "engine/safetensors.h"
#include "engine/safetensors_writer.h"
#include "tests/engine/loader_test_util.h"

namespace baton::engine {
namespace {

using loader_testing::expect_error;
using loader_testing::read_file;
using loader_testing::ScratchDir;
using loader_testing::write_file;
using nlohmann::json;

// A small Llama: 2 layers, hidden 32, 4 heads of 8, 2 KV heads, FFN 48, vocab 300.
json small_config(bool tied, bool bias_qwen2) {
  json j = {{"architectures", {bias_qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
            {"hidden_size", 32},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"intermediate_size", 48},
            {"vocab_size", 300},
            {"tie_word_embeddings", tied}};
  return j;
}

// The weights such a config needs, spelled out here (not taken from the loader).
std::vector<TensorSpec> expected_tensors(bool tied, bool bias, DType dt) {
  std::vector<TensorSpec> t = {{"model.embed_tokens.weight", dt, {300, 32}},
                               {"model.norm.weight", dt, {32}}};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back({p + "self_attn.q_proj.weight", dt, {32, 32}});
    t.push_back({p + "self_attn.k_proj.weight", dt, {16, 32}});
    t.push_back({p + "self_attn.v_proj.weight", dt, {16, 32}});
    t.push_back({p + "self_attn.o_proj.weight", dt, {32, 32}});
    if (bias) {
      t.push_back({p + "self_attn.q_proj.bias", dt, {32}});
      t.push_back({p + "self_attn.k_proj.bias", dt, {16}});
      t.push_back({p + "self_attn.v_proj.bias", dt, {16}});
    }
    t.push_back({p + "mlp.gate_proj.weight", dt, {48, 32}});
    t.push_back({p + "mlp.up_proj.weight", dt, {48, 32}});
    t.push_back({p + "mlp.down_proj.weight", dt, {32, 48}});
    t.push_back({p + "input_layernorm.weight", dt, {32}});
    t.push_back({p + "post_attention_layernorm.weight", dt, {32}});
  }
  if (!tied) t.push_back({"lm_head.weight", dt, {300, 32}});
  return t;
}

// Element i of every tensor is value_of(i): small multiples of 1/64, exact in every dtype.
float value_of(size_t i) { return float(int(i % 97) - 48) / 64.0f; }

void write_tensors(const std::filesystem::path& path, const std::vector<TensorSpec>& specs) {
  auto w = SafetensorsWriter::create(path, specs);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  for (const TensorSpec& s : specs) {
    const size_t n = s.nbytes() / dtype_size(s.dtype);
    std::vector<unsigned char> buf(s.nbytes());
    for (size_t i = 0; i < n; ++i) store_from_float(buf.data(), s.dtype, i, value_of(i));
    ASSERT_TRUE((*w)->write(buf.data(), buf.size()).is_ok());
  }
  ASSERT_TRUE((*w)->finish().is_ok());
}

void write_checkpoint(const std::filesystem::path& dir, const json& config,
                      const std::vector<TensorSpec>& specs) {
  std::filesystem::create_directories(dir);
  write_file(dir / "config.json", config.dump());
  write_tensors(dir / "model.safetensors", specs);
}

std::vector<TensorSpec> without(std::vector<TensorSpec> specs, const std::string& name) {
  std::erase_if(specs, [&](const TensorSpec& s) { return s.name == name; });
  return specs;
}

TEST(CheckpointTest, OpensMadeTinyModel) {
  ScratchDir dir;
  auto tiny = model_preset("tiny");
  ASSERT_TRUE(tiny.is_ok());
  ASSERT_TRUE(make_random_checkpoint(*tiny, dir / "tiny", {.seed = 3}).is_ok());
  auto ck = Checkpoint::open(dir / "tiny");
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  const ModelConfig& c = (*ck)->config();
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_kv_heads, 1);
  const ModelWeights& w = (*ck)->weights();
  EXPECT_EQ(w.embed_tokens.rows, 512);
  EXPECT_EQ(w.embed_tokens.cols, 64);
  EXPECT_EQ(w.lm_head.rows, 512);
  EXPECT_NE(w.lm_head.data, w.embed_tokens.data);  // untied
  ASSERT_EQ(w.layers.size(), 2u);
  for (const LayerWeights& l : w.layers) {
    EXPECT_EQ(l.q_proj.rows, 64);
    EXPECT_EQ(l.k_proj.rows, 16);  // 1 KV head x 16
    EXPECT_EQ(l.v_proj.rows, 16);
    EXPECT_EQ(l.o_proj.cols, 64);
    EXPECT_EQ(l.gate_proj.rows, 128);
    EXPECT_EQ(l.down_proj.rows, 64);
    EXPECT_EQ(l.down_proj.cols, 128);
    EXPECT_TRUE(l.q_bias.empty());
    EXPECT_EQ(l.input_norm.size(), 64u);
    EXPECT_EQ(l.post_attention_norm.size(), 64u);
  }
  EXPECT_EQ(w.final_norm.size(), 64u);
  // embed + lm_head + 2 x (q, k, v, o, gate, up, down, two norms) + final norm, in F32.
  const uint64_t per_layer = 64 * 64 + 16 * 64 + 16 * 64 + 64 * 64 + 3 * 128 * 64 + 2 * 64;
  EXPECT_EQ((*ck)->weight_bytes(), 4 * (2 * 512 * 64 + 2 * per_layer + 64));
}

// generation_config.json's eos ids end generation too (Llama 3 instruct's
// <|eot_id|> is listed only there); a bad one is an error naming the file.
TEST(CheckpointTest, GenerationConfigAddsItsEosIds) {
  ScratchDir dir;
  auto tiny = model_preset("tiny");
  ASSERT_TRUE(tiny.is_ok());
  ASSERT_TRUE(make_random_checkpoint(*tiny, dir / "tiny", {.seed = 3}).is_ok());
  const auto before = (*Checkpoint::open(dir / "tiny"))->config().eos_token_ids;
  ASSERT_EQ(before, std::vector<int32_t>{2});
  std::ofstream(dir / "tiny" / "generation_config.json") << R"({"eos_token_id": [2, 300, 7]})";
  auto ck = Checkpoint::open(dir / "tiny");
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  EXPECT_EQ((*ck)->config().eos_token_ids, (std::vector<int32_t>{2, 300, 7}));
  std::ofstream(dir / "tiny" / "generation_config.json") << R"({"eos_token_id": 9})";
  EXPECT_EQ((*Checkpoint::open(dir / "tiny"))->config().eos_token_ids,
            (std::vector<int32_t>{2, 9}));
  for (const char* bad : {R"({"eos_token_id": 512})", R"({"eos_token_id": "x"})",
                          R"({"eos_token_id": [1, -1]})", "[1]", "{"}) {
    std::ofstream(dir / "tiny" / "generation_config.json") << bad;
    auto broken = Checkpoint::open(dir / "tiny");
    ASSERT_FALSE(broken.is_ok()) << bad;
    EXPECT_NE(broken.status().message().find("generation_config.json"), std::string::npos)
        << broken.status().message();
  }
}

TEST(CheckpointTest, GenerationDefaultsAreReadWhereSet) {
  ScratchDir dir;
  std::filesystem::create_directories(dir / "m");
  const auto file = dir / "m" / "generation_config.json";
  auto none = load_generation_defaults(file);  // no file: nothing set
  ASSERT_TRUE(none.is_ok());
  EXPECT_FALSE(none->temperature || none->top_p || none->top_k);
  std::ofstream(file) << R"({"temperature": 0.6, "top_p": 0.9, "do_sample": true})";
  auto some = load_generation_defaults(file);
  ASSERT_TRUE(some.is_ok()) << some.status().to_string();
  EXPECT_FLOAT_EQ(*some->temperature, 0.6f);
  EXPECT_FLOAT_EQ(*some->top_p, 0.9f);
  EXPECT_FALSE(some->top_k);
  for (const char* bad : {R"({"temperature": -1})", R"({"top_p": 0})", R"({"top_k": "x"})", "["}) {
    std::ofstream(file) << bad;
    auto r = load_generation_defaults(file);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_NE(r.status().message().find("generation_config.json"), std::string::npos);
  }
}

TEST(CheckpointTest, TiedAndUntiedWithPerTensorDtypes) {
  ScratchDir dir;
  for (bool tied : {false, true}) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE(std::string(tied ? "tied" : "untied") + (bias ? " bias" : ""));
      auto specs = expected_tensors(tied, bias, DType::kF32);
      // Cycle dtypes so neighbouring weights differ.
      const DType cycle[] = {DType::kBF16, DType::kF16, DType::kF32};
      for (size_t i = 0; i < specs.size(); ++i) specs[i].dtype = cycle[i % 3];
      const auto path = dir / (std::string(tied ? "tied" : "untied") + (bias ? "-bias" : ""));
      write_checkpoint(path, small_config(tied, bias), specs);
      auto ck = Checkpoint::open(path);
      ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
      const ModelWeights& w = (*ck)->weights();
      auto dtype_of = [&](const std::string& name) {
        for (const auto& s : specs)
          if (s.name == name) return s.dtype;
        ADD_FAILURE() << name;
        return DType::kF32;
      };
      EXPECT_EQ(w.embed_tokens.dtype, dtype_of("model.embed_tokens.weight"));
      EXPECT_EQ(w.layers[1].k_proj.dtype, dtype_of("model.layers.1.self_attn.k_proj.weight"));
      EXPECT_EQ(w.layers[0].down_proj.dtype, dtype_of("model.layers.0.mlp.down_proj.weight"));
      if (tied) {
        EXPECT_EQ(w.lm_head.data, w.embed_tokens.data);
        EXPECT_EQ(w.lm_head.dtype, w.embed_tokens.dtype);
      } else {
        EXPECT_NE(w.lm_head.data, w.embed_tokens.data);
        EXPECT_EQ(w.lm_head.dtype, dtype_of("lm_head.weight"));
      }
      // Norms and biases come out as F32 with the stored values.
      for (size_t i = 0; i < 32; ++i) {
        EXPECT_EQ(w.final_norm[i], value_of(i));
        EXPECT_EQ(w.layers[1].post_attention_norm[i], value_of(i));
      }
      if (bias) {
        ASSERT_EQ(w.layers[0].q_bias.size(), 32u);
        ASSERT_EQ(w.layers[0].k_bias.size(), 16u);
        ASSERT_EQ(w.layers[0].v_bias.size(), 16u);
        EXPECT_EQ(w.layers[0].k_bias[5], value_of(5));
      } else {
        EXPECT_TRUE(w.layers[0].q_bias.empty());
      }
      // Matrix views point at the stored bytes.
      EXPECT_EQ(load_as_float(w.layers[0].up_proj.data, w.layers[0].up_proj.dtype, 100),
                value_of(100));
      // weight_bytes: matrices in their dtype, lm_head once when tied, 1-D weights as F32.
      uint64_t expect_bytes = 0;
      for (const auto& s : specs) {
        expect_bytes += s.shape.size() == 1 ? uint64_t(s.shape[0]) * 4 : s.nbytes();
      }
      EXPECT_EQ((*ck)->weight_bytes(), expect_bytes);
    }
  }
}

TEST(CheckpointTest, TiedCheckpointMayStillStoreLmHead) {
  ScratchDir dir;
  auto specs = expected_tensors(true, false, DType::kF32);
  specs.push_back({"lm_head.weight", DType::kF32, {300, 32}});
  specs.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", DType::kF32, {4}});
  specs.push_back({"model.layers.1.self_attn.rotary_emb.cos_cached", DType::kF32, {2, 8}});
  specs.push_back({"model.layers.1.self_attn.rotary_emb.sin_cached", DType::kF32, {2, 8}});
  write_checkpoint(dir / "m", small_config(true, false), specs);
  auto ck = Checkpoint::open(dir / "m");
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  EXPECT_EQ((*ck)->weights().lm_head.data, (*ck)->weights().embed_tokens.data);
}

// A weight the config gives no use to would be dropped from the forward
// pass silently: a Llama without attention_bias holding o_proj biases, a
// Llama holding Qwen3's q/k norms. Refused, naming the weight.
TEST(CheckpointTest, WeightsTheConfigDoesNotUseAreRefused) {
  ScratchDir dir;
  for (const TensorSpec& extra :
       {TensorSpec{"model.layers.1.self_attn.o_proj.bias", DType::kF32, {32}},
        TensorSpec{"model.layers.0.self_attn.q_norm.weight", DType::kF32, {8}},
        TensorSpec{"model.layers.0.mlp.gate_proj.bias", DType::kF32, {48}}}) {
    SCOPED_TRACE(extra.name);
    const auto path = dir / ("extra-" + extra.name);
    auto specs = expected_tensors(false, false, DType::kF32);
    specs.push_back(extra);
    write_checkpoint(path, small_config(false, false), specs);
    expect_error(Checkpoint::open(path).status(), StatusCode::kUnimplemented,
                 {extra.name, path.string(), "LlamaForCausalLM"});
  }
  // Many are named up to four, then counted.
  auto specs = expected_tensors(false, false, DType::kF32);
  for (int i = 0; i < 6; ++i)
    specs.push_back({"extra." + std::to_string(i) + ".weight", DType::kF32, {4}});
  write_checkpoint(dir / "many", small_config(false, false), specs);
  expect_error(Checkpoint::open(dir / "many").status(), StatusCode::kUnimplemented,
               {"extra.0.weight", "extra.3.weight", "and 2 more"});
}

// attention_bias on a Llama (and Qwen3) covers o_proj too, as in
// transformers; its q/k/v and o biases are all required.
TEST(CheckpointTest, LlamaAttentionBiasIncludesOProj) {
  ScratchDir dir;
  json config = small_config(false, false);
  config["attention_bias"] = true;
  auto specs = expected_tensors(false, true, DType::kF32);
  write_checkpoint(dir / "no-o-bias", config, specs);
  expect_error(Checkpoint::open(dir / "no-o-bias").status(), StatusCode::kNotFound,
               {"model.layers.0.self_attn.o_proj.bias"});
  for (int i = 0; i < 2; ++i)
    specs.push_back(
        {"model.layers." + std::to_string(i) + ".self_attn.o_proj.bias", DType::kF32, {32}});
  write_checkpoint(dir / "m", config, specs);
  auto ck = Checkpoint::open(dir / "m");
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  const std::vector<float>& o_bias = (*ck)->weights().layers[1].o_bias;
  ASSERT_EQ(o_bias.size(), 32u);
  for (size_t i = 0; i < o_bias.size(); ++i) EXPECT_EQ(o_bias[i], value_of(i));
}

TEST(CheckpointTest, MissingWeightIsNotFound) {
  ScratchDir dir;
  for (const std::string& name :
       {std::string("model.layers.1.mlp.up_proj.weight"), std::string("lm_head.weight"),
        std::string("model.norm.weight"), std::string("model.embed_tokens.weight"),
        std::string("model.layers.0.self_attn.k_proj.bias")}) {
    SCOPED_TRACE(name);
    const auto path = dir / ("missing-" + name);
    write_checkpoint(path, small_config(false, true),
                     without(expected_tensors(false, true, DType::kF32), name));
    expect_error(Checkpoint::open(path).status(), StatusCode::kNotFound, {name, path.string()});
  }
}

TEST(CheckpointTest, WrongShapeNamesExpectedAndActual) {
  ScratchDir dir;
  auto specs = expected_tensors(false, false, DType::kF16);
  for (auto& s : specs) {
    if (s.name == "model.layers.1.self_attn.k_proj.weight") s.shape = {32, 32};
  }
  write_checkpoint(dir / "m", small_config(false, false), specs);
  expect_error(Checkpoint::open(dir / "m").status(), StatusCode::kInvalidArgument,
               {"model.layers.1.self_attn.k_proj.weight", "[16, 32]", "[32, 32]"});

  specs = expected_tensors(false, false, DType::kF32);
  for (auto& s : specs) {
    if (s.name == "model.norm.weight") s.shape = {1, 32};
  }
  write_checkpoint(dir / "m2", small_config(false, false), specs);
  expect_error(Checkpoint::open(dir / "m2").status(), StatusCode::kInvalidArgument,
               {"model.norm.weight", "[32]", "[1, 32]"});
}

// Rewrites the dtype of `tensor` in a safetensors header in place (same length).
void patch_dtype(const std::filesystem::path& file, const std::string& tensor,
                 const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  std::string bytes = read_file(file);
  size_t at = bytes.find("\"" + tensor + "\"");
  ASSERT_NE(at, std::string::npos);
  size_t dt = bytes.find("\"dtype\":\"" + from + "\"", at);
  ASSERT_NE(dt, std::string::npos);
  bytes.replace(dt + 9, from.size(), to);
  write_file(file, bytes);
}

TEST(CheckpointTest, WrongDtypeField) {
  ScratchDir dir;
  auto specs = expected_tensors(false, false, DType::kF32);
  write_checkpoint(dir / "f64", small_config(false, false), specs);
  patch_dtype(dir / "f64" / "model.safetensors", "model.layers.0.mlp.gate_proj.weight", "F32",
              "F64");
  expect_error(Checkpoint::open(dir / "f64").status(), StatusCode::kUnimplemented,
               {"model.layers.0.mlp.gate_proj.weight", "F64", "model.safetensors"});

  // F16 claimed for F32 bytes: the byte count no longer matches the shape.
  write_checkpoint(dir / "f16", small_config(false, false), specs);
  patch_dtype(dir / "f16" / "model.safetensors", "model.norm.weight", "F32", "F16");
  expect_error(Checkpoint::open(dir / "f16").status(), StatusCode::kDataLoss,
               {"model.norm.weight", "model.safetensors"});
}

// Splits expected tensors into two shard files plus an index; `edit` may change both.
void write_sharded(const std::filesystem::path& dir, std::vector<TensorSpec> specs,
                   const std::function<void(json& index)>& edit) {
  std::filesystem::create_directories(dir);
  write_file(dir / "config.json", small_config(false, false).dump());
  const size_t half = specs.size() / 2;
  std::vector<TensorSpec> a(specs.begin(), specs.begin() + long(half));
  std::vector<TensorSpec> b(specs.begin() + long(half), specs.end());
  write_tensors(dir / "model-00001-of-00002.safetensors", a);
  write_tensors(dir / "model-00002-of-00002.safetensors", b);
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  for (const auto& s : a) index["weight_map"][s.name] = "model-00001-of-00002.safetensors";
  for (const auto& s : b) index["weight_map"][s.name] = "model-00002-of-00002.safetensors";
  edit(index);
  write_file(dir / "model.safetensors.index.json", index.dump(2));
}

TEST(CheckpointTest, ShardedIndex) {
  ScratchDir dir;
  const auto specs = expected_tensors(false, false, DType::kBF16);
  write_sharded(dir / "ok", specs, [](json&) {});
  auto ck = Checkpoint::open(dir / "ok");
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  EXPECT_EQ((*ck)->files().size(), 2u);
  EXPECT_EQ(load_as_float((*ck)->weights().lm_head.data, DType::kBF16, 7), value_of(7));

  write_sharded(dir / "missing_file", specs, [](json& index) {
    index["weight_map"]["model.norm.weight"] = "model-00003-of-00002.safetensors";
  });
  expect_error(Checkpoint::open(dir / "missing_file").status(), StatusCode::kNotFound,
               {"model-00003-of-00002.safetensors", "model.safetensors.index.json"});

  write_sharded(dir / "wrong_file", specs, [&](json& index) {
    // Point a tensor at the shard that does not hold it.
    const std::string name = specs.front().name;
    index["weight_map"][name] = "model-00002-of-00002.safetensors";
  });
  expect_error(Checkpoint::open(dir / "wrong_file").status(), StatusCode::kDataLoss,
               {specs.front().name, "model-00002-of-00002.safetensors"});

  write_sharded(dir / "dropped", specs, [](json& index) {
    index["weight_map"].erase("model.layers.0.mlp.up_proj.weight");
  });
  expect_error(Checkpoint::open(dir / "dropped").status(), StatusCode::kNotFound,
               {"model.layers.0.mlp.up_proj.weight"});

  write_sharded(dir / "escape", specs, [](json& index) {
    index["weight_map"]["model.norm.weight"] = "../model-00001-of-00002.safetensors";
  });
  expect_error(Checkpoint::open(dir / "escape").status(), StatusCode::kDataLoss,
               {"model.norm.weight"});

  write_sharded(dir / "no_map", specs, [](json& index) { index.erase("weight_map"); });
  expect_error(Checkpoint::open(dir / "no_map").status(), StatusCode::kDataLoss, {"weight_map"});

  write_sharded(dir / "bad_json", specs, [](json&) {});
  write_file(dir / "bad_json" / "model.safetensors.index.json", "{\"weight_map\": {");
  expect_error(Checkpoint::open(dir / "bad_json").status(), StatusCode::kDataLoss,
               {"model.safetensors.index.json"});
}

TEST(CheckpointTest, DirectoryProblems) {
  ScratchDir dir;
  expect_error(Checkpoint::open(dir / "absent").status(), StatusCode::kNotFound, {"absent"});
  std::filesystem::create_directories(dir / "no_config");
  expect_error(Checkpoint::open(dir / "no_config").status(), StatusCode::kNotFound,
               {"config.json"});
  std::filesystem::create_directories(dir / "no_weights");
  write_file(dir / "no_weights" / "config.json", small_config(false, false).dump());
  expect_error(Checkpoint::open(dir / "no_weights").status(), StatusCode::kNotFound,
               {"model.safetensors"});
  std::filesystem::create_directories(dir / "bad_config");
  write_file(dir / "bad_config" / "config.json", R"({"architectures": ["BertModel"]})");
  expect_error(Checkpoint::open(dir / "bad_config").status(), StatusCode::kUnimplemented,
               {"architectures", "config.json"});
  std::filesystem::create_directories(dir / "truncated");
  write_file(dir / "truncated" / "config.json", small_config(false, false).dump());
  write_file(dir / "truncated" / "model.safetensors", std::string("\x10\0\0", 3));
  expect_error(Checkpoint::open(dir / "truncated").status(), StatusCode::kDataLoss,
               {"model.safetensors"});
}

}  // namespace
}  // namespace baton::engine
