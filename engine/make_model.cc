#include "engine/make_model.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "engine/hf_tokenizer.h"
#include "engine/safetensors_writer.h"
#include "engine/tokenizer.h"

namespace baton::engine {
namespace {

namespace fs = std::filesystem;

// Logits of the random model have about this standard deviation. With unit
// logits a 50k-vocabulary softmax is nearly flat; at this scale the top token
// clearly stands out, so greedy and sampled decoding both behave like a model.
constexpr double kLogitScale = 5.0;
// Norm of an embedding row when it doubles as the output layer (tied).
constexpr double kTiedEmbeddingNorm = 0.25;
constexpr size_t kChunkBytes = size_t(4) << 20;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// A tensor and its distribution: uniform on [center - half, center + half].
struct Planned {
  TensorSpec spec;
  double center = 0.0;
  double half = 0.0;
};

// Every tensor, in the order transformers' state dict lists them per layer.
std::vector<Planned> plan_tensors(const ModelConfig& c, DType dtype) {
  std::vector<Planned> out;
  const int64_t hidden = c.hidden_size, ffn = c.intermediate_size, vocab = c.vocab_size;
  const int64_t q_dim = int64_t(c.num_heads) * c.head_dim;
  const int64_t kv_dim = int64_t(c.num_kv_heads) * c.head_dim;
  auto add = [&](std::string name, std::vector<int64_t> shape, double center, double half) {
    out.push_back({TensorSpec{std::move(name), dtype, std::move(shape)}, center, half});
  };
  // Linear weights: uniform with variance 1/cols, so unit-variance inputs give
  // unit-variance outputs in every layer.
  auto linear = [&](std::string name, int64_t rows, int64_t cols) {
    add(std::move(name), {rows, cols}, 0.0, std::sqrt(3.0 / double(cols)));
  };
  // Embedding rows are short next to the unit-variance layer outputs added to
  // the residual stream. With tied weights the current token's own row is in
  // the final hidden state, and a long row would make the model repeat its
  // input; untied, norm 1 keeps the first RMSNorm far from its epsilon.
  const double embed_norm = c.tie_word_embeddings ? kTiedEmbeddingNorm : 1.0;
  add("model.embed_tokens.weight", {vocab, hidden}, 0.0,
      embed_norm * std::sqrt(3.0 / double(hidden)));
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {hidden}, 1.0, 0.1);
    if (c.fused_projections) {
      linear(p + "self_attn.qkv_proj.weight", q_dim + 2 * kv_dim, hidden);
    } else {
      linear(p + "self_attn.q_proj.weight", q_dim, hidden);
      linear(p + "self_attn.k_proj.weight", kv_dim, hidden);
      linear(p + "self_attn.v_proj.weight", kv_dim, hidden);
    }
    if (c.attention_bias) {
      add(p + "self_attn.q_proj.bias", {q_dim}, 0.0, 0.1);
      add(p + "self_attn.k_proj.bias", {kv_dim}, 0.0, 0.1);
      add(p + "self_attn.v_proj.bias", {kv_dim}, 0.0, 0.1);
    }
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", {c.head_dim}, 1.0, 0.1);
      add(p + "self_attn.k_norm.weight", {c.head_dim}, 1.0, 0.1);
    }
    linear(p + "self_attn.o_proj.weight", hidden, q_dim);
    if (c.output_bias) add(p + "self_attn.o_proj.bias", {hidden}, 0.0, 0.1);
    add(p + "post_attention_layernorm.weight", {hidden}, 1.0, 0.1);
    if (c.fused_projections) {
      linear(p + "mlp.gate_up_proj.weight", 2 * ffn, hidden);
    } else {
      linear(p + "mlp.gate_proj.weight", ffn, hidden);
      linear(p + "mlp.up_proj.weight", ffn, hidden);
    }
    linear(p + "mlp.down_proj.weight", hidden, ffn);
  }
  // The final norm sets the logit scale: a normalised hidden state (norm
  // sqrt(hidden)) against output rows of norm r gives logits of deviation r;
  // the norm weight rescales that to kLogitScale.
  const double out_norm = c.tie_word_embeddings ? embed_norm : 1.0;
  add("model.norm.weight", {hidden}, kLogitScale / out_norm, 0.1 * kLogitScale / out_norm);
  if (!c.tie_word_embeddings) {
    add("lm_head.weight", {vocab, hidden}, 0.0, std::sqrt(3.0 / double(hidden)));
  }
  return out;
}

