#include "engine/scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/check.h"
#include "kernels/cpu/sampling.h"

namespace baton::engine {
namespace {

constexpr uint64_t kMaxFirstTokenDraws = 64;

}  // namespace

Scheduler::Scheduler(LlamaModel& model, KvPool& kv, const SchedulerConfig& config)
    : model_(model),
      kv_(kv),
      config_(config),
      max_model_len_(config.max_model_len > 0 ? config.max_model_len
                                              : model.config().max_position_embeddings),
      kv_window_(model.config().kv_window()),
      blocks_(kv.layout().num_blocks),
      prefix_cache_(blocks_, kv, config.enable_prefix_caching) {
  // A sequence can never hold more tokens than the whole pool: past that it
  // would preempt itself forever. It ends with "length" there instead, and
  // users are told at start-up. With a sliding window on every layer it
  // holds only the window and a step's tokens, however long it runs.
  if (max_model_len_ > model.config().max_position_embeddings) {
    // Allowed (the rotary angles are formed for any position), but past
    // what the model was trained on; a cluster's YAML refuses it.
    spdlog::warn(
        "engine: engine.max_model_len {} is past the model's max_position_embeddings {}: "
        "positions beyond it were never trained",
        max_model_len_, model.config().max_position_embeddings);
  }
  const int32_t block_size = kv.layout().block_size;
  const int64_t pool_tokens = int64_t(kv.layout().num_blocks) * block_size;
  if (pool_tokens <
      tokens_held_at_once(max_model_len_, kv_window_, config.max_num_batched_tokens, block_size)) {
    spdlog::warn(
        "engine: context length {} tokens, the KV pool's whole capacity, not {} ({}): raise "
        "engine.kv_cache_bytes, kv_cache_blocks or memory_fraction for longer sequences",
        pool_tokens, max_model_len_,
        config.max_model_len > 0 ? "engine.max_model_len" : "the model's max_position_embeddings");
    max_model_len_ = int32_t(pool_tokens);
  }
}

void Scheduler::release_behind_windows(Sequence& seq) {
  if (kv_window_ <= 0) return;
  // The next step's first query sits at num_computed and sees the last
  // kv_window_ positions. A prefill node keeps the blocks it sends.
  int32_t first_needed = seq.num_computed - kv_window_ + 1;
  if (seq.options.retain_blocks) {
    first_needed =
        std::min(first_needed, seq.options.retained_from_block * seq.block_table.block_size());
  }
  seq.block_table.release_before(blocks_, first_needed);
}

bool Scheduler::restores_remote_prefix(int32_t tokens) const {
  return kv_window_ <= 0 || tokens - kv_window_ + 1 <= 0;
}

Status Scheduler::validate(const std::vector<int32_t>& prompt,
                           const GenerationOptions& options) const {
  const int32_t vocab = model_.config().vocab_size;
  if (prompt.empty()) return invalid_argument("the prompt is empty");
  for (int32_t id : prompt) {
    if (id < 0 || id >= vocab) {
      return invalid_argument("prompt token id " + std::to_string(id) +
                              " is outside the vocabulary of size " + std::to_string(vocab));
    }
  }
  if (int64_t(prompt.size()) >= max_model_len_) {
    return invalid_argument("the prompt has " + std::to_string(prompt.size()) +
                            " tokens; this model's maximum context length is " +
                            std::to_string(max_model_len_) + " tokens");
  }
  if (options.max_tokens < 1) return invalid_argument("max_tokens must be at least 1");
  // Written so that NaN fails every check: it compares false.
  const kernels::cpu::SamplingParams& s = options.sampling;
  if (!(s.temperature >= 0 && std::isfinite(s.temperature))) {
    return invalid_argument("temperature must be a finite number >= 0");
  }
  if (!(s.top_p > 0 && s.top_p <= 1)) return invalid_argument("top_p must be in (0, 1]");
  if (!(s.min_p >= 0 && s.min_p <= 1)) return invalid_argument("min_p must be in [0, 1]");
  const kernels::cpu::LogitsAdjustments& a = options.adjustments;
  if (!(a.repetition_penalty > 0 && std::isfinite(a.repetition_penalty))) {
    return invalid_argument("repetition_penalty must be a finite number > 0");
  }
  if (!std::isfinite(a.presence_penalty) || !std::isfinite(a.frequency_penalty)) {
    return invalid_argument("presence_penalty and frequency_penalty must be finite numbers");
  }
  for (const auto& [id, bias] : a.logit_bias) {
    if (!std::isfinite(bias)) {
      return invalid_argument("logit_bias of token " + std::to_string(id) +
                              " must be a finite number");
    }
  }
  if (options.logprobs < 0) return invalid_argument("logprobs must be >= 0");
  if (options.prompt_logprobs < -1) return invalid_argument("prompt_logprobs must be >= -1");
  return Status::ok();
}

Result<int64_t> Scheduler::add(std::vector<int32_t> prompt, const GenerationOptions& options) {
  BATON_RETURN_IF_ERROR(validate(prompt, options));
  const int32_t block_size = kv_.layout().block_size;
  int64_t id = next_id_++;
  waiting_.push_back(std::make_unique<Sequence>(id, std::move(prompt), options, block_size));
  return id;
}

Result<int64_t> Scheduler::reserve_remote(std::vector<int32_t> prompt,
                                          const GenerationOptions& options) {
  BATON_RETURN_IF_ERROR(validate(prompt, options));
  // Reserved sequences join the batch when their KV lands: they count
  // against max_num_seqs from now on. And while a sequence waiting here
  // (a preempted one, a prompt computed here) was left by the last
  // admission for want of free blocks or of room in the batch, what frees
  // up goes to it first: a stream of small reservations could starve it
  // otherwise.
  if (int32_t(running_.size() + awaiting_.size()) >= config_.max_num_seqs) {
    return resource_exhausted("max_num_seqs (" + std::to_string(config_.max_num_seqs) +
                              ") sequences are running or awaiting their KV");
  }
  if (admission_left_waiting_ && !waiting_.empty())
    return resource_exhausted("a sequence waiting here goes first");
  // The id is used up even if the reservation fails below: a restore it
  // started or joined still names it, and must not settle a later sequence.
  auto seq =
      std::make_unique<Sequence>(next_id_++, std::move(prompt), options, kv_.layout().block_size);
  const auto tokens = int32_t(seq->prompt.size());
  // The prefix the cache holds is not transferred: the sequence shares it,
  // and the part the SSD tier holds is read while the prefill node computes
  // (only where no window leaves a block of the prompt behind: a restore
  // holds every block until it lands, and what its blocks do not cover
  // travels whole).
  prefix_cache_.share_prefix(*seq, window_of(*seq));
  if (restores_remote_prefix(tokens)) prefix_cache_.start_remote_restore(*seq);
  // Sliding windows: the prompt's leading blocks that no window of the first
  // decode step (at position `tokens`) reaches are never held, and the
  // prefill node does not send them: shared ones go back at once, the rest
  // are skipped. Not while the SSD tier reads into the sequence's blocks: a
  // block given back must not be written.
  if (kv_window_ > 0 && !seq->options.retain_blocks && !seq->ssd_restoring) {
    seq->block_table.release_before(blocks_, tokens - kv_window_ + 1);
    const int32_t first_kept = first_block_in_window(tokens, kv_window_, kv_.layout().block_size);
    const auto held = int32_t(seq->block_table.blocks().size());
    if (first_kept > held) seq->block_table.skip(first_kept - held);
  }
  const int32_t needed =
      seq->block_table.blocks_needed(tokens) - int32_t(seq->block_table.blocks().size());
  if (needed > blocks_.num_free()) {
    seq->block_table.release(blocks_);
    return resource_exhausted("the KV of a " + std::to_string(tokens) + "-token prompt needs " +
                              std::to_string(needed) + " blocks; " +
                              std::to_string(blocks_.num_free()) + " of " +
                              std::to_string(blocks_.num_blocks()) + " are free");
  }
  BATON_RETURN_IF_ERROR(seq->block_table.reserve(blocks_, tokens - seq->block_table.num_tokens()));
  prefix_cache_.count_lookup(*seq);
  seq->awaiting_kv = true;
  const int64_t id = seq->id;
  awaiting_.push_back(std::move(seq));
  note_peak_usage();
  return id;
}

int32_t Scheduler::blocks_to_receive(const std::vector<int32_t>& prompt,
                                     const GenerationOptions& options) {
  Sequence probe(-1, prompt, options, kv_.layout().block_size);
  const auto tokens = int32_t(prompt.size());
  const TieredPrefixCache::CachedPrefix cached =
      prefix_cache_.cached_prefix_blocks(probe, window_of(probe));
  // As reserve_remote: the SSD tier is read only where no window leaves a
  // block of the prompt behind, and no block is held before the windows.
  const int32_t on_ssd = restores_remote_prefix(tokens) ? cached.on_ssd : 0;
  int32_t released = 0;
  if (kv_window_ > 0 && !options.retain_blocks && on_ssd == 0)
    released = first_block_in_window(tokens, kv_window_, probe.block_table.block_size());
  return probe.block_table.blocks_needed(tokens) - std::max(cached.in_pool + on_ssd, released);
}

const Sequence* Scheduler::find(int64_t id) const {
  for (const auto* list : {&running_, &awaiting_}) {
    for (const auto& seq : *list) {
      if (seq->id == id) return seq.get();
    }
  }
  for (const auto& seq : waiting_) {
    if (seq->id == id) return seq.get();
  }
  return nullptr;
}

Result<StepOutput> Scheduler::activate_remote(int64_t id, int32_t first_token, uint64_t rng_draws,
                                              const OutputLogprobs* first_logprobs) {
  auto it =
      std::find_if(awaiting_.begin(), awaiting_.end(), [&](const auto& s) { return s->id == id; });
  if (it == awaiting_.end()) {
    if (find(id) != nullptr) {
      return invalid_argument("sequence " + std::to_string(id) + " is not awaiting remote KV");
    }
    return not_found("no sequence " + std::to_string(id));
  }
  const int32_t vocab = model_.config().vocab_size;
  if (first_token < 0 || first_token >= vocab) {
    return invalid_argument("first token id " + std::to_string(first_token) +
                            " is outside the vocabulary of size " + std::to_string(vocab));
  }
  // Sampling one token draws once (none when greedy): a count past a few is
  // a peer's error, and discarding 2^64 draws would hold this node forever.
  if (rng_draws > kMaxFirstTokenDraws) {
    return invalid_argument("the prefill node reports " + std::to_string(rng_draws) +
                            " random draws for one token; at most " +
                            std::to_string(kMaxFirstTokenDraws) + " are possible");
  }
  Sequence& seq = **it;
  // Blocks the SSD tier is still reading: the KV is not all there before.
  while (seq.ssd_restoring && prefix_cache_.restoring()) land_restores(/*wait=*/true);
  BATON_CHECK(!seq.ssd_restoring);
  const auto prompt_tokens = int32_t(seq.prompt.size());
  seq.awaiting_kv = false;
  if (seq.ssd_lost_from >= 0) {
    // Blocks the tier failed to bring back, which the prefill node did not
    // send either: the prompt from there on is computed here, as after a
    // preemption (the first token, sampled there, stays).
    spdlog::warn("ssd cache: sequence {}: computing its prompt from block {} here", seq.id,
                 seq.ssd_lost_from);
    seq.block_table.truncate(blocks_, seq.ssd_lost_from);
    seq.num_computed = seq.ssd_lost_from * seq.block_table.block_size();
    seq.registered_blocks = seq.ssd_lost_from;
  } else {
    // Shared cached blocks (reserve_remote) count as committed already.
    seq.block_table.commit(prompt_tokens - seq.block_table.num_tokens());
    seq.num_computed = prompt_tokens;
  }
  seq.high_water = prompt_tokens;
  // The prompt's KV is all there: its full blocks join the prefix cache now,
  // so the next reservation of the same prefix shares them (even if this
  // first token already finishes the sequence).
  prefix_cache_.register_full_blocks(seq, seq.num_computed);
  seq.rng.discard(rng_draws);
  if (seq.options.logprobs > 0) {
    // The prefill node computed this token's log-probabilities; without them
    // a NaN placeholder keeps one entry per output token.
    if (first_logprobs != nullptr) {
      OutputLogprobs entry = *first_logprobs;
      entry.id = first_token;
      seq.output_logprobs.push_back(std::move(entry));
    } else {
      seq.output_logprobs.push_back(OutputLogprobs{
          .id = first_token, .logprob = std::numeric_limits<float>::quiet_NaN(), .top = {}});
    }
  }
  append_token(seq, first_token);
  const StepOutput out{seq.id, first_token, seq.finish_reason};
  running_.push_back(std::move(*it));
  awaiting_.erase(it);
  if (out.finish_reason != FinishReason::kNone) retire_finished();
  return out;
}

void Scheduler::release_blocks(Sequence& finished) {
  if (finished.options.retain_blocks && !finished.block_table.blocks().empty()) {
    --retained_sequences_;
  }
  finished.block_table.release(blocks_);
}

bool Scheduler::abort(int64_t sequence_id) {
  auto finish = [&](std::unique_ptr<Sequence> seq) {
    seq->block_table.release(blocks_);  // retain_blocks or not: nothing more will read them
    seq->awaiting_kv = false;
    seq->finish_reason = FinishReason::kAborted;
    finished_.push_back(std::move(seq));
  };
  auto take = [&](auto& list) {
    auto it =
        std::find_if(list.begin(), list.end(), [&](const auto& s) { return s->id == sequence_id; });
    if (it == list.end()) return false;
    auto seq = std::move(*it);
    list.erase(it);
    finish(std::move(seq));
    return true;
  };
  return take(waiting_) || take(running_) || take(awaiting_);
}

bool Scheduler::withdraw_reservation(int64_t sequence_id) {
  const Sequence* seq = find(sequence_id);
  if (seq == nullptr || !seq->awaiting_kv) return false;
  prefix_cache_.uncount_lookup(*seq);
  return abort(sequence_id);
}

void Scheduler::preempt(Sequence& victim) {
  victim.block_table.release(blocks_);
  victim.num_computed = 0;
  victim.registered_blocks = 0;
  victim.ssd_landed_blocks = 0;
  ++victim.num_preemptions;
  ++preemptions_;
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const auto& s) { return s.get() == &victim; });
  waiting_.push_front(std::move(*it));
  running_.erase(it);
}

