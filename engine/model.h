// engine/model.h — the Llama-family forward pass over a paged KV cache.
//
// One call runs one scheduler step: any mix of prefill chunks and decode
// tokens from many sequences, concatenated into one [tokens, hidden] batch so
// every weight is read once per step. Attention reads each sequence's earlier
// context from the KV pool through its block table, which is what makes
// chunked prefill, prefix reuse and KV received from another node all the
// same case.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "common/kv_layout.h"
#include "common/status.h"
#include "engine/block_manager.h"
#include "engine/checkpoint.h"
#include "engine/kv_pool.h"
#include "kernels/cpu/thread_pool.h"

namespace baton::engine {

// One sequence's share of a step: the host-built plan the kernels consume.
struct StepSequence {
  std::span<const int32_t> token_ids;       // this step's new tokens
  int32_t start_position = 0;               // tokens of this sequence already in the cache
  const BlockTable* block_table = nullptr;  // must hold start_position + token_ids.size() slots
  bool wants_logits = false;                // logits of the last new token are returned
};

struct StepPlan {
  std::vector<StepSequence> sequences;
  int64_t num_tokens() const;
};

class LlamaModel {
 public:
  LlamaModel(const Checkpoint& checkpoint, kernels::cpu::ThreadPool& pool);

  const ModelConfig& config() const { return config_; }
  // The KV layout this model needs, for a pool of `num_blocks` blocks.
  KvLayout kv_layout(int32_t num_blocks, int32_t block_size, DType dtype) const;

  // Runs one step and writes logits [sequences wanting logits, vocab], in plan
  // order. K/V of every new token is stored in `kv`. Token ids outside the
  // vocabulary are an InvalidArgument error (nothing is computed).
  // `on_layer_done`, when given, is called with each layer's index as soon as
  // that layer's K/V of every token in the step is stored in `kv`, before the
  // next layer writes anything.
  Status forward(const StepPlan& plan, KvPool& kv, std::vector<float>* logits,
                 const std::function<void(int32_t layer)>* on_layer_done = nullptr);

 private:
  void attention_block(int32_t layer, int64_t tokens, KvPool& kv);
  void mlp_block(int32_t layer, int64_t tokens);

  const ModelConfig& config_;
  const ModelWeights& weights_;
  kernels::cpu::ThreadPool& pool_;
  std::vector<float> inv_freq_;  // [head_dim / 2]

  // Per-step scratch, grown on demand and reused: steps allocate nothing once warm.
  std::vector<float> x_;          // [tokens, hidden] residual stream
  std::vector<float> h_;          // [tokens, hidden] normed input / block output
  std::vector<float> q_;          // [tokens, heads * head_dim]
  std::vector<float> k_, v_;      // [tokens, kv_heads * head_dim]
  std::vector<float> attn_;       // [tokens, heads * head_dim]
  std::vector<float> gate_, up_;  // [tokens, intermediate]
  std::vector<int32_t> token_ids_, positions_, slot_mapping_;  // [tokens]
  std::vector<int32_t> query_start_;                           // [seqs + 1]
  std::vector<int32_t> context_lens_;                          // [seqs]
  std::vector<int32_t> block_tables_;                          // [seqs, stride]
  int32_t block_table_stride_ = 0;
  int32_t num_seqs_ = 0;
};

}  // namespace baton::engine
