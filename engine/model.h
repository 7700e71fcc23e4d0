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
#include <memory>
#include <span>
#include <vector>

#include "common/kv_layout.h"
#include "common/status.h"
#include "engine/block_manager.h"
#include "engine/checkpoint.h"
#include "engine/forward_backend.h"
#include "engine/kv_pool.h"
#include "kernels/cpu/thread_pool.h"

namespace baton::engine {

// One sequence's share of a step: the host-built plan the kernels consume.
struct StepSequence {
  std::span<const int32_t> token_ids;       // this step's new tokens
  int32_t start_position = 0;               // tokens of this sequence already in the cache
  const BlockTable* block_table = nullptr;  // must hold start_position + token_ids.size() slots
  bool wants_logits = false;                // logits of the last new token are returned
  // Logits of every new token are returned, in order (prompt
  // log-probabilities); wants_logits' row is then the last of them.
  bool wants_all_logits = false;
};

struct StepPlan {
  std::vector<StepSequence> sequences;
  int64_t num_tokens() const;
};

class LlamaModel {
 public:
  // Runs on `backend` (engine/forward_backend.h).
  LlamaModel(const Checkpoint& checkpoint, std::unique_ptr<ForwardBackend> backend);
  // Runs on the CPU backend over `pool`, which must outlive the model.
  LlamaModel(const Checkpoint& checkpoint, kernels::cpu::ThreadPool& pool);

  const ModelConfig& config() const { return config_; }
  ForwardBackend& backend() { return *backend_; }
  // The KV layout this model needs on its backend, for a pool of `num_blocks` blocks.
  KvLayout kv_layout(int32_t num_blocks, int32_t block_size, DType dtype) const;

  // Runs one step and writes logits [rows, vocab], in plan order: one row per
  // sequence wanting logits, or one per new token of a sequence wanting all. K/V of every new token
  // is stored in `kv`. Token ids outside the vocabulary are an InvalidArgument error (nothing is
  // computed). `on_layer_done`, when given, is called with each layer's index as soon as that
  // layer's K/V of every token in the step is stored in `kv`, before the next layer writes
  // anything.
  Status forward(const StepPlan& plan, KvPool& kv, std::vector<float>* logits,
                 const LayerDoneCallback* on_layer_done = nullptr);

 private:
  const ModelConfig& config_;
  std::unique_ptr<ForwardBackend> backend_;

  // The step flattened into the arrays every backend reads; reused, so
  // steps allocate nothing once warm.
  std::vector<int32_t> token_ids_, positions_, slot_mapping_;  // [tokens]
  std::vector<int32_t> query_start_;                           // [seqs + 1]
  std::vector<int32_t> context_lens_;                          // [seqs]
  std::vector<int32_t> block_tables_;                          // [seqs, stride]
  std::vector<int64_t> logit_rows_;                            // [seqs wanting logits]
};

}  // namespace baton::engine
