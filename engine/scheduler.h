// engine/scheduler.h — continuous batching with chunked prefill.
//
// Each step packs decode tokens of running sequences first (one each), then
// prefill chunks of running and waiting sequences, under a per-step token
// budget. Sequences join and leave the batch at any step. When KV blocks run
// out, waiting sequences wait; a running sequence that needs a block preempts
// the most recently admitted running one, whose blocks are freed and whose
// tokens are recomputed when it is readmitted (preempt by recompute).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "common/status.h"
#include "engine/block_manager.h"
#include "engine/kv_pool.h"
#include "engine/model.h"
#include "engine/sequence.h"

namespace baton::engine {

struct SchedulerConfig {
  int32_t max_num_seqs = 256;             // running sequences at once
  int32_t max_num_batched_tokens = 2048;  // token budget of one step
  int32_t max_model_len = 0;              // prompt + output limit; 0: the model's maximum. Never
                                          // more than the pool holds.
};

// What one step produced for one sequence.
struct StepOutput {
  int64_t sequence_id;
  int32_t token;  // the token sampled this step
  FinishReason finish_reason;
};

struct SchedulerStats {
  int32_t running = 0;
  int32_t waiting = 0;
  int32_t free_blocks = 0;
  int32_t total_blocks = 0;
  int32_t peak_used_blocks = 0;
  int64_t preemptions = 0;
};

// What the last step computed: prompt positions, positions recomputed after
// a preemption, and newly generated positions.
struct StepTokenCounts {
  int64_t prompt_tokens = 0;
  int64_t recomputed_tokens = 0;
  int64_t generated_tokens = 0;
};

class Scheduler {
 public:
  Scheduler(LlamaModel& model, KvPool& kv, const SchedulerConfig& config);

  // Queues a request. Errors: empty prompt, ids outside the vocabulary, a
  // prompt at or over max_model_len (which never exceeds the pool's capacity).
  Result<int64_t> add(std::vector<int32_t> prompt, const GenerationOptions& options);
  // Finishes a sequence now (aborted) and frees its blocks. False if unknown.
  bool abort(int64_t sequence_id);

  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  // Runs one step: schedules, runs the model, samples, retires finished ones.
  Status step(std::vector<StepOutput>* outputs);

  // Finished sequences, handed over once (the scheduler forgets them).
  std::vector<std::unique_ptr<Sequence>> take_finished();
  SchedulerStats stats() const;
  const StepTokenCounts& last_step() const { return last_step_; }
  int32_t max_model_len() const { return max_model_len_; }

 private:
  struct Scheduled {
    Sequence* sequence;
    int32_t num_tokens;
  };
  std::vector<Scheduled> schedule();
  bool reserve_or_preempt(Sequence& sequence, int32_t tokens);
  void preempt(Sequence& victim);
  void sample(Sequence& sequence, const float* logits, std::vector<StepOutput>* outputs);
  void retire_finished();

  LlamaModel& model_;
  KvPool& kv_;
  SchedulerConfig config_;
  int32_t max_model_len_;
  BlockManager blocks_;
  int64_t next_id_ = 0;
  int64_t preemptions_ = 0;
  int32_t peak_used_blocks_ = 0;
  StepTokenCounts last_step_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order
  std::vector<std::unique_ptr<Sequence>> finished_;
  std::vector<int32_t> step_tokens_;  // backing store of the plan's token spans
  std::vector<float> logits_;
};

}  // namespace baton::engine