// Reserves room for `tokens` more tokens of a running sequence, preempting the
// most recently admitted sequences until it fits. False if `sequence` itself
// had to be preempted.
bool Scheduler::reserve_or_preempt(Sequence& sequence, int32_t tokens) {
  while (!sequence.block_table.reserve(blocks_, tokens).is_ok()) {
    Sequence& victim = *running_.back();
    preempt(victim);
    if (&victim == &sequence) return false;
  }
  return true;
}

std::vector<Scheduler::Scheduled> Scheduler::schedule() {
  std::vector<Scheduled> scheduled;
  int32_t budget = config_.max_num_batched_tokens;
  auto unschedule = [&](const Sequence* seq) {
    auto it = std::find_if(scheduled.begin(), scheduled.end(),
                           [&](const Scheduled& s) { return s.sequence == seq; });
    if (it != scheduled.end()) {
      budget += it->num_tokens;
      scheduled.erase(it);
    }
  };
  // Running sequences: decode tokens first (they keep the streams flowing),
  // then the remaining chunks of partly prefilled prompts.
  for (bool decode_pass : {true, false}) {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Sequence& seq = *running_[i];
      const bool is_decode = seq.num_pending() == 1;
      if (is_decode != decode_pass) continue;
      int32_t n = std::min(seq.num_pending(), budget);
      // Victims come from the back of running_, after index i.
      size_t before = running_.size();
      const bool reserved = reserve_or_preempt(seq, n);
      if (running_.size() != before) {
        // Victims (seq itself among them when !reserved) may already hold a
        // place in this step, e.g. from the decode pass: take it back.
        for (auto& w : waiting_) unschedule(w.get());
      }
      if (!reserved) break;  // seq was the last running one; nothing after it
      scheduled.push_back({&seq, n});
      budget -= n;
    }
  }
  // The running sequences scheduled now stay scheduled (admission preempts
  // nobody): the blocks their tokens fill this step are registered now, and
  // sequences admitted below share them (as with admission, below).
  for (const Scheduled& s : scheduled) {
    prefix_cache_.register_full_blocks(*s.sequence, s.sequence->num_computed + s.num_tokens);
  }
  // Restores from the SSD tier that landed meanwhile let their sequences in.
  land_restores(/*wait=*/false);
  admit_waiting(scheduled, budget);
  return scheduled;
}