// Element i of a tensor depends only on (seed, tensor name, i): values do not
// depend on chunking, sharding or which other tensors exist.
class TensorValues {
 public:
  TensorValues(uint64_t seed, const Planned& t)
      : key_(splitmix64(splitmix64(seed) ^ fnv1a(t.spec.name))), center_(t.center), half_(t.half) {}
  float operator()(uint64_t i) const {
    const double u = double(splitmix64(key_ + i) >> 11) * 0x1.0p-53;  // [0, 1)
    return float(center_ + half_ * (2.0 * u - 1.0));
  }

 private:
  uint64_t key_;
  double center_, half_;
};

Status write_shard(const fs::path& path, const std::vector<const Planned*>& tensors,
                   uint64_t seed) {
  std::vector<TensorSpec> specs;
  for (const Planned* t : tensors) specs.push_back(t->spec);
  BATON_ASSIGN_OR_RETURN(auto writer,
                         SafetensorsWriter::create(path, std::move(specs), {{"format", "pt"}}));
  std::vector<unsigned char> buf(kChunkBytes);
  for (const Planned* t : tensors) {
    const TensorValues values(seed, *t);
    const size_t esize = dtype_size(t->spec.dtype);
    const uint64_t numel = t->spec.nbytes() / esize;
    const uint64_t per_chunk = kChunkBytes / esize;
    for (uint64_t start = 0; start < numel; start += per_chunk) {
      const uint64_t n = std::min(per_chunk, numel - start);
      for (uint64_t j = 0; j < n; ++j)
        store_from_float(buf.data(), t->spec.dtype, j, values(start + j));
      BATON_RETURN_IF_ERROR(writer->write(buf.data(), n * esize));
    }
  }
  return writer->finish();
}

Status write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return io_error("cannot write " + path.string());
  return Status::ok();
}

// What make-model itself writes; only a directory holding nothing else is
// replaced, so a mistyped path never deletes someone's files.
bool is_checkpoint_file(const std::string& name) {
  if (name == "config.json" || name == "model.safetensors" ||
      name == "model.safetensors.index.json" || name == kByteTokenizerFile ||
      name == "generation_config.json" || name == kHfTokenizerFile ||
      name == "tokenizer_config.json" || name == "special_tokens_map.json") {
    return true;
  }
  return name.starts_with("model-") && name.ends_with(".safetensors");
}

Status write_checkpoint(const ModelConfig& config, const fs::path& dir,
                        const MakeModelOptions& options) {
  const std::vector<Planned> tensors = plan_tensors(config, options.dtype);
  // Greedy sharding in declaration order; a tensor larger than the limit gets a shard of its own.
  std::vector<std::vector<const Planned*>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (const Planned& t : tensors) {
    const uint64_t n = t.spec.nbytes();
    if (!shards.back().empty() && shard_bytes + n > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&t);
    shard_bytes += n;
    total_bytes += n;
  }

  ModelConfig written = config;
  written.torch_dtype = options.dtype;
  BATON_RETURN_IF_ERROR(
      write_text(dir / "config.json", model_config_to_json(written).dump(2) + "\n"));
  BATON_RETURN_IF_ERROR(ByteTokenizer::save(dir));

  if (shards.size() == 1) return write_shard(dir / "model.safetensors", shards[0], options.seed);
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    BATON_RETURN_IF_ERROR(write_shard(dir / name, shards[s], options.seed));
    for (const Planned* t : shards[s]) weight_map[t->spec.name] = name;
  }
  nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  return write_text(dir / "model.safetensors.index.json", index.dump(2) + "\n");
}

}  // namespace

std::vector<TensorSpec> random_checkpoint_tensors(const ModelConfig& config, DType dtype) {
  std::vector<TensorSpec> out;
  for (Planned& t : plan_tensors(config, dtype)) out.push_back(std::move(t.spec));
  return out;
}

