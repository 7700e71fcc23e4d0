#include "engine/scheduler.h"

#include <algorithm>
#include <string>

#include "kernels/cpu/sampling.h"

namespace baton::engine {

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAborted:
      return "abort";
  }
  return "";
}

Scheduler::Scheduler(LlamaModel& model, KvPool& kv, const SchedulerConfig& config)
    : model_(model),
      kv_(kv),
      config_(config),
      max_model_len_(config.max_model_len > 0 ? config.max_model_len
                                              : model.config().max_position_embeddings),
      blocks_(kv.layout().num_blocks) {
  // A sequence can never hold more tokens than the whole pool: past that it
  // would preempt itself forever. It ends with "length" there instead.
  const int64_t pool_tokens = int64_t(kv.layout().num_blocks) * kv.layout().block_size;
  max_model_len_ = int32_t(std::min<int64_t>(max_model_len_, pool_tokens));
}

Result<int64_t> Scheduler::add(std::vector<int32_t> prompt, const GenerationOptions& options) {
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
  if (options.sampling.temperature < 0) return invalid_argument("temperature must be >= 0");
  if (!(options.sampling.top_p > 0 && options.sampling.top_p <= 1)) {
    return invalid_argument("top_p must be in (0, 1]");
  }
  if (options.logprobs < 0) return invalid_argument("logprobs must be >= 0");
  const int32_t block_size = kv_.layout().block_size;
  int64_t id = next_id_++;
  waiting_.push_back(std::make_unique<Sequence>(id, std::move(prompt), options, block_size));
  return id;
}

bool Scheduler::abort(int64_t sequence_id) {
  auto finish = [&](std::unique_ptr<Sequence> seq) {
    seq->block_table.release(blocks_);
    seq->finish_reason = FinishReason::kAborted;
    finished_.push_back(std::move(seq));
  };
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->id == sequence_id) {
      auto seq = std::move(*it);
      waiting_.erase(it);
      finish(std::move(seq));
      return true;
    }
  }
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if ((*it)->id == sequence_id) {
      auto seq = std::move(*it);
      running_.erase(it);
      finish(std::move(seq));
      return true;
    }
  }
  return false;
}

void Scheduler::preempt(Sequence& victim) {
  victim.block_table.release(blocks_);
  victim.num_computed = 0;
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
  // Admit waiting sequences in arrival order while blocks and budget last.
  while (!waiting_.empty() && budget > 0 && int32_t(running_.size()) < config_.max_num_seqs) {
    Sequence& seq = *waiting_.front();
    int32_t n = std::min(seq.num_pending(), budget);
    if (!seq.block_table.reserve(blocks_, n).is_ok()) break;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    scheduled.push_back({&seq, n});
    budget -= n;
  }
  return scheduled;
}

Status Scheduler::step(std::vector<StepOutput>* outputs) {
  std::vector<Scheduled> scheduled = schedule();
  last_step_ = {};
  peak_used_blocks_ = std::max(peak_used_blocks_, blocks_.num_blocks() - blocks_.num_free());
  if (scheduled.empty()) {
    if (has_work()) return internal_error("scheduler could not schedule any work");
    return Status::ok();
  }
  // The plan's spans point into step_tokens_, so size it before taking them.
  size_t total = 0;
  for (const auto& s : scheduled) total += size_t(s.num_tokens);
  step_tokens_.resize(total);
  StepPlan plan;
  size_t offset = 0;
  for (const auto& s : scheduled) {
    Sequence& seq = *s.sequence;
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
        .wants_logits = seq.num_computed + s.num_tokens == seq.num_tokens()});
    offset += size_t(s.num_tokens);
  }
  BATON_RETURN_IF_ERROR(model_.forward(plan, kv_, &logits_));

  const int32_t vocab = model_.config().vocab_size;
  size_t logits_row = 0;
  for (size_t i = 0; i < scheduled.size(); ++i) {
    Sequence& seq = *scheduled[i].sequence;
    seq.block_table.commit(scheduled[i].num_tokens);
    seq.num_computed += scheduled[i].num_tokens;
    seq.high_water = std::max(seq.high_water, seq.num_computed);
    if (plan.sequences[i].wants_logits) {
      sample(seq, logits_.data() + logits_row * size_t(vocab), outputs);
      ++logits_row;
    }
  }
  retire_finished();
  return Status::ok();
}

void Scheduler::sample(Sequence& seq, const float* logits, std::vector<StepOutput>* outputs) {
  namespace kc = kernels::cpu;
  const int32_t vocab = model_.config().vocab_size;
  const auto& opts = seq.options;
  int32_t token = kc::sample_token(logits, vocab, opts.sampling, seq.rng);
  if (opts.logprobs > 0) {
    seq.output_logprobs.push_back(
        OutputLogprobs{.id = token,
                       .logprob = kc::token_logprob(logits, vocab, token),
                       .top = kc::top_logprobs(logits, vocab, opts.logprobs)});
  }
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
  if (outputs != nullptr) outputs->push_back({seq.id, token, seq.finish_reason});
}

void Scheduler::retire_finished() {
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->finished()) {
      (*it)->block_table.release(blocks_);
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
  return SchedulerStats{.running = int32_t(running_.size()),
                        .waiting = int32_t(waiting_.size()),
                        .free_blocks = blocks_.num_free(),
                        .total_blocks = blocks_.num_blocks(),
                        .peak_used_blocks = peak_used_blocks_,
                        .preemptions = preemptions_};
}

}  // namespace baton::engine