void Scheduler::admit_waiting(std::vector<Scheduled>& scheduled, int32_t& budget) {
  // Admit waiting sequences in arrival order while blocks and budget last,
  // passing those whose blocks are being read from the SSD tier.
  admission_left_waiting_ = false;
  for (size_t w = 0; w < waiting_.size() && budget > 0 &&
                     int32_t(running_.size() + awaiting_.size()) < config_.max_num_seqs;) {
    Sequence& seq = *waiting_[w];
    // Prompt log-probabilities need the logits of every prompt position.
    const bool computes_whole_prompt = seq.options.prompt_logprobs >= 0;
    if (!computes_whole_prompt && prefix_cache_.start_restore(seq, budget, window_of(seq)) &&
        !prefix_cache_.loads_are_asynchronous()) {
      // Read already: it lands now, and the sequence moves to the head.
      land_restores(/*wait=*/false);
      w = size_t(std::ranges::find_if(waiting_, [&](const auto& s) { return s.get() == &seq; }) -
                 waiting_.begin());
    }
    if (seq.ssd_restoring) {
      ++w;
      continue;
    }
    if (!computes_whole_prompt) {
      prefix_cache_.share_prefix(seq, window_of(seq));
      // A shared prefix longer than the windows reach (as long as the pool,
      // even) is not held behind them: what is free then takes a chunk.
      release_behind_windows(seq);
    }
    int32_t n = std::min(seq.num_pending(), budget);
    if (seq.num_computed > 0) {
      // A cached prefix (restored from SSD, perhaps, at a step whose budget
      // left room for a smaller chunk) goes on with the chunk the free
      // blocks hold rather than waiting, and perhaps losing it to eviction.
      // Its table holds full blocks only.
      n = std::min(n, blocks_.num_free() * seq.block_table.block_size());
    }
    if (n < 1 || !seq.block_table.reserve(blocks_, n).is_ok()) {
      // Waiting sequences hold no blocks: the shared ones go back (cached).
      seq.block_table.release(blocks_);
      seq.num_computed = 0;
      seq.registered_blocks = 0;
      admission_left_waiting_ = true;
      break;
    }
    prefix_cache_.count_lookup(seq);
    if (seq.cached_prompt_tokens < 0)
      seq.cached_prompt_tokens = std::min(seq.num_computed, int32_t(seq.prompt.size()));
    // The blocks this step fills are registered now, not after the step:
    // a sequence admitted after this one in the same step then shares them.
    // The forward pass stores every token's K/V of a layer before any
    // attention of that layer reads the pool, so the sharer reads them
    // written. Only once preemption is over: nothing after this point can
    // preempt this sequence (and leave a registered block unwritten)
    // before the step runs.
    prefix_cache_.register_full_blocks(seq, seq.num_computed + n);
    running_.push_back(std::move(waiting_[w]));
    waiting_.erase(waiting_.begin() + ptrdiff_t(w));
    scheduled.push_back({&seq, n});
    budget -= n;
  }
  // Left for want of room in the batch (not of budget, which the next
  // step renews): reservations wait too.
  if (int32_t(running_.size() + awaiting_.size()) >= config_.max_num_seqs &&
      std::ranges::any_of(waiting_, [](const auto& seq) { return !seq->ssd_restoring; }))
    admission_left_waiting_ = true;
}

