#include "engine/make_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/checkpoint.h"
#include "engine/hf_tokenizer.h"
#include "engine/safetensors.h"
#include "engine/tokenizer.h"
#include "engine/tokenizer_steps.h"
#include "tests/engine/loader_test_util.h"

namespace baton::engine {
namespace {

namespace fs = std::filesystem;
using loader_testing::expect_error;
using loader_testing::read_file;
using loader_testing::ScratchDir;
using loader_testing::write_file;

std::map<std::string, std::string> dir_contents(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    out[e.path().filename().string()] = read_file(e.path());
  return out;
}

ModelConfig preset(const std::string& name) {
  auto c = model_preset(name);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return *c;
}

TEST(MakeModelTest, PresetsHaveTheDocumentedShapes) {
  const auto names = model_preset_names();
  for (const char* n : {"tiny", "tiny-qwen2", "smollm2-135m", "qwen2.5-0.5b", "llama3-8b"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  }
  for (const auto& n : names) {
    ModelConfig c = preset(n);
    EXPECT_EQ(c.bos_token_id, 1) << n;
    EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{2}) << n;
    EXPECT_GE(c.vocab_size, 259) << n;
  }
  ModelConfig t = preset("tiny");
  EXPECT_EQ(t.architecture, "LlamaForCausalLM");
  EXPECT_EQ(t.hidden_size, 64);
  EXPECT_EQ(t.num_layers, 2);
  EXPECT_EQ(t.num_heads, 4);
  EXPECT_EQ(t.num_kv_heads, 1);
  EXPECT_EQ(t.head_dim, 16);
  EXPECT_EQ(t.intermediate_size, 128);
  EXPECT_EQ(t.vocab_size, 512);
  EXPECT_FALSE(t.tie_word_embeddings);
  EXPECT_EQ(t.rms_norm_eps, 1e-5f);
  ModelConfig q = preset("tiny-qwen2");
  EXPECT_EQ(q.architecture, "Qwen2ForCausalLM");
  EXPECT_TRUE(q.tie_word_embeddings);
  EXPECT_TRUE(q.attention_bias);
  EXPECT_EQ(q.num_kv_heads, 2);
  ModelConfig l = preset("llama3-8b");
  EXPECT_EQ(l.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(l.rope_scaling.factor, 8.0);
  EXPECT_EQ(l.rope_theta, 500000.0);
  EXPECT_EQ(l.max_position_embeddings, 131072);

  expect_error(model_preset("gpt5").status(), StatusCode::kNotFound, {"gpt5", "tiny", "llama3-8b"});
}

uint64_t param_count(const ModelConfig& c) {
  uint64_t n = 0;
  for (const TensorSpec& t : random_checkpoint_tensors(c, DType::kBF16)) n += t.nbytes() / 2;
  return n;
}

TEST(MakeModelTest, RealPresetsHaveTheRealParameterCounts) {
  // Published parameter counts of the models these presets imitate.
  EXPECT_EQ(param_count(preset("smollm2-135m")), 134515008u);
  EXPECT_EQ(param_count(preset("qwen2.5-0.5b")), 494032768u);
  EXPECT_EQ(param_count(preset("qwen3-0.6b")), 596049920u);
  EXPECT_EQ(param_count(preset("phi3-mini")), 3821079552u);
  EXPECT_EQ(param_count(preset("llama3-8b")), 8030261248u);
}

TEST(MakeModelTest, SameSeedSameBytesOtherSeedOtherWeights) {
  ScratchDir dir;
  const ModelConfig c = preset("tiny");
  ASSERT_TRUE(make_random_checkpoint(c, dir / "a", {.seed = 42}).is_ok());
  ASSERT_TRUE(make_random_checkpoint(c, dir / "b", {.seed = 42}).is_ok());
  ASSERT_TRUE(make_random_checkpoint(c, dir / "c", {.seed = 43}).is_ok());
  const auto a = dir_contents(dir / "a"), b = dir_contents(dir / "b"), d = dir_contents(dir / "c");
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), d.size());
  EXPECT_EQ(a.at("config.json"), d.at("config.json"));
  EXPECT_NE(a.at("model.safetensors"), d.at("model.safetensors"));
  // Nothing but the three checkpoints was left in the parent (no temp dirs).
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 3);
}

