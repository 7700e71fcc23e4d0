#include "engine/cpu_forward.h"

#include <algorithm>
#include <cmath>
#include <exception>

#include "engine/host_memory.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/linear.h"

namespace baton::engine {

namespace kc = kernels::cpu;

namespace {

template <typename T>
T* grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace

CpuForward::CpuForward(const Checkpoint& checkpoint, kc::ThreadPool& pool)
    : config_(checkpoint.config()),
      weights_(checkpoint.weights()),
      pool_(pool),
      inv_freq_(rope_inv_freq(checkpoint.config())),
      weights_bytes_(checkpoint.weight_bytes()) {}

CpuForward::CpuForward(const Checkpoint& checkpoint, int32_t threads)
    : config_(checkpoint.config()),
      weights_(checkpoint.weights()),
      owned_pool_(std::make_unique<kc::ThreadPool>(threads)),
      pool_(*owned_pool_),
      inv_freq_(rope_inv_freq(checkpoint.config())),
      weights_bytes_(checkpoint.weight_bytes()) {}

Result<KvPool> CpuForward::allocate_kv_pool(const KvLayout& layout) {
  return KvPool::create(layout);
}

void CpuForward::lap(double CpuStepProfile::*phase) {
  if (profile_ == nullptr) return;
  const auto now = std::chrono::steady_clock::now();
  profile_->*phase += std::chrono::duration<double>(now - last_lap_).count();
  last_lap_ = now;
}

uint64_t CpuForward::workspace_bytes() const {
  size_t floats = 0;
  for (const std::vector<float>* v : {&x_, &h_, &q_, &k_, &v_, &attn_, &gate_, &up_})
    floats += v->capacity();
  return uint64_t(floats) * sizeof(float);
}

Status CpuForward::reserve_workspace(const StepLimits& limits) {
  const auto tokens = size_t(std::max<int64_t>(limits.tokens, 1));
  const ModelConfig& c = config_;
  const size_t q_width = size_t(c.num_heads) * c.head_dim;
  const size_t kv_width = size_t(c.num_kv_heads) * c.head_dim;
  for (auto [v, width] : {std::pair{&x_, size_t(c.hidden_size)},
                          {&h_, size_t(c.hidden_size)},
                          {&q_, q_width},
                          {&k_, kv_width},
                          {&v_, kv_width},
                          {&attn_, q_width},
                          {&gate_, size_t(c.intermediate_size)},
                          {&up_, size_t(c.intermediate_size)}}) {
    try {
      v->reserve(tokens * width);
    } catch (const std::exception&) {  // bad_alloc, or length_error past max_size
      return resource_exhausted(
          "engine.max_num_batched_tokens: the activations of a " + std::to_string(tokens) +
          "-token step need more memory than this process can reserve (" +
          std::to_string(tokens * width * sizeof(float)) + " bytes for one of them)");
    }
  }
  return Status::ok();
}

Result<uint64_t> CpuForward::memory_bytes() const {
  const uint64_t memory = host_memory_bytes();
  if (memory == 0) return unavailable("this machine's memory size is unknown");
  return memory;
}

Status CpuForward::forward(const StepBatch& batch, KvPool& kv, std::vector<float>* logits,
                           const LayerDoneCallback* on_layer_done) {
  if (profile_ != nullptr) last_lap_ = std::chrono::steady_clock::now();
  const int64_t tokens = batch.num_tokens;
  const int32_t hidden = config_.hidden_size;
  grow(x_, size_t(tokens) * hidden);
  grow(h_, size_t(tokens) * hidden);
  kc::embedding(pool_, weights_.embed_tokens, batch.token_ids, tokens, x_.data());
  if (config_.embedding_multiplier != 1.0f)
    kc::scale_in_place(pool_, x_.data(), config_.embedding_multiplier, tokens * hidden);
  lap(&CpuStepProfile::other_s);
  for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
    attention_block(layer, batch, kv);  // stores this layer's K/V, then attends
    if (on_layer_done != nullptr) (*on_layer_done)(layer);
    mlp_block(layer, tokens);
  }

