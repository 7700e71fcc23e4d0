// engine/scheduler.h — continuous batching with chunked prefill.
//
// Each step packs decode tokens of running sequences first (one each), then
// prefill chunks of running and waiting sequences, under a per-step token
// budget. Sequences join and leave the batch at any step. When KV blocks run
// out, waiting sequences wait; a running sequence that needs a block preempts
// the most recently admitted running one, whose blocks are freed and whose
// tokens are recomputed when it is readmitted (preempt by recompute).
//
// Disaggregated serving: a prefill node runs requests with max_tokens 1 and
// retain_blocks, streams each layer's KV out as a layer observer reports it,
// and releases the blocks when the transfer completes. A decode node reserves
// blocks for the prompt (reserve_remote), lets the prefill node write them,
// then activates the sequence with the prefill node's first token.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/log_throttle.h"
#include "common/status.h"
#include "engine/block_manager.h"
#include "engine/kv_pool.h"
#include "engine/model.h"
#include "engine/sequence.h"
#include "engine/ssd_kv_store.h"
#include "engine/tiered_prefix_cache.h"
#include "engine/window_budget.h"

namespace baton::engine {

struct SchedulerConfig {
  int32_t max_num_seqs = 256;             // running sequences at once
  int32_t max_num_batched_tokens = 2048;  // token budget of one step
  int32_t max_model_len = 0;              // prompt + output limit; 0: the model's maximum. Never
                                          // more than the pool holds, unless every layer has a
                                          // sliding window (tokens_held_at_once).
  // Full blocks a sequence computed stay findable by their tokens after it
  // ends, and a sequence admitted later that starts with the same tokens
  // shares them instead of computing them (block_manager.h). A prefill
  // node's sequences (retain_blocks) too: their shared blocks hold every
  // layer's K/V, so the transfer sends them with the computed ones.
  bool enable_prefix_caching = true;
};

// What one step produced for one sequence.
struct StepOutput {
  int64_t sequence_id;
  int32_t token;  // the token sampled this step
  FinishReason finish_reason;
  // With the sequence's first token: its queue and prefill seconds
  // (Sequence); -1 with every later one.
  double queue_seconds = -1;
  double prefill_seconds = -1;
};

struct SchedulerStats {
  int32_t running = 0;
  int32_t waiting = 0;
  int32_t awaiting = 0;        // reserved by reserve_remote, not yet activated
  int32_t restoring = 0;       // waiting or awaiting, whose blocks the SSD tier is reading
  int64_t waiting_tokens = 0;  // prompt tokens not yet computed: waiting sequences and
                               // running ones still in (chunked) prefill
  int32_t free_blocks = 0;     // blocks of awaiting and retained sequences count as used
  int32_t total_blocks = 0;
  int32_t peak_used_blocks = 0;
  int64_t preemptions = 0;
  int32_t cached_blocks = 0;          // registered in the prefix cache, held or free
  int64_t prefix_query_tokens = 0;    // prompt tokens looked up at first admission or reservation
  int64_t prefix_hit_tokens = 0;      // of those, found there and not computed
  int64_t prefix_ssd_hit_tokens = 0;  // of the hits, read back from the SSD tier
};

// What the last step computed: prompt positions, positions recomputed after
// a preemption, and newly generated positions.
struct StepTokenCounts {
  int64_t prompt_tokens = 0;
  int64_t recomputed_tokens = 0;
  int64_t generated_tokens = 0;
};

// One sequence's share of a step, as a layer observer sees it: positions
// [start_position, start_position + num_tokens) were computed in this step.
struct StepSequenceInfo {
  int64_t sequence_id;
  int32_t start_position;
  int32_t num_tokens;
};

// Called from inside the forward pass, on the engine thread, after layer
// `layer`'s K/V of every token in the step is stored in the pool (and before
// the next layer writes anything). Layers come in order 0..num_layers-1, once
// per step.
using LayerObserver = std::function<void(int32_t layer, std::span<const StepSequenceInfo> step)>;
// Whether a step's layers are to be reported to the observer.
using StepFilter = std::function<bool(std::span<const StepSequenceInfo> step)>;

class Scheduler {
 public:
  Scheduler(LlamaModel& model, KvPool& kv, const SchedulerConfig& config);

