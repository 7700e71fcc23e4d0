// engine/sequence.h — one generation request as the engine sees it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "common/finish_reason.h"
#include "engine/block_manager.h"
#include "kernels/cpu/sampling.h"

namespace baton::engine {

struct GenerationOptions {
  kernels::cpu::SamplingParams sampling;
  // Penalties and logit bias (kernels/cpu/sampling.h).
  kernels::cpu::LogitsAdjustments adjustments;
  int32_t min_tokens = 0;  // end-of-sequence and stop tokens are not sampled before
  uint64_t seed = 0;
  int32_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int32_t logprobs = 0;  // top-N log-probabilities per output token; 0 = none
  // Top-N log-probabilities of each prompt token after the first (vLLM's
  // prompt_logprobs; 0: the token's own only); -1: none. The prompt is then
  // computed whole on this engine, whatever its prefix cache holds.
  int32_t prompt_logprobs = -1;
  // A finished sequence keeps its KV blocks until Scheduler::release_blocks
  // (a prefill node: until the transfer out of them completes).
  bool retain_blocks = false;
  // With retain_blocks and sliding windows: the blocks before this one are
  // not kept (a prefill node sends none of them), so they go back as soon
  // as no window reads them: a windowed prompt computed in chunks holds
  // about a window and a chunk of the pool, and what it sends.
  int32_t retained_from_block = 0;
};

// The engine ends sequences with kStop, kLength or kAborted.
using baton::finish_reason_name;
using baton::FinishReason;

struct OutputLogprobs {
  int32_t id = 0;
  float logprob = 0.0f;
  std::vector<kernels::cpu::TokenLogprob> top;
};

struct Sequence {
  Sequence(int64_t id, std::vector<int32_t> prompt, GenerationOptions options, int32_t block_size)
      : id(id),
        prompt(std::move(prompt)),
        options(std::move(options)),
        rng(this->options.seed),
        block_table(block_size) {}

  int32_t num_tokens() const { return int32_t(prompt.size() + output.size()); }
  int32_t token_at(int32_t pos) const {
    return pos < int32_t(prompt.size()) ? prompt[size_t(pos)] : output[size_t(pos) - prompt.size()];
  }
  // Tokens whose K/V still has to be computed before the next sample.
  int32_t num_pending() const { return num_tokens() - num_computed; }
  bool finished() const { return finish_reason != FinishReason::kNone; }

  int64_t id;
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  std::vector<OutputLogprobs> output_logprobs;  // one per output token when asked
  // With options.prompt_logprobs: one per prompt token after the first, as
  // its position's logits were computed.
  std::vector<OutputLogprobs> prompt_logprobs;
  GenerationOptions options;
  kernels::cpu::SamplerRng rng;
  BlockTable block_table;
  int32_t num_computed = 0;  // tokens whose K/V is in the pool
  int32_t high_water = 0;    // most tokens ever computed (preemption resets num_computed)
  int32_t num_preemptions = 0;
  // Prefix cache: the keys' hashes of the sequence's full blocks, as far as
  // they have been needed (they depend on the tokens alone), and how many
  // leading blocks of block_table are registered or were shared.
  std::vector<uint64_t> block_hashes;
  int32_t registered_blocks = 0;
  int32_t ssd_restored_blocks = 0;  // of the shared ones, read back from the SSD tier
  // The SSD tier's asynchronous restores (TieredPrefixCache::start_restore):
  // while one runs the sequence waits; those that landed brought its blocks
  // [ssd_first_block, + ssd_landed_blocks) to the pool, cached.
  bool ssd_restoring = false;
  int32_t ssd_first_block = 0;
  int32_t ssd_landed_blocks = 0;
  // One of its restores read fewer blocks than it asked for: it computes
  // the rest instead of reading the tier again (a slot the disk cannot read
  // would otherwise be tried at every admission, forever).
  bool ssd_restore_failed = false;
  // A remote reservation's restore that failed from this block on: neither
  // the tier nor the prefill node wrote the blocks up to its end.
  int32_t ssd_lost_from = -1;
  bool awaiting_kv = false;  // reserved by reserve_remote, KV not yet activated
  FinishReason finish_reason = FinishReason::kNone;
  // When the scheduler took the sequence in (made it), and first computed
  // any of its tokens; then, once it sampled its first token itself (not
  // one a prefill node sampled), the seconds from the one to the other
  // (vLLM's queue time) and from the other to that token (its prefill
  // time). -1: not sampled here.
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> first_scheduled;
  double queue_seconds = -1;
  double prefill_seconds = -1;
  // Prompt tokens whose KV the prefix cache held (the pool's, or restored
  // from the SSD tier) when the sequence was first admitted here (OpenAI's
  // usage.prompt_tokens_details.cached_tokens); -1: not admitted here.
  int32_t cached_prompt_tokens = -1;
};

}  // namespace baton::engine
