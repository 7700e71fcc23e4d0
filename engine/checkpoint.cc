#include "engine/checkpoint.h"

#include <chrono>
#include <cstddef>
#include <map>
#include <set>
#include <string_view>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "engine/json_file.h"
#include "engine/safetensors.h"

namespace baton::engine {
namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

using TensorMap = std::map<std::string, const TensorInfo*, std::less<>>;

// Opens the files an index names and maps each weight to its tensor. Every
// file named must exist and hold every tensor the index puts there.
Status open_sharded(const std::filesystem::path& dir,
                    std::vector<std::unique_ptr<SafetensorsFile>>& files, TensorMap& tensors) {
  const auto index_path = dir / kIndexFile;
  const std::string index = index_path.string();
  BATON_ASSIGN_OR_RETURN(nlohmann::json doc, read_json_file(index_path));
  if (!doc.is_object()) return data_loss(index + ": invalid JSON");
  auto map_it = doc.find("weight_map");
  if (map_it == doc.end() || !map_it->is_object()) {
    return data_loss(index + ": 'weight_map' missing or not an object");
  }
  std::map<std::string, SafetensorsFile*> by_file;
  for (auto it = map_it->begin(); it != map_it->end(); ++it) {
    if (!it.value().is_string()) {
      return data_loss(index + ": weight_map entry '" + it.key() + "' is not a file name");
    }
    const std::string file_name = it.value().get<std::string>();
    // Shards live next to the index; a path elsewhere is a corrupt index.
    if (file_name.empty() || file_name.find('/') != std::string::npos || file_name == "." ||
        file_name == "..") {
      return data_loss(index + ": weight_map entry '" + it.key() + "' names '" + file_name +
                       "', not a file in the checkpoint directory");
    }
    auto [pos, inserted] = by_file.emplace(file_name, nullptr);
    if (inserted) {
      auto opened = SafetensorsFile::open(dir / file_name);
      if (!opened.is_ok()) {
        return opened.status().with_context(index + " names " + file_name);
      }
      pos->second = opened->get();
      files.push_back(std::move(opened).value());
    }
    const TensorInfo* t = pos->second->find(it.key());
    if (t == nullptr) {
      return data_loss(index + ": tensor '" + it.key() + "' is not in " + file_name);
    }
    tensors[it.key()] = t;
  }
  return Status::ok();
}

using kernels::cpu::WeightView;

// Rows [first, first + rows) of a matrix: a fused projection's part.
WeightView rows_of(const WeightView& m, int64_t first, int64_t rows) {
  const auto* base = static_cast<const std::byte*>(m.data);
  return WeightView{base + size_t(first) * size_t(m.cols) * dtype_size(m.dtype), m.dtype, rows,
                    m.cols};
}

class WeightBuilder {
 public:
  WeightBuilder(const std::filesystem::path& dir, const TensorMap& tensors)
      : dir_(dir), tensors_(tensors) {}