  // Queues a request. Errors: empty prompt, ids outside the vocabulary, a
  // prompt at or over max_model_len (which never exceeds the pool's capacity).
  Result<int64_t> add(std::vector<int32_t> prompt, const GenerationOptions& options);
  // Finishes a queued, running or awaiting sequence now (aborted) and frees
  // its blocks, retain_blocks or not. False if unknown (or already finished).
  bool abort(int64_t sequence_id);
  // Aborts a reservation (reserve_remote) to be made again later, as if it
  // had not been made: its prefix lookup is no longer counted. False if it
  // is not one awaiting its KV.
  bool withdraw_reservation(int64_t sequence_id);

  // Reserves blocks for the whole prompt of a request whose KV another node
  // will write, without scheduling it. Validation as add(); ResourceExhausted
  // (the message says how many blocks are needed and free) when the free
  // blocks do not cover the prompt now: nothing is reserved then. The
  // sequence is "awaiting KV": never scheduled, never preempted. With the
  // prefix cache on, its first registered_blocks blocks are shared cached
  // ones that already hold the prompt's KV, or blocks the SSD tier is
  // reading it into: the other node writes only the blocks after them.
  Result<int64_t> reserve_remote(std::vector<int32_t> prompt, const GenerationOptions& options);
  // The blocks of `prompt`'s KV that another node would write into a
  // reservation made now (those after the cached prefix and the blocks its
  // sliding windows let go): what a staged pool's transfer of it needs in
  // staging slots. An estimate: the reservation itself may restore fewer
  // blocks from SSD than it holds (one finds no room, or a key is gone) and
  // so need more, or, restoring none, let its windows' blocks go and need
  // fewer.
  int32_t blocks_to_receive(const std::vector<int32_t>& prompt, const GenerationOptions& options);
  // A queued, running or awaiting sequence, or nullptr (finished ones are not found).
  const Sequence* find(int64_t id) const;
  // The whole prompt's KV is in the reserved blocks, and the prefill node
  // sampled `first_token` after `rng_draws` draws of the generator. The
  // sequence joins the running batch with num_computed = prompt length and
  // output = {first_token} (generator advanced by rng_draws). If that token
  // already finishes it (stop id, EOS unless ignore_eos, max_tokens 1,
  // max_model_len), it finishes now and take_finished() hands it over.
  // Errors: NotFound for an unknown id, InvalidArgument for a sequence not
  // awaiting KV or a token outside the vocabulary (the sequence stays awaiting).
  // `first_logprobs`: the prefill node's log-probabilities of that token, when
  // the request asked for them (else a NaN placeholder keeps one entry per token).
  // Waits for the SSD tier's reads of the reservation's blocks; blocks they
  // failed to bring back are computed here, from the first such one on.
  Result<StepOutput> activate_remote(int64_t id, int32_t first_token, uint64_t rng_draws,
                                     const OutputLogprobs* first_logprobs = nullptr);

  // Frees the blocks a finished retain_blocks sequence kept (no-op if none).
  // Call it before dropping such a sequence, or its blocks stay in use.
  void release_blocks(Sequence& finished);

  // Called per layer from inside the forward pass of every step that
  // `wanted` says yes to (empty: every step); empty observer: none. A
  // device backend waits for each layer it reports, so a step no one
  // watches is better not reported.
  void set_layer_observer(LayerObserver observer, StepFilter wanted = {}) {
    layer_observer_ = std::move(observer);
    layer_filter_ = std::move(wanted);
  }

  // Queued or running sequences exist (awaiting ones need no steps), or
  // reads from the SSD tier that a step must land (an aborted sequence's).
  bool has_work() const {
    return !running_.empty() || !waiting_.empty() || prefix_cache_.restoring();
  }
  // Runs one step: schedules, runs the model, samples, retires finished ones.
  // A step that can schedule nothing because awaiting sequences hold the
  // blocks it needs does nothing and returns OK (last_step() is all zero).
  // A step whose forward pass fails leaves blocks registered in the prefix
  // cache (at scheduling) unwritten: every later step returns that error.
  Status step(std::vector<StepOutput>* outputs);

  // Finished sequences, handed over once (the scheduler forgets them).
  std::vector<std::unique_ptr<Sequence>> take_finished();
  SchedulerStats stats() const;
  const StepTokenCounts& last_step() const { return last_step_; }
  int32_t max_model_len() const { return max_model_len_; }
  // ModelConfig::kv_window of the model: 0 unless every layer has a window.
  int32_t kv_window() const { return kv_window_; }
  const BlockManager& block_manager() const { return blocks_; }

