// engine/window_budget.h — what a sequence of a sliding-window model holds
// and sends at once, for the scheduler and for the checks that size pools
// and staging slots before an engine exists.
#pragma once

#include <algorithm>
#include <cstdint>

namespace baton::engine {

// The tokens one sequence's blocks hold at once, at most: its whole context
// (`max_model_len`), or, where every layer has a sliding window (`window`,
// ModelConfig::kv_window), the window behind a step's first row and the
// step's own tokens over whole blocks (one more where they straddle a
// boundary). A pool of fewer tokens caps the context at the pool.
inline int64_t tokens_held_at_once(int64_t max_model_len, int32_t window,
                                   int32_t max_num_batched_tokens, int32_t block_size) {
  if (window <= 0) return max_model_len;
  const int64_t blocks =
      (int64_t(window) - 1 + max_num_batched_tokens + block_size - 1) / block_size + 1;
  return std::min(max_model_len, blocks * block_size);
}

// The first block the windows of a query at `position` read: blocks
// wholly before it no query from there on reads again (0 without windows).
inline int32_t first_block_in_window(int64_t position, int32_t window, int32_t block_size) {
  if (window <= 0) return 0;
  return int32_t(std::max<int64_t>(0, position - window + 1) / block_size);
}

// The tokens of KV one prompt's transfer carries at most: the whole
// context, or, with sliding windows, those the first decode step's windows
// reach, from the start of the block that holds the first of them.
inline int64_t tokens_sent_at_most(int64_t max_model_len, int32_t window, int32_t block_size) {
  if (window <= 0) return max_model_len;
  return std::min(max_model_len, int64_t(window) - 1 + block_size);
}

}  // namespace baton::engine
