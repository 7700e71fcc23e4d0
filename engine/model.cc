#include "engine/model.h"

#include <algorithm>
#include <string>

#include "engine/cpu_forward.h"

namespace baton::engine {

int64_t StepPlan::num_tokens() const {
  int64_t n = 0;
  for (const auto& s : sequences) n += int64_t(s.token_ids.size());
  return n;
}

LlamaModel::LlamaModel(const Checkpoint& checkpoint, std::unique_ptr<ForwardBackend> backend)
    : config_(checkpoint.config()), backend_(std::move(backend)) {}

LlamaModel::LlamaModel(const Checkpoint& checkpoint, kernels::cpu::ThreadPool& pool)
    : LlamaModel(checkpoint, std::make_unique<CpuForward>(checkpoint, pool)) {}

KvLayout LlamaModel::kv_layout(int32_t num_blocks, int32_t block_size, DType dtype) const {
  return kv_layout_of(config_, block_size, dtype, backend_->kv_key_order(), num_blocks);
}

Status LlamaModel::forward(const StepPlan& plan, KvPool& kv, std::vector<float>* logits,
                           const LayerDoneCallback* on_layer_done) {
  const int64_t tokens = plan.num_tokens();
  const auto& layout = kv.layout();
  if (!layout.same_geometry(kv_layout(layout.num_blocks, layout.block_size, layout.dtype))) {
    return invalid_argument("KV pool geometry does not match the model");
  }

  // Flatten the plan into the arrays the kernels read.
  const auto num_seqs = int32_t(plan.sequences.size());
  int32_t stride = 1;
  for (const auto& s : plan.sequences) {
    stride = std::max(stride, int32_t(s.block_table->blocks().size()));
  }
  token_ids_.resize(size_t(tokens));
  positions_.resize(size_t(tokens));
  slot_mapping_.resize(size_t(tokens));
  query_start_.resize(size_t(num_seqs) + 1);
  context_lens_.resize(size_t(num_seqs));
  block_tables_.assign(size_t(num_seqs) * size_t(stride), 0);
  logit_rows_.clear();
  int32_t row = 0;
  for (int32_t s = 0; s < num_seqs; ++s) {
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
    std::copy(blocks.begin(), blocks.end(), block_tables_.begin() + ptrdiff_t(s) * stride);
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
    if (seq.wants_all_logits) {
      for (int32_t r = row - n; r < row; ++r) logit_rows_.push_back(r);
    } else if (seq.wants_logits) {
      logit_rows_.push_back(row - 1);
    }
  }
  query_start_[size_t(num_seqs)] = row;

  const StepBatch batch{.num_tokens = tokens,
                        .num_seqs = num_seqs,
                        .token_ids = token_ids_.data(),
                        .positions = positions_.data(),
                        .slot_mapping = slot_mapping_.data(),
                        .query_start = query_start_.data(),
                        .context_lens = context_lens_.data(),
                        .block_tables = block_tables_.data(),
                        .block_table_stride = stride,
                        .logit_rows = logit_rows_};
  return backend_->forward(batch, kv, logits, on_layer_done);
}

}  // namespace baton::engine