  // The prefix cache's SSD tier: blocks evicted from the pool are saved
  // there, and a prompt's leading blocks found there (after those in the
  // pool) are read back instead of computed. Needs prefix caching on.
  // With `staging`, the pool is a device's (TieredPrefixCache::attach_ssd_store).
  Status attach_ssd_store(std::unique_ptr<SsdKvStore> store,
                          std::unique_ptr<PoolCopier> staging = nullptr,
                          SsdStagingSlots slots = {}) {
    return prefix_cache_.attach_ssd_store(std::move(store), std::move(staging), slots);
  }
  const SsdKvStore* ssd_store() const { return prefix_cache_.ssd_store(); }

 private:
  struct Scheduled {
    Sequence* sequence;
    int32_t num_tokens;
  };
  std::vector<Scheduled> schedule();
  // Admits waiting sequences in arrival order into `scheduled` while blocks
  // and `budget` last, starting SSD restores and passing sequences whose
  // restores are in flight.
  void admit_waiting(std::vector<Scheduled>& scheduled, int32_t& budget);
  bool reserve_or_preempt(Sequence& sequence, int32_t tokens);
  // Lands the SSD tier's restores that finished (`wait`: waits for one
  // first) and moves the queued sequences whose restores landed to the head
  // of the queue.
  void land_restores(bool wait);
  // A queued or awaiting sequence, or nullptr.
  Sequence* find_queued(int64_t id);
  void preempt(Sequence& victim);
  Status validate(const std::vector<int32_t>& prompt, const GenerationOptions& options) const;
  void sample(Sequence& sequence, const float* logits, std::vector<StepOutput>* outputs);
  // Whether a step of `num_tokens` of the sequence returns the logits of
  // every token: it asked for prompt log-probabilities not yet scored.
  bool wants_prompt_logits(const Sequence& sequence, int32_t num_tokens) const;
  // Records the log-probabilities of the prompt token at `position` from the
  // logits of the position before, once.
  void score_prompt_token(Sequence& sequence, int32_t position, const float* logits);
  // Appends a generated token and sets the finish reason it causes, if any.
  void append_token(Sequence& sequence, int32_t token);
  void retire_finished();
  void note_peak_usage();
  // Sliding windows: gives back the blocks of `seq` wholly before its next
  // step's windows (a prefill node's, only before what it sends).
  void release_behind_windows(Sequence& seq);
  // The window the prefix cache matches `seq`'s prompt with (none for a
  // prefill node's, which keeps the blocks it sends from the start).
  int32_t window_of(const Sequence& seq) const {
    return seq.options.retain_blocks ? 0 : kv_window_;
  }
  // Whether a decode node's reservation of a `tokens`-token prompt reads
  // its prefix from the SSD tier: only where no window leaves a block of
  // the prompt behind (the restore would hold those, and the transfer
  // would carry every block after them, more than tokens_sent_at_most).
  bool restores_remote_prefix(int32_t tokens) const;

  LlamaModel& model_;
  KvPool& kv_;
  SchedulerConfig config_;
  int32_t max_model_len_;
  // Where every layer has a sliding window, the longest of them: a
  // sequence's blocks wholly before that many positions back are read by no
  // later step and go back to the pool as it runs. 0: some layer attends to
  // everything.
  int32_t kv_window_ = 0;
  BlockManager blocks_;
  TieredPrefixCache prefix_cache_;  // over blocks_ and the SSD tier
  int64_t next_id_ = 0;
  int64_t preemptions_ = 0;
  int32_t peak_used_blocks_ = 0;
  // The last admission left a waiting sequence for want of free blocks or
  // of room in the batch: reservations wait until it is admitted
  // (reserve_remote).
  bool admission_left_waiting_ = false;
  StepTokenCounts last_step_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;   // admission order
  std::vector<std::unique_ptr<Sequence>> awaiting_;  // reserve_remote order
  std::vector<std::unique_ptr<Sequence>> finished_;
  std::vector<int32_t> step_tokens_;  // backing store of the plan's token spans
  // Logits of the last step's rows; more than this many floats (64 MiB)
  // are not kept past a step that needs a quarter of them.
  static constexpr size_t kKeptLogitsFloats = size_t(16) << 20;
  std::vector<float> logits_;
  std::vector<float> adjusted_logits_;  // one row, when penalties or a bias change it
  LogThrottle non_finite_logits_log_{std::chrono::seconds(10)};
  // Finished retain_blocks sequences whose blocks are not released yet.
  int64_t retained_sequences_ = 0;
  LayerObserver layer_observer_;
  StepFilter layer_filter_;
  Status failure_;  // a failed forward pass's error, returned by every later step
  std::vector<StepSequenceInfo> step_info_;  // what the observer is shown
};

}  // namespace baton::engine