void Scheduler::land_restores(bool wait) {
  if (!prefix_cache_.restoring()) return;
  const std::vector<int64_t> landed =
      prefix_cache_.land(wait, [this](int64_t id) { return find_queued(id); });
  // A sequence whose restore landed goes to the head of the queue: it
  // reached admission when its restore started, and admitted first now, it
  // takes its blocks before any other admission can evict them. Landed
  // sequences keep the order they landed in.
  size_t head = 0;
  for (const int64_t id : landed) {
    const auto seq = std::ranges::find_if(waiting_, [&](const auto& s) { return s->id == id; });
    if (seq == waiting_.end()) continue;
    std::unique_ptr<Sequence> moved = std::move(*seq);
    waiting_.erase(seq);
    waiting_.insert(waiting_.begin() + ptrdiff_t(head++), std::move(moved));
  }
}

Sequence* Scheduler::find_queued(int64_t id) {
  for (const auto& seq : waiting_) {
    if (seq->id == id) return seq.get();
  }
  for (const auto& seq : awaiting_) {
    if (seq->id == id) return seq.get();
  }
  return nullptr;
}

void Scheduler::note_peak_usage() {
  peak_used_blocks_ = std::max(peak_used_blocks_, blocks_.num_blocks() - blocks_.num_free());
}

