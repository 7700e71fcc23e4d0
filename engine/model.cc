#include "engine/model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/linear.h"

namespace baton::engine {

namespace kc = kernels::cpu;

int64_t StepPlan::num_tokens() const {
  int64_t n = 0;
  for (const auto& s : sequences) n += int64_t(s.token_ids.size());
  return n;
}

LlamaModel::LlamaModel(const Checkpoint& checkpoint, kc::ThreadPool& pool)
    : config_(checkpoint.config()),
      weights_(checkpoint.weights()),
      pool_(pool),
      inv_freq_(rope_inv_freq(checkpoint.config())) {}

KvLayout LlamaModel::kv_layout(int32_t num_blocks, int32_t block_size, DType dtype) const {
  return KvLayout{.num_layers = config_.num_layers,
                  .num_blocks = num_blocks,
                  .block_size = block_size,
                  .num_kv_heads = config_.num_kv_heads,
                  .head_dim = config_.head_dim,
                  .dtype = dtype};
}

template <typename T>
static T* grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

Status LlamaModel::forward(const StepPlan& plan, KvPool& kv, std::vector<float>* logits,
                           const std::function<void(int32_t layer)>* on_layer_done) {
  const int64_t tokens = plan.num_tokens();
  const auto& layout = kv.layout();
  if (!layout.same_geometry(kv_layout(layout.num_blocks, layout.block_size, layout.dtype))) {
    return invalid_argument("KV pool geometry does not match the model");
  }
  const int32_t hidden = config_.hidden_size;

  // Flatten the plan into the arrays the kernels read.
  num_seqs_ = int32_t(plan.sequences.size());
  block_table_stride_ = 1;
  for (const auto& s : plan.sequences) {
    block_table_stride_ = std::max(block_table_stride_, int32_t(s.block_table->blocks().size()));
  }
  grow(token_ids_, size_t(tokens));
  grow(positions_, size_t(tokens));
  grow(slot_mapping_, size_t(tokens));
  grow(query_start_, size_t(num_seqs_) + 1);
  grow(context_lens_, size_t(num_seqs_));
  grow(block_tables_, size_t(num_seqs_) * size_t(block_table_stride_));
  int32_t row = 0;
  for (int32_t s = 0; s < num_seqs_; ++s) {
    const auto& seq = plan.sequences[size_t(s)];
    const auto n = int32_t(seq.token_ids.size());
    const int32_t end = seq.start_position + n;
    if (n == 0) return invalid_argument("a step sequence has no tokens");
    if (seq.block_table->blocks_needed(end) > int32_t(seq.block_table->blocks().size())) {
      return internal_error("block table too short for the step's tokens");
    }
    query_start_[size_t(s)] = row;
    context_lens_[size_t(s)] = end;
    const auto& blocks = seq.block_table->blocks();
    std::copy(blocks.begin(), blocks.end(),
              block_tables_.begin() + ptrdiff_t(s) * block_table_stride_);
    for (int32_t j = 0; j < n; ++j, ++row) {
      int32_t id = seq.token_ids[size_t(j)];
      if (id < 0 || id >= config_.vocab_size) {
        return invalid_argument("token id " + std::to_string(id) +
                                " is outside the vocabulary of size " +
                                std::to_string(config_.vocab_size));
      }
      token_ids_[size_t(row)] = id;
      positions_[size_t(row)] = seq.start_position + j;
      slot_mapping_[size_t(row)] = seq.block_table->slot_of(seq.start_position + j);
    }
  }
  query_start_[size_t(num_seqs_)] = row;

  grow(x_, size_t(tokens) * hidden);
  grow(h_, size_t(tokens) * hidden);
  kc::embedding(pool_, weights_.embed_tokens, token_ids_.data(), tokens, x_.data());
  for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
    attention_block(layer, tokens, kv);  // stores this layer's K/V, then attends
    if (on_layer_done != nullptr) (*on_layer_done)(layer);
    mlp_block(layer, tokens);
  }

  // Final norm and lm_head only for the rows whose logits are wanted.
  std::vector<int64_t> wanted_rows;
  for (int32_t s = 0; s < num_seqs_; ++s) {
    if (plan.sequences[size_t(s)].wants_logits)
      wanted_rows.push_back(query_start_[size_t(s) + 1] - 1);
  }
  const auto wanted = int64_t(wanted_rows.size());
  logits->resize(size_t(wanted) * size_t(config_.vocab_size));
  if (wanted == 0) return Status::ok();
  for (int64_t i = 0; i < wanted; ++i) {
    std::copy_n(x_.data() + wanted_rows[size_t(i)] * hidden, hidden, h_.data() + i * hidden);
  }
  kc::rms_norm(pool_, h_.data(), weights_.final_norm.data(), wanted, hidden, config_.rms_norm_eps,
               h_.data());
  kc::linear(pool_, h_.data(), wanted, weights_.lm_head, nullptr, logits->data());
  return Status::ok();
}

void LlamaModel::attention_block(int32_t layer, int64_t tokens, KvPool& kv) {
  const auto& w = weights_.layers[size_t(layer)];
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
  const kc::LinearOutput qkv[] = {
      {w.q_proj, bias(w.q_bias), q}, {w.k_proj, bias(w.k_bias), k}, {w.v_proj, bias(w.v_bias), v}};
  kc::linear(pool_, h_.data(), tokens, qkv);
  kc::apply_rope(pool_, q, positions_.data(), tokens, config_.num_heads, config_.head_dim,
                 inv_freq_.data());
  kc::apply_rope(pool_, k, positions_.data(), tokens, config_.num_kv_heads, config_.head_dim,
                 inv_freq_.data());
  kc::store_kv(pool_, kv.layout(), kv.data(), layer, k, v, slot_mapping_.data(), tokens);

  kc::PagedAttentionParams params;
  params.q = q;
  params.out = attn;
  params.kv_pool = kv.data();
  params.layout = kv.layout();
  params.layer = layer;
  params.num_heads = config_.num_heads;
  params.num_seqs = num_seqs_;
  params.query_start = query_start_.data();
  params.context_lens = context_lens_.data();
  params.block_tables = block_tables_.data();
  params.block_table_stride = block_table_stride_;
  params.scale = 1.0f / std::sqrt(float(config_.head_dim));
  kc::paged_attention(pool_, params);

  kc::linear(pool_, attn, tokens, w.o_proj, nullptr, h_.data());
  kc::add_in_place(pool_, x_.data(), h_.data(), tokens * hidden);
}

void LlamaModel::mlp_block(int32_t layer, int64_t tokens) {
  const auto& w = weights_.layers[size_t(layer)];
  const int32_t hidden = config_.hidden_size;
  const int32_t ffn = config_.intermediate_size;
  float* gate = grow(gate_, size_t(tokens) * ffn);
  float* up = grow(up_, size_t(tokens) * ffn);

  kc::rms_norm(pool_, x_.data(), w.post_attention_norm.data(), tokens, hidden, config_.rms_norm_eps,
               h_.data());
  const kc::LinearOutput gate_up[] = {{w.gate_proj, nullptr, gate}, {w.up_proj, nullptr, up}};
  kc::linear(pool_, h_.data(), tokens, gate_up);
  kc::silu_and_mul(pool_, gate, up, tokens * ffn, gate);
  kc::linear(pool_, gate, tokens, w.down_proj, nullptr, h_.data());
  kc::add_in_place(pool_, x_.data(), h_.data(), tokens * hidden);
}

}  // namespace baton::engine