Status make_random_checkpoint(const ModelConfig& config, const fs::path& out_dir,
                              const MakeModelOptions& options) {
  // Whatever is written must load: check the config the way the loader will.
  auto reparsed = parse_model_config(model_config_to_json(config), "model config");
  if (!reparsed.is_ok()) return reparsed.status();
  if (config.vocab_size < ByteTokenizer::kMinVocab) {
    return invalid_argument("vocab_size " + std::to_string(config.vocab_size) +
                            " is below the byte tokenizer's " +
                            std::to_string(ByteTokenizer::kMinVocab));
  }
  if (options.max_shard_bytes == 0) return invalid_argument("max_shard_bytes must be positive");

  fs::path out = out_dir;
  if (!out.has_filename()) out = out.parent_path();  // "dir/" -> "dir"
  if (out.empty()) return invalid_argument("empty output directory");
  fs::path parent = out.parent_path();
  if (parent.empty()) parent = ".";
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) return io_error("cannot create " + parent.string() + ": " + ec.message());

  const bool replacing = fs::exists(out, ec);
  if (replacing) {
    if (!fs::is_directory(out, ec)) {
      return invalid_argument(out.string() + " exists and is not a directory");
    }
    for (const auto& entry : fs::directory_iterator(out, ec)) {
      if (!is_checkpoint_file(entry.path().filename().string())) {
        return invalid_argument(out.string() + " holds " + entry.path().filename().string() +
                                ", which is not part of a checkpoint; refusing to replace it");
      }
    }
    if (ec) return io_error("cannot list " + out.string() + ": " + ec.message());
  }

  // Everything is written into a hidden sibling and renamed into place at the
  // end, so a crashed run never leaves a directory that looks complete.
  const std::string tag = std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}());
  const fs::path staging = parent / ("." + out.filename().string() + ".partial-" + tag);
  fs::create_directory(staging, ec);
  if (ec) return io_error("cannot create " + staging.string() + ": " + ec.message());
  Status st = write_checkpoint(config, staging, options);
  if (st.is_ok() && replacing) {
    const fs::path old = parent / ("." + out.filename().string() + ".old-" + tag);
    fs::rename(out, old, ec);
    if (!ec) {
      fs::rename(staging, out, ec);
      std::error_code ignored;
      if (ec) {
        fs::rename(old, out, ignored);  // put the previous checkpoint back
      } else {
        fs::remove_all(old, ignored);
      }
    }
    if (ec) st = io_error("cannot replace " + out.string() + ": " + ec.message());
  } else if (st.is_ok()) {
    fs::rename(staging, out, ec);
    if (ec) st = io_error("cannot move checkpoint into " + out.string() + ": " + ec.message());
  }
  if (!st.is_ok()) {
    std::error_code ignored;
    fs::remove_all(staging, ignored);
    return st.with_context("writing " + out.string());
  }
  return Status::ok();
}

Status attach_tokenizer(const fs::path& checkpoint_dir, const fs::path& tokenizer_dir) {
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, load_hf_tokenizer(tokenizer_dir));
  BATON_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(checkpoint_dir / "config.json"));
  if (tokenizer->vocab_size() > config.vocab_size) {
    return invalid_argument("the tokenizer in " + tokenizer_dir.string() + " has " +
                            std::to_string(tokenizer->vocab_size()) +
                            " ids, more than the model's vocabulary of " +
                            std::to_string(config.vocab_size));
  }
  std::error_code ec;
  for (const char* name : {kHfTokenizerFile, "tokenizer_config.json", "special_tokens_map.json",
                           "chat_template.jinja"}) {
    if (!fs::exists(tokenizer_dir / name, ec)) continue;
    fs::copy_file(tokenizer_dir / name, checkpoint_dir / name, fs::copy_options::overwrite_existing,
                  ec);
    if (ec) return io_error("cannot copy " + (tokenizer_dir / name).string() + ": " + ec.message());
  }
  fs::remove(checkpoint_dir / kByteTokenizerFile, ec);
  config.bos_token_id = tokenizer->bos_id();
  config.eos_token_ids.clear();
  if (tokenizer->eos_id() >= 0) config.eos_token_ids.push_back(tokenizer->eos_id());
  return write_text(checkpoint_dir / "config.json", model_config_to_json(config).dump(2) + "\n");
}

}  // namespace baton::engine