  // Final norm and lm_head only for the rows whose logits are wanted.
  const auto wanted = int64_t(batch.logit_rows.size());
  logits->resize(size_t(wanted) * size_t(config_.vocab_size));
  if (wanted == 0) return Status::ok();
  for (int64_t i = 0; i < wanted; ++i) {
    std::copy_n(x_.data() + batch.logit_rows[size_t(i)] * hidden, hidden, h_.data() + i * hidden);
  }
  kc::rms_norm(pool_, h_.data(), weights_.final_norm.data(), wanted, hidden, config_.rms_norm_eps,
               h_.data());
  lap(&CpuStepProfile::other_s);
  kc::linear(pool_, h_.data(), wanted, weights_.lm_head, nullptr, logits->data());
  if (config_.logits_scaling != 1.0f) {
    kc::scale_in_place(pool_, logits->data(), 1.0f / config_.logits_scaling,
                       wanted * config_.vocab_size);
  }
  lap(&CpuStepProfile::projections_s);
  return Status::ok();
}

void CpuForward::attention_block(int32_t layer, const StepBatch& batch, KvPool& kv) {
  const auto& w = weights_.layers[size_t(layer)];
  const int64_t tokens = batch.num_tokens;
  const int32_t hidden = config_.hidden_size;
  const int32_t q_width = config_.num_heads * config_.head_dim;
  const int32_t kv_width = config_.num_kv_heads * config_.head_dim;
  auto bias = [](const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); };

  float* q = grow(q_, size_t(tokens) * q_width);
  float* k = grow(k_, size_t(tokens) * kv_width);
  float* v = grow(v_, size_t(tokens) * kv_width);
  float* attn = grow(attn_, size_t(tokens) * q_width);

  kc::rms_norm(pool_, x_.data(), w.input_norm.data(), tokens, hidden, config_.rms_norm_eps,
               h_.data());
  lap(&CpuStepProfile::other_s);
  const kc::LinearOutput qkv[] = {
      {w.q_proj, bias(w.q_bias), q}, {w.k_proj, bias(w.k_bias), k}, {w.v_proj, bias(w.v_bias), v}};
  kc::linear(pool_, h_.data(), tokens, qkv);
  lap(&CpuStepProfile::projections_s);
  if (config_.qk_norm) {
    kc::rms_norm(pool_, q, w.q_norm.data(), tokens * config_.num_heads, config_.head_dim,
                 config_.rms_norm_eps, q);
    kc::rms_norm(pool_, k, w.k_norm.data(), tokens * config_.num_kv_heads, config_.head_dim,
                 config_.rms_norm_eps, k);
  }
  if (config_.uses_rope(layer)) {
    kc::apply_rope(pool_, q, batch.positions, tokens, config_.num_heads, config_.head_dim,
                   inv_freq_.data());
    kc::apply_rope(pool_, k, batch.positions, tokens, config_.num_kv_heads, config_.head_dim,
                   inv_freq_.data());
  }
  lap(&CpuStepProfile::other_s);
  kc::store_kv(pool_, kv.layout(), kv.data(), layer, k, v, batch.slot_mapping, tokens);

  kc::PagedAttentionParams params;
  params.q = q;
  params.out = attn;
  params.kv_pool = kv.data();
  params.layout = kv.layout();
  params.layer = layer;
  params.num_heads = config_.num_heads;
  params.num_seqs = batch.num_seqs;
  params.query_start = batch.query_start;
  params.context_lens = batch.context_lens;
  params.block_tables = batch.block_tables;
  params.block_table_stride = batch.block_table_stride;
  params.scale = config_.attention_scale();
  params.window = config_.window_of(layer);
  kc::paged_attention(pool_, params);
  lap(&CpuStepProfile::attention_s);

  kc::linear(pool_, attn, tokens, w.o_proj, bias(w.o_bias), h_.data());
  lap(&CpuStepProfile::projections_s);
  add_to_residual(tokens);
  lap(&CpuStepProfile::other_s);
}

void CpuForward::add_to_residual(int64_t tokens) {
  const int64_t n = tokens * config_.hidden_size;
  if (config_.residual_multiplier != 1.0f)
    kc::scale_in_place(pool_, h_.data(), config_.residual_multiplier, n);
  kc::add_in_place(pool_, x_.data(), h_.data(), n);
}

void CpuForward::mlp_block(int32_t layer, int64_t tokens) {
  const auto& w = weights_.layers[size_t(layer)];
  const int32_t hidden = config_.hidden_size;
  const int32_t ffn = config_.intermediate_size;
  float* gate = grow(gate_, size_t(tokens) * ffn);
  float* up = grow(up_, size_t(tokens) * ffn);

  kc::rms_norm(pool_, x_.data(), w.post_attention_norm.data(), tokens, hidden, config_.rms_norm_eps,
               h_.data());
  lap(&CpuStepProfile::other_s);
  const kc::LinearOutput gate_up[] = {{w.gate_proj, nullptr, gate}, {w.up_proj, nullptr, up}};
  kc::linear(pool_, h_.data(), tokens, gate_up);
  lap(&CpuStepProfile::projections_s);
  kc::silu_and_mul(pool_, gate, up, tokens * ffn, gate);
  lap(&CpuStepProfile::other_s);
  kc::linear(pool_, gate, tokens, w.down_proj, nullptr, h_.data());
  lap(&CpuStepProfile::projections_s);
  add_to_residual(tokens);
  lap(&CpuStepProfile::other_s);
}

}  // namespace baton::engine