Status Scheduler::step(std::vector<StepOutput>* outputs) {
  if (!failure_.is_ok()) return failure_;
  std::vector<Scheduled> scheduled = schedule();
  // Nothing to run but sequences whose blocks the SSD tier is reading:
  // wait for those reads instead of returning an empty step.
  while (scheduled.empty() && prefix_cache_.restoring()) {
    land_restores(/*wait=*/true);
    scheduled = schedule();
  }
  last_step_ = {};
  note_peak_usage();
  if (scheduled.empty()) {
    // Blocks held by sequences awaiting remote KV come back when they are
    // activated (and later finish) or aborted, and those finished sequences
    // retain for their transfers when released; until then there is nothing
    // to do.
    if (has_work() && awaiting_.empty() && retained_sequences_ == 0) {
      return internal_error("scheduler could not schedule any work");
    }
    return Status::ok();
  }
  // The plan's spans point into step_tokens_, so size it before taking them.
  size_t total = 0;
  for (const auto& s : scheduled) total += size_t(s.num_tokens);
  step_tokens_.resize(total);
  StepPlan plan;
  size_t offset = 0;
  const auto now = std::chrono::steady_clock::now();
  for (const auto& s : scheduled) {
    Sequence& seq = *s.sequence;
    if (!seq.first_scheduled) seq.first_scheduled = now;
    for (int32_t j = 0; j < s.num_tokens; ++j) {
      step_tokens_[offset + size_t(j)] = seq.token_at(seq.num_computed + j);
    }
    // Positions below the prompt's end are prompt; below the sequence's
    // high-water mark, recomputation after a preemption; the rest generated.
    const int64_t begin = seq.num_computed, end = begin + s.num_tokens;
    const int64_t prompt_end = int64_t(seq.prompt.size());
    const int64_t recompute_end = std::max<int64_t>(prompt_end, seq.high_water);
    const int64_t prompt_part = std::clamp<int64_t>(prompt_end - begin, 0, s.num_tokens);
    const int64_t recompute_part = std::clamp<int64_t>(recompute_end - std::max(begin, prompt_end),
                                                       0, end - begin - prompt_part);
    last_step_.prompt_tokens += prompt_part;
    last_step_.recomputed_tokens += recompute_part;
    last_step_.generated_tokens += s.num_tokens - prompt_part - recompute_part;
    plan.sequences.push_back(StepSequence{
        .token_ids = std::span<const int32_t>(step_tokens_.data() + offset, size_t(s.num_tokens)),
        .start_position = seq.num_computed,
        .block_table = &seq.block_table,
        .wants_logits = seq.num_computed + s.num_tokens == seq.num_tokens(),
        .wants_all_logits = wants_prompt_logits(seq, s.num_tokens)});
    offset += size_t(s.num_tokens);
  }
  step_info_.clear();
  if (layer_observer_) {
    for (size_t i = 0; i < scheduled.size(); ++i) {
      step_info_.push_back(StepSequenceInfo{.sequence_id = scheduled[i].sequence->id,
                                            .start_position = plan.sequences[i].start_position,
                                            .num_tokens = scheduled[i].num_tokens});
    }
  }
  if (layer_observer_ && (!layer_filter_ || layer_filter_(step_info_))) {
    const std::function<void(int32_t)> on_layer_done = [this](int32_t layer) {
      layer_observer_(layer, std::span<const StepSequenceInfo>(step_info_));
    };
    failure_ = model_.forward(plan, kv_, &logits_, &on_layer_done);
  } else {
    failure_ = model_.forward(plan, kv_, &logits_);
  }
  if (!failure_.is_ok()) return failure_;

  const int32_t vocab = model_.config().vocab_size;
  size_t logits_row = 0;
  for (size_t i = 0; i < scheduled.size(); ++i) {
    Sequence& seq = *scheduled[i].sequence;
    seq.block_table.commit(scheduled[i].num_tokens);
    seq.num_computed += scheduled[i].num_tokens;
    seq.high_water = std::max(seq.high_water, seq.num_computed);
    prefix_cache_.register_full_blocks(seq, seq.num_computed);
    release_behind_windows(seq);
    if (plan.sequences[i].wants_all_logits) {
      const int32_t start = plan.sequences[i].start_position;
      for (int32_t j = 0; j + 1 < scheduled[i].num_tokens; ++j)
        score_prompt_token(seq, start + j + 1, logits_.data() + (logits_row + j) * size_t(vocab));
      logits_row += size_t(scheduled[i].num_tokens) - 1;
      if (!plan.sequences[i].wants_logits) {
        score_prompt_token(seq, start + scheduled[i].num_tokens,
                           logits_.data() + logits_row * size_t(vocab));
        ++logits_row;
        continue;
      }
    }
    if (plan.sequences[i].wants_logits) {
      sample(seq, logits_.data() + logits_row * size_t(vocab), outputs);
      ++logits_row;
    }
  }
  // A step that scored a prompt's positions grows the logits to its chunk
  // times the vocabulary (1.2 GB for 2048 tokens of a 152k vocabulary):
  // given back once a step needs less than a quarter of what is held.
  if (logits_.capacity() > kKeptLogitsFloats && logits_.size() < logits_.capacity() / 4)
    std::vector<float>().swap(logits_);
  retire_finished();
  return Status::ok();
}