TEST(MakeModelTest, TinyIsSmallAndComplete) {
  ScratchDir dir;
  ASSERT_TRUE(make_random_checkpoint(preset("tiny"), dir / "m", {.seed = 1}).is_ok());
  uint64_t total = 0;
  for (const auto& [name, bytes] : dir_contents(dir / "m")) total += bytes.size();
  EXPECT_LT(total, 1u << 20);
  EXPECT_TRUE(fs::exists(dir / "m" / "config.json"));
  EXPECT_TRUE(fs::exists(dir / "m" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "m" / "model.safetensors.index.json"));
  auto tok = load_tokenizer(dir / "m");
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->eos_id(), 2);

  auto doc = nlohmann::json::parse(read_file(dir / "m" / "config.json"));
  EXPECT_EQ(doc["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(doc["model_type"], "llama");
  EXPECT_EQ(doc["torch_dtype"], "float32");
  EXPECT_EQ(doc["num_key_value_heads"], 1);
  EXPECT_EQ(doc["tie_word_embeddings"], false);

  // Data section = every parameter in F32 (count by hand: embed, lm_head, 2 layers, final norm).
  auto f = SafetensorsFile::open(dir / "m" / "model.safetensors");
  ASSERT_TRUE(f.is_ok());
  uint64_t data = 0;
  for (const auto& n : (*f)->names()) data += (*f)->find(n)->nbytes;
  const uint64_t per_layer = 64 * 64 * 2 + 16 * 64 * 2 + 128 * 64 * 3 + 64 * 2;
  EXPECT_EQ(data, 4 * (512 * 64 * 2 + 2 * per_layer + 64));
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
}

// Statistics of the random weights against the distributions promised in make_model.cc.
TEST(MakeModelTest, WeightDistributions) {
  ScratchDir dir;
  ASSERT_TRUE(make_random_checkpoint(preset("tiny-qwen2"), dir / "m", {.seed = 7}).is_ok());
  auto ck = Checkpoint::open(dir / "m");
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  auto stats = [](const kernels::cpu::WeightView& w) {
    double sum = 0, sq = 0, max_abs = 0;
    const int64_t n = w.rows * w.cols;
    for (int64_t i = 0; i < n; ++i) {
      double v = load_as_float(w.data, w.dtype, size_t(i));
      sum += v;
      sq += v * v;
      max_abs = std::max(max_abs, std::abs(v));
    }
    return std::array<double, 3>{sum / double(n), sq / double(n), max_abs};
  };
  const auto& w = (*ck)->weights();
  // Uniform on +-sqrt(3/cols): mean 0, variance 1/cols.
  for (const auto* m : {&w.layers[0].q_proj, &w.layers[1].down_proj, &w.layers[0].k_proj}) {
    auto [mean, var, max_abs] = stats(*m);
    EXPECT_NEAR(mean, 0.0, 0.05 / std::sqrt(double(m->cols)));
    EXPECT_NEAR(var * double(m->cols), 1.0, 0.1);
    EXPECT_LE(max_abs, std::sqrt(3.0 / double(m->cols)));
  }
  // tiny-qwen2 is tied: embedding rows of norm ~0.25 (1 when untied).
  auto [emean, evar, emax] = stats(w.embed_tokens);
  EXPECT_NEAR(std::sqrt(evar * 64), 0.25, 0.01);
  for (float g : w.layers[0].input_norm) {
    EXPECT_GE(g, 0.9f);
    EXPECT_LE(g, 1.1f);
  }
  ASSERT_EQ(w.layers[0].q_bias.size(), 64u);
  for (float b : w.layers[0].q_bias) EXPECT_LE(std::abs(b), 0.1f);
  // Different tensors get different values.
  EXPECT_NE(std::memcmp(w.layers[0].gate_proj.data, w.layers[0].up_proj.data, 64), 0);
}

TEST(MakeModelTest, HalfDtypesRoundTheSameValues) {
  ScratchDir dir;
  const ModelConfig c = preset("tiny");
  ASSERT_TRUE(make_random_checkpoint(c, dir / "f32", {.seed = 5, .dtype = DType::kF32}).is_ok());
  ASSERT_TRUE(make_random_checkpoint(c, dir / "bf16", {.seed = 5, .dtype = DType::kBF16}).is_ok());
  ASSERT_TRUE(make_random_checkpoint(c, dir / "f16", {.seed = 5, .dtype = DType::kF16}).is_ok());
  auto a = Checkpoint::open(dir / "f32");
  auto b = Checkpoint::open(dir / "bf16");
  auto h = Checkpoint::open(dir / "f16");
  ASSERT_TRUE(a.is_ok() && b.is_ok() && h.is_ok());
  EXPECT_EQ((*b)->config().torch_dtype, DType::kBF16);
  EXPECT_EQ((*h)->config().torch_dtype, DType::kF16);
  const auto& wa = (*a)->weights().layers[1].o_proj;
  const auto& wb = (*b)->weights().layers[1].o_proj;
  const auto& wh = (*h)->weights().layers[1].o_proj;
  EXPECT_EQ(wb.dtype, DType::kBF16);
  EXPECT_EQ(wh.dtype, DType::kF16);
  for (size_t i = 0; i < size_t(wa.rows * wa.cols); ++i) {
    const float v = load_as_float(wa.data, DType::kF32, i);
    ASSERT_EQ(load_as_float(wb.data, DType::kBF16, i), bf16_to_float(float_to_bf16(v)));
    ASSERT_EQ(load_as_float(wh.data, DType::kF16, i), f16_to_float(float_to_f16(v)));
  }
  // Matrices halve; the 320 norm weights count as F32 either way.
  EXPECT_EQ(2 * ((*b)->weight_bytes() - 4 * 320), (*a)->weight_bytes() - 4 * 320);
}

// A plain double forward pass without a cache, only to look at the random
// models' next-token distributions: logits after the last token.
std::vector<double> last_logits(const Checkpoint& ck, const std::vector<int32_t>& tokens) {
  using Vec = std::vector<double>;
  const ModelConfig& c = ck.config();
  const ModelWeights& w = ck.weights();
  auto at = [](const kernels::cpu::WeightView& m, int64_t r, int64_t col) {
    return double(load_as_float(m.data, m.dtype, size_t(r * m.cols + col)));
  };
  auto matvec = [&](const kernels::cpu::WeightView& m, const Vec& x, const std::vector<float>& b) {
    Vec y(size_t(m.rows));
    for (int64_t r = 0; r < m.rows; ++r) {
      double acc = b.empty() ? 0.0 : b[size_t(r)];
      for (int64_t col = 0; col < m.cols; ++col) acc += at(m, r, col) * x[size_t(col)];
      y[size_t(r)] = acc;
    }
    return y;
  };
  auto norm = [&](const Vec& x, const std::vector<float>& g) {
    double ms = 0;
    for (double v : x) ms += v * v;
    const double inv = 1.0 / std::sqrt(ms / double(x.size()) + c.rms_norm_eps);
    Vec y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * g[i];
    return y;
  };
  const auto inv_freq = rope_inv_freq(c);
  auto rope = [&](Vec& v, int heads, size_t pos) {
    const int half = c.head_dim / 2;
    for (int h = 0; h < heads; ++h) {
      double* p = v.data() + size_t(h * c.head_dim);
      for (int i = 0; i < half; ++i) {
        const double a = double(pos) * inv_freq[size_t(i)], x0 = p[i], x1 = p[i + half];
        p[i] = x0 * std::cos(a) - x1 * std::sin(a);
        p[i + half] = x1 * std::cos(a) + x0 * std::sin(a);
      }
    }
  };
  const size_t n = tokens.size(), d = size_t(c.head_dim);
  std::vector<Vec> x(n);
  for (size_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < c.hidden_size; ++j) x[t].push_back(at(w.embed_tokens, tokens[t], j));
  }
  for (const LayerWeights& l : w.layers) {
    std::vector<Vec> q(n), k(n), v(n);
    for (size_t t = 0; t < n; ++t) {
      const Vec h = norm(x[t], l.input_norm);
      q[t] = matvec(l.q_proj, h, l.q_bias);
      k[t] = matvec(l.k_proj, h, l.k_bias);
      v[t] = matvec(l.v_proj, h, l.v_bias);
      rope(q[t], c.num_heads, t);
      rope(k[t], c.num_kv_heads, t);
    }
    for (size_t t = 0; t < n; ++t) {
      Vec attn(size_t(c.num_heads) * d, 0.0);
      for (int h = 0; h < c.num_heads; ++h) {
        const size_t kv = size_t(h / c.group_size());
        Vec scores(t + 1);
        double max = -1e300, sum = 0;
        for (size_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (size_t i = 0; i < d; ++i) dot += q[t][size_t(h) * d + i] * k[s][kv * d + i];
          scores[s] = dot / std::sqrt(double(d));
          max = std::max(max, scores[s]);
        }
        for (double& sc : scores) sum += (sc = std::exp(sc - max));
        for (size_t s = 0; s <= t; ++s) {
          for (size_t i = 0; i < d; ++i)
            attn[size_t(h) * d + i] += scores[s] / sum * v[s][kv * d + i];
        }
      }
      const Vec o = matvec(l.o_proj, attn, {});
      for (size_t j = 0; j < o.size(); ++j) x[t][j] += o[j];
      const Vec h = norm(x[t], l.post_attention_norm);
      const Vec g = matvec(l.gate_proj, h, {}), u = matvec(l.up_proj, h, {});
      Vec a(g.size());
      for (size_t j = 0; j < g.size(); ++j) a[j] = g[j] / (1 + std::exp(-g[j])) * u[j];
      const Vec down = matvec(l.down_proj, a, {});
      for (size_t j = 0; j < down.size(); ++j) x[t][j] += down[j];
    }
  }
  return matvec(w.lm_head, norm(x.back(), w.final_norm), {});
}