  Result<const TensorInfo*> get(const std::string& name, std::vector<int64_t> shape) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) {
      return not_found("weight '" + name + "' is missing from checkpoint " + dir_.string());
    }
    used_.insert(name);
    const TensorInfo* t = it->second;
    if (t->shape != shape) {
      return invalid_argument("weight '" + name + "' in " + dir_.string() + ": expected shape " +
                              shape_to_string(shape) + ", got " + shape_to_string(t->shape));
    }
    return t;
  }

  Result<kernels::cpu::WeightView> matrix(const std::string& name, int64_t rows, int64_t cols) {
    BATON_ASSIGN_OR_RETURN(const TensorInfo* t, get(name, {rows, cols}));
    bytes_ += t->nbytes;
    return kernels::cpu::WeightView{t->data, t->dtype, rows, cols};
  }

  // 1-D weights are small; the forward pass reads them as F32.
  Result<std::vector<float>> vector(const std::string& name, int64_t n) {
    BATON_ASSIGN_OR_RETURN(const TensorInfo* t, get(name, {n}));
    std::vector<float> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = load_as_float(t->data, t->dtype, size_t(i));
    bytes_ += uint64_t(n) * sizeof(float);  // the F32 copy is what the forward pass reads
    return out;
  }

  uint64_t bytes() const { return bytes_; }

  // A weight the config does not describe would be left out of the forward
  // pass silently (an o_proj bias of an architecture without one, a norm
  // of a variant Baton does not run): wrong output, not an error. Refused,
  // naming them; what transformers itself ignores is passed over: RoPE
  // tables older checkpoints saved (inv_freq, and the cos/sin caches vLLM
  // skips too), and lm_head.weight beside tied embeddings.
  Status refuse_unused(const ModelConfig& c) const {
    std::vector<std::string_view> unused;
    for (const auto& [name, tensor] : tensors_) {
      const std::string_view n = name;
      if (used_.contains(name) || n.ends_with("rotary_emb.inv_freq") ||
          n.ends_with("rotary_emb.cos_cached") || n.ends_with("rotary_emb.sin_cached") ||
          (c.tie_word_embeddings && n == "lm_head.weight"))
        continue;
      unused.push_back(n);
    }
    if (unused.empty()) return Status::ok();
    std::string names;
    for (size_t i = 0; i < unused.size() && i < 4; ++i)
      names += (i > 0 ? ", " : "") + std::string(unused[i]);
    if (unused.size() > 4) names += " and " + std::to_string(unused.size() - 4) + " more";
    return Status(StatusCode::kUnimplemented,
                  "checkpoint " + dir_.string() + " holds weights that " + c.architecture +
                      " as its config.json describes it has no use for: " + names);
  }

 private:
  const std::filesystem::path& dir_;
  const TensorMap& tensors_;
  std::set<std::string, std::less<>> used_;
  uint64_t bytes_ = 0;
};

}  // namespace

Checkpoint::~Checkpoint() = default;

Result<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::filesystem::path& dir) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = dir;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return not_found("checkpoint directory " + dir.string() + " does not exist");
  }
  BATON_ASSIGN_OR_RETURN(ckpt->config_, load_model_config(dir / "config.json"));
  BATON_RETURN_IF_ERROR(merge_generation_config(dir / "generation_config.json", ckpt->config_));
  const ModelConfig& c = ckpt->config_;

  TensorMap tensors;
  if (std::filesystem::exists(dir / kSingleFile, ec)) {
    BATON_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(dir / kSingleFile));
    for (const std::string& name : file->names()) tensors[name] = file->find(name);
    ckpt->files_.push_back(std::move(file));
  } else if (std::filesystem::exists(dir / kIndexFile, ec)) {
    BATON_RETURN_IF_ERROR(open_sharded(dir, ckpt->files_, tensors));
  } else {
    return not_found("checkpoint " + dir.string() + " has neither " + kSingleFile + " nor " +
                     kIndexFile);
  }

  WeightBuilder b(dir, tensors);
  ModelWeights& w = ckpt->weights_;
  const int64_t hidden = c.hidden_size, vocab = c.vocab_size, ffn = c.intermediate_size;
  const int64_t q_dim = int64_t(c.num_heads) * c.head_dim;
  const int64_t kv_dim = int64_t(c.num_kv_heads) * c.head_dim;
  BATON_ASSIGN_OR_RETURN(w.embed_tokens, b.matrix("model.embed_tokens.weight", vocab, hidden));
  w.layers.resize(size_t(c.num_layers));
  for (int32_t i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = w.layers[size_t(i)];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    if (c.fused_projections) {
      // Phi3's qkv_proj holds q, k and v's rows one after another.
      BATON_ASSIGN_OR_RETURN(const WeightView qkv,
                             b.matrix(p + "self_attn.qkv_proj.weight", q_dim + 2 * kv_dim, hidden));
      l.q_proj = rows_of(qkv, 0, q_dim);
      l.k_proj = rows_of(qkv, q_dim, kv_dim);
      l.v_proj = rows_of(qkv, q_dim + kv_dim, kv_dim);
    } else {
      BATON_ASSIGN_OR_RETURN(l.q_proj, b.matrix(p + "self_attn.q_proj.weight", q_dim, hidden));
      BATON_ASSIGN_OR_RETURN(l.k_proj, b.matrix(p + "self_attn.k_proj.weight", kv_dim, hidden));
      BATON_ASSIGN_OR_RETURN(l.v_proj, b.matrix(p + "self_attn.v_proj.weight", kv_dim, hidden));
    }
    BATON_ASSIGN_OR_RETURN(l.o_proj, b.matrix(p + "self_attn.o_proj.weight", hidden, q_dim));
    if (c.attention_bias) {
      BATON_ASSIGN_OR_RETURN(l.q_bias, b.vector(p + "self_attn.q_proj.bias", q_dim));
      BATON_ASSIGN_OR_RETURN(l.k_bias, b.vector(p + "self_attn.k_proj.bias", kv_dim));
      BATON_ASSIGN_OR_RETURN(l.v_bias, b.vector(p + "self_attn.v_proj.bias", kv_dim));
    }
    if (c.output_bias) {
      BATON_ASSIGN_OR_RETURN(l.o_bias, b.vector(p + "self_attn.o_proj.bias", hidden));
    }
    if (c.qk_norm) {
      BATON_ASSIGN_OR_RETURN(l.q_norm, b.vector(p + "self_attn.q_norm.weight", c.head_dim));
      BATON_ASSIGN_OR_RETURN(l.k_norm, b.vector(p + "self_attn.k_norm.weight", c.head_dim));
    }
    if (c.fused_projections) {
      // Phi3's gate_up_proj: the gate's rows, then up's.
      BATON_ASSIGN_OR_RETURN(const WeightView gate_up,
                             b.matrix(p + "mlp.gate_up_proj.weight", 2 * ffn, hidden));
      l.gate_proj = rows_of(gate_up, 0, ffn);
      l.up_proj = rows_of(gate_up, ffn, ffn);
    } else {
      BATON_ASSIGN_OR_RETURN(l.gate_proj, b.matrix(p + "mlp.gate_proj.weight", ffn, hidden));
      BATON_ASSIGN_OR_RETURN(l.up_proj, b.matrix(p + "mlp.up_proj.weight", ffn, hidden));
    }
    BATON_ASSIGN_OR_RETURN(l.down_proj, b.matrix(p + "mlp.down_proj.weight", hidden, ffn));
    BATON_ASSIGN_OR_RETURN(l.input_norm, b.vector(p + "input_layernorm.weight", hidden));
    BATON_ASSIGN_OR_RETURN(l.post_attention_norm,
                           b.vector(p + "post_attention_layernorm.weight", hidden));
  }
  BATON_ASSIGN_OR_RETURN(w.final_norm, b.vector("model.norm.weight", hidden));
  if (c.tie_word_embeddings) {
    // transformers ignores a stored lm_head.weight when tied; so do we.
    w.lm_head = w.embed_tokens;
  } else {
    BATON_ASSIGN_OR_RETURN(w.lm_head, b.matrix("lm_head.weight", vocab, hidden));
  }
  BATON_RETURN_IF_ERROR(b.refuse_unused(c));
  ckpt->weight_bytes_ = b.bytes();
  return ckpt;
}