bool Scheduler::wants_prompt_logits(const Sequence& seq, int32_t num_tokens) const {
  // Rows up to the prompt's last token (whose logits give the first output
  // token) score prompt tokens; recomputed after a preemption, they are
  // scored already.
  return seq.options.prompt_logprobs >= 0 && seq.num_computed + 1 < int32_t(seq.prompt.size()) &&
         int32_t(seq.prompt_logprobs.size()) < seq.num_computed + num_tokens;
}

void Scheduler::score_prompt_token(Sequence& seq, int32_t position, const float* logits) {
  // The logits of position - 1 score the token at `position`; each once.
  if (position >= int32_t(seq.prompt.size()) || position != int32_t(seq.prompt_logprobs.size()) + 1)
    return;
  namespace kc = kernels::cpu;
  const int32_t vocab = model_.config().vocab_size;
  const int32_t token = seq.prompt[size_t(position)];
  seq.prompt_logprobs.push_back(
      OutputLogprobs{.id = token,
                     .logprob = kc::token_logprob(logits, vocab, token),
                     .top = kc::top_logprobs(logits, vocab, seq.options.prompt_logprobs)});
}

void Scheduler::sample(Sequence& seq, const float* logits, std::vector<StepOutput>* outputs) {
  namespace kc = kernels::cpu;
  const int32_t vocab = model_.config().vocab_size;
  const auto& opts = seq.options;
  const float* sampled_from = logits;
  std::vector<int32_t> banned;  // min_tokens: no end before then
  if (int32_t(seq.output.size()) < opts.min_tokens) {
    if (!opts.ignore_eos) banned = model_.config().eos_token_ids;
    banned.insert(banned.end(), opts.stop_token_ids.begin(), opts.stop_token_ids.end());
  }
  if (opts.adjustments.any() || !banned.empty()) {
    // On a copy: log-probabilities stay the model's, as vLLM reports them.
    adjusted_logits_.assign(logits, logits + vocab);
    kc::adjust_logits(adjusted_logits_.data(), vocab, opts.adjustments, banned, seq.prompt,
                      seq.output);
    sampled_from = adjusted_logits_.data();
  }
  int32_t token = kc::sample_token(sampled_from, vocab, opts.sampling, seq.rng);
  // NaN or infinite logits (weights that hold NaN, activations that
  // overflowed) sample token 0 or an arbitrary one: meaningless output the
  // log should name. Checked on the chosen token only, at no cost a step.
  if (!std::isfinite(logits[token])) {
    uint64_t unlogged = 0;
    if (non_finite_logits_log_.should_log(&unlogged)) {
      spdlog::warn(
          "engine: request {} sampled token {} from a non-finite logit ({}): the model's "
          "weights or activations hold NaN or infinity, and its output is meaningless{}",
          seq.id, token, logits[token],
          unlogged > 0 ? " (" + std::to_string(unlogged) + " more not logged)" : std::string());
    }
  }
  if (opts.logprobs > 0) {
    seq.output_logprobs.push_back(
        OutputLogprobs{.id = token,
                       .logprob = kc::token_logprob(logits, vocab, token),
                       .top = kc::top_logprobs(logits, vocab, opts.logprobs)});
  }
  const bool first = seq.output.empty();
  if (first && seq.first_scheduled) {
    using Seconds = std::chrono::duration<double>;
    seq.queue_seconds = Seconds(*seq.first_scheduled - seq.arrival).count();
    seq.prefill_seconds = Seconds(std::chrono::steady_clock::now() - *seq.first_scheduled).count();
  }
  append_token(seq, token);
  if (outputs != nullptr) {
    outputs->push_back({seq.id, token, seq.finish_reason, first ? seq.queue_seconds : -1,
                        first ? seq.prefill_seconds : -1});
  }
}