// Peaked (far from uniform), not one-hot, clear of near-ties, and dependent on the input.
TEST(MakeModelTest, RandomModelsPredictLikeModels) {
  ScratchDir dir;
  for (const char* name : {"tiny", "tiny-qwen2"}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(make_random_checkpoint(preset(name), dir / name, {.seed = 11}).is_ok());
    auto ck = Checkpoint::open(dir / name);
    ASSERT_TRUE(ck.is_ok());
    std::mt19937 rng(5);
    std::set<size_t> argmaxes;
    std::vector<double> top_probs, gaps;
    for (int prompt = 0; prompt < 48; ++prompt) {
      std::vector<int32_t> tokens = {1};
      for (int i = 0; i < 5; ++i) tokens.push_back(int32_t(3 + rng() % 256));
      std::vector<double> logits = last_logits(**ck, tokens);
      std::vector<double> sorted = logits;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
      double z = 0;
      for (double v : logits) z += std::exp(v - sorted[0]);
      top_probs.push_back(1.0 / z);
      gaps.push_back(sorted[0] - sorted[1]);
      argmaxes.insert(size_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    }
    std::sort(top_probs.begin(), top_probs.end());
    std::sort(gaps.begin(), gaps.end());
    const double median_top = top_probs[top_probs.size() / 2];
    EXPECT_GT(median_top, 0.2);  // uniform would be 1/512
    EXPECT_LT(median_top, 0.99);
    EXPECT_GT(gaps[gaps.size() / 2], 0.3);  // logits have deviation ~5
    EXPECT_GE(argmaxes.size(), 24u);        // of 48 prompts
  }
}

void expect_same_weights(const Checkpoint& x, const Checkpoint& y) {
  auto same_view = [](const kernels::cpu::WeightView& a, const kernels::cpu::WeightView& b) {
    ASSERT_EQ(a.rows, b.rows);
    ASSERT_EQ(a.cols, b.cols);
    ASSERT_EQ(a.dtype, b.dtype);
    EXPECT_EQ(std::memcmp(a.data, b.data, size_t(a.rows * a.cols) * dtype_size(a.dtype)), 0);
  };
  const auto &a = x.weights(), &b = y.weights();
  same_view(a.embed_tokens, b.embed_tokens);
  same_view(a.lm_head, b.lm_head);
  EXPECT_EQ(a.final_norm, b.final_norm);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    const auto &la = a.layers[i], &lb = b.layers[i];
    for (auto m : {&LayerWeights::q_proj, &LayerWeights::k_proj, &LayerWeights::v_proj,
                   &LayerWeights::o_proj, &LayerWeights::gate_proj, &LayerWeights::up_proj,
                   &LayerWeights::down_proj}) {
      same_view(la.*m, lb.*m);
    }
    EXPECT_EQ(la.q_bias, lb.q_bias);
    EXPECT_EQ(la.k_bias, lb.k_bias);
    EXPECT_EQ(la.v_bias, lb.v_bias);
    EXPECT_EQ(la.input_norm, lb.input_norm);
    EXPECT_EQ(la.post_attention_norm, lb.post_attention_norm);
  }
  EXPECT_EQ(x.weight_bytes(), y.weight_bytes());
}