uint64_t Checkpoint::weight_bytes() const { return weight_bytes_; }

namespace {
// A load holds the lock for as long as it reads the checkpoint (twice where
// it re-reads): minutes for the largest from a slow disk. Only a holder that
// is stopped, not dead, keeps it longer.
constexpr std::chrono::milliseconds kLoadLockPatience{600'000};
}  // namespace

Result<std::unique_ptr<Checkpoint>> Checkpoint::open_in_huge_pages(const std::filesystem::path& dir,
                                                                   HugePageReport& report) {
  LoadLock lock(dir, kLoadLockPatience);
  if (lock.gave_up_waiting()) {
    spdlog::warn(
        "loading {} without its load lock ({}): another process loading it at the same time "
        "may leave both in 4 KiB pages",
        dir.string(), lock.note());
  } else if (!lock.held() && std::filesystem::is_directory(dir)) {
    spdlog::info("no load lock on {} ({}); loading it anyway", dir.string(), lock.note());
  }
  BATON_ASSIGN_OR_RETURN(auto checkpoint, open(dir));
  report = checkpoint->map_in_huge_pages();
  return checkpoint;
}

HugePageReport Checkpoint::map_in_huge_pages() {
  HugePageReport total;
  for (auto& file : files_) {
    HugePageReport one = file->map_in_huge_pages();
    total.eligible_bytes += one.eligible_bytes;
    total.huge_bytes += one.huge_bytes;
    total.reread = total.reread || one.reread;
    if (total.note.empty() && one.huge_bytes < one.eligible_bytes)
      total.note = file->path().string() + ": " + one.note;
  }
  return total;
}

}  // namespace baton::engine