void Scheduler::append_token(Sequence& seq, int32_t token) {
  const auto& opts = seq.options;
  seq.output.push_back(token);
  auto contains = [](const std::vector<int32_t>& ids, int32_t id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  if ((!opts.ignore_eos && contains(model_.config().eos_token_ids, token)) ||
      contains(opts.stop_token_ids, token)) {
    seq.finish_reason = FinishReason::kStop;
  } else if (int32_t(seq.output.size()) >= opts.max_tokens || seq.num_tokens() >= max_model_len_) {
    seq.finish_reason = FinishReason::kLength;
  }
}

void Scheduler::retire_finished() {
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->finished()) {
      if (!(*it)->options.retain_blocks) {
        (*it)->block_table.release(blocks_);
      } else if (!(*it)->block_table.blocks().empty()) {
        ++retained_sequences_;
      }
      finished_.push_back(std::move(*it));
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<std::unique_ptr<Sequence>> Scheduler::take_finished() {
  return std::exchange(finished_, {});
}

SchedulerStats Scheduler::stats() const {
  int64_t waiting_tokens = 0;
  auto count = [&](const Sequence& seq) {
    waiting_tokens += std::max<int64_t>(0, int64_t(seq.prompt.size()) - seq.num_computed);
  };
  int32_t restoring = 0;
  for (const auto& seq : waiting_) {
    count(*seq);
    restoring += seq->ssd_restoring ? 1 : 0;
  }
  for (const auto& seq : running_) count(*seq);
  for (const auto& seq : awaiting_) restoring += seq->ssd_restoring ? 1 : 0;
  return SchedulerStats{.running = int32_t(running_.size()),
                        .waiting = int32_t(waiting_.size()),
                        .awaiting = int32_t(awaiting_.size()),
                        .restoring = restoring,
                        .waiting_tokens = waiting_tokens,
                        .free_blocks = blocks_.num_free(),
                        .total_blocks = blocks_.num_blocks(),
                        .peak_used_blocks = peak_used_blocks_,
                        .preemptions = preemptions_,
                        .cached_blocks = blocks_.num_cached(),
                        .prefix_query_tokens = prefix_cache_.counters().query_tokens,
                        .prefix_hit_tokens = prefix_cache_.counters().hit_tokens,
                        .prefix_ssd_hit_tokens = prefix_cache_.counters().ssd_hit_tokens};
}

}  // namespace baton::engine