TEST(MakeModelTest, ShardedLoadsTheSameTensors) {
  ScratchDir dir;
  for (const char* name : {"tiny", "tiny-qwen2"}) {
    SCOPED_TRACE(name);
    const ModelConfig c = preset(name);
    const fs::path one = dir / (std::string(name) + "-one"),
                   many = dir / (std::string(name) + "-many");
    ASSERT_TRUE(make_random_checkpoint(c, one, {.seed = 9, .dtype = DType::kBF16}).is_ok());
    const uint64_t limit = 40 * 1024;
    ASSERT_TRUE(make_random_checkpoint(c, many,
                                       {.seed = 9, .dtype = DType::kBF16, .max_shard_bytes = limit})
                    .is_ok());
    EXPECT_FALSE(fs::exists(many / "model.safetensors"));
    ASSERT_TRUE(fs::exists(many / "model.safetensors.index.json"));
    auto index = nlohmann::json::parse(read_file(many / "model.safetensors.index.json"));
    std::set<std::string> files;
    for (auto& [tensor, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
    EXPECT_GE(files.size(), 3u);
    uint64_t total = 0;
    int k = 0;
    for (const std::string& f : files) {
      ++k;
      char expect[64];
      std::snprintf(expect, sizeof expect, "model-%05d-of-%05zu.safetensors", k, files.size());
      EXPECT_EQ(f, expect);
      auto sf = SafetensorsFile::open(many / f);
      ASSERT_TRUE(sf.is_ok()) << sf.status().to_string();
      uint64_t shard = 0;
      for (const auto& n : (*sf)->names()) shard += (*sf)->find(n)->nbytes;
      total += shard;
      // A shard exceeds the limit only when it is a single oversized tensor.
      if (shard > limit) {
        EXPECT_EQ((*sf)->num_tensors(), 1u);
      }
    }
    EXPECT_EQ(index["metadata"]["total_size"], total);

    auto a = Checkpoint::open(one);
    auto b = Checkpoint::open(many);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    EXPECT_EQ((*b)->files().size(), files.size());
    expect_same_weights(**a, **b);
  }
}

TEST(MakeModelTest, ReplacesOnlyCheckpointDirectories) {
  ScratchDir dir;
  const ModelConfig c = preset("tiny");
  ASSERT_TRUE(make_random_checkpoint(c, dir / "m", {.seed = 1}).is_ok());
  const std::string first = read_file(dir / "m" / "model.safetensors");
  // A re-run replaces the previous checkpoint, sharded files included.
  ASSERT_TRUE(make_random_checkpoint(c, dir / "m", {.seed = 2, .max_shard_bytes = 100000}).is_ok());
  EXPECT_FALSE(fs::exists(dir / "m" / "model.safetensors"));
  ASSERT_TRUE(make_random_checkpoint(c, dir / "m/", {.seed = 2}).is_ok());  // trailing slash
  EXPECT_NE(read_file(dir / "m" / "model.safetensors"), first);
  EXPECT_FALSE(fs::exists(dir / "m" / "model-00001-of-00002.safetensors"));
  ASSERT_TRUE(Checkpoint::open(dir / "m").is_ok());

  // A directory with anything else in it is left alone.
  fs::create_directories(dir / "home");
  write_file(dir / "home" / "notes.txt", "keep me");
  expect_error(make_random_checkpoint(c, dir / "home", {.seed = 1}), StatusCode::kInvalidArgument,
               {"notes.txt"});
  EXPECT_EQ(read_file(dir / "home" / "notes.txt"), "keep me");
  EXPECT_FALSE(fs::exists(dir / "home" / "config.json"));
  // Nested output directories are created.
  ASSERT_TRUE(make_random_checkpoint(c, dir / "x" / "y" / "z", {.seed = 1}).is_ok());
  EXPECT_TRUE(Checkpoint::open(dir / "x" / "y" / "z").is_ok());
}

// A real tokenizer in place of the byte one: a small byte-level BPE with
// BOS and EOS as added tokens. Its ids must fit the model's vocabulary.
TEST(MakeModelTest, AttachesARealTokenizerWhoseIdsFit) {
  ScratchDir dir;
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_char(static_cast<unsigned char>(b))] = b;
  vocab["hi"] = 256;
  auto tokenizer_json = [&](int bos, int eos) {
    return nlohmann::json{{"added_tokens",
                           {{{"id", bos}, {"content", "<s>"}, {"special", true}},
                            {{"id", eos}, {"content", "</s>"}, {"special", true}}}},
                          {"normalizer", nullptr},
                          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                          {"post_processor",
                           {{"type", "TemplateProcessing"},
                            {"single",
                             {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}}},
                          {"decoder", {{"type", "ByteLevel"}}},
                          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"h i"}}}}};
  };
  fs::create_directories(dir / "tok");
  write_file(dir / "tok" / "tokenizer.json", tokenizer_json(300, 301).dump());
  write_file(dir / "tok" / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  const ModelConfig c = preset("tiny");  // vocab 512
  ASSERT_TRUE(make_random_checkpoint(c, dir / "m", {.seed = 1}).is_ok());
  ASSERT_TRUE(attach_tokenizer(dir / "m", dir / "tok").is_ok());
  EXPECT_FALSE(fs::exists(dir / "m" / kByteTokenizerFile));
  auto tok = load_tokenizer(dir / "m");
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->encode("hi!"), (std::vector<int32_t>{256, '!'}));
  auto ck = Checkpoint::open(dir / "m");
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  EXPECT_EQ((*ck)->config().bos_token_id, 300);
  EXPECT_EQ((*ck)->config().eos_token_ids, std::vector<int32_t>{301});
  // Re-making the checkpoint replaces the tokenizer files too.
  ASSERT_TRUE(make_random_checkpoint(c, dir / "m", {.seed = 2}).is_ok());

  // Ids past the model's vocabulary: refused, the checkpoint unchanged.
  write_file(dir / "tok" / "tokenizer.json", tokenizer_json(600, 601).dump());
  const std::string config_before = read_file(dir / "m" / "config.json");
  expect_error(attach_tokenizer(dir / "m", dir / "tok"), StatusCode::kInvalidArgument,
               {"602 ids", "vocabulary of 512"});
  EXPECT_EQ(read_file(dir / "m" / "config.json"), config_before);
  EXPECT_TRUE(fs::exists(dir / "m" / kByteTokenizerFile));
  EXPECT_FALSE(attach_tokenizer(dir / "m", dir / "nowhere").is_ok());
}

TEST(MakeModelTest, RefusesConfigsItCannotWrite) {
  ScratchDir dir;
  ModelConfig c = preset("tiny");
  c.vocab_size = 100;  // below the byte tokenizer's 259
  expect_error(make_random_checkpoint(c, dir / "m", {}), StatusCode::kInvalidArgument,
               {"vocab_size"});
  c = preset("tiny");
  c.num_kv_heads = 3;
  EXPECT_EQ(make_random_checkpoint(c, dir / "m", {}).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(dir / "m"));
}

}  // namespace
}  // namespace baton::engine
